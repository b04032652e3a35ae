"""moe-cuda's Marlin layer against vLLM's own Marlin MoE pipeline over the same prebuilt library.

vLLM's pipeline (vllm/model_executor/layers/fused_moe/fused_marlin_moe.py, 0.26), rebuilt from the
library's operators on the weights moe-cuda's layer packed, so the two differ only in what runs
around the GEMMs: `topk_softmax` (routing), `moe_align_block_size`, `moe_wna16_marlin_gemm` for GEMM1
(the same flags: no atomic adds, fp32 reduce), a fused SiLU-and-mul (vLLM's is a CUDA kernel in
`_C`, which is not carried; here a one-pass Triton kernel of the same arithmetic), GEMM2 with the
router weights applied, and `moe_sum`. moe-triton's layer on the same preset is timed beside them.

Per cell: the time of each (the benchmark protocol: CUDA graphs, L2 flushed before every replay,
median), the ratio marlin / vLLM pipeline (target <= 1.1), the relative difference of their outputs,
and, with --kernels, each one's kernels at that size from one profiled eager call (name, us).

    python3 marlin_parity.py --out DIR [--presets qwen3-30b-a3b mixtral-8x7b] [--tokens 1 32 512 2048] [--kernels]
"""

from __future__ import annotations

import json

import torch
import triton
import triton.language as tl
from parity_common import call_by_schema, parser, run_parity, write_result

from moe_core import FusedMoE
from moe_core.presets import get_preset
from moe_core.quant import int4_w4a16


@triton.jit
def _silu_and_mul(h_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    gate = tl.load(h_ptr + row * 2 * N + cols, mask=mask).to(tl.float32)
    up = tl.load(h_ptr + row * 2 * N + N + cols, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (gate / (1.0 + tl.exp(-gate)) * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(h: torch.Tensor, out: torch.Tensor) -> None:
    n = out.shape[1]
    _silu_and_mul[(h.shape[0], triton.cdiv(n, 1024))](h, out, n, BLOCK=1024)


class VllmMarlinPipeline:
    """vLLM's fused_marlin_moe flow on a moe-cuda Marlin layer's packed weights."""

    def __init__(self, layer: FusedMoE) -> None:
        from moe_cuda.marlin import block_size_m, library_align_blocks

        self.experts = layer.experts
        self.packed = self.experts._packed()
        self.cfg = layer.config
        self.renormalize = self.cfg.routing.renormalize
        self._block_size_m, self._align = block_size_m, library_align_blocks

    def __call__(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        cfg, packed, experts = self.cfg, self.packed, self.experts
        M, K = x.shape
        top_k, E, N = cfg.top_k, cfg.num_local_experts, cfg.intermediate_size_per_partition
        weights = torch.empty(M, top_k, dtype=torch.float32, device=x.device)
        ids = torch.empty(M, top_k, dtype=torch.int32, device=x.device)
        token_expert = torch.empty(M, top_k, dtype=torch.int32, device=x.device)
        call_by_schema(torch.ops._moe_C.topk_softmax, {
            "topk_weights": weights, "topk_indices": ids, "token_expert_indices": token_expert,
            "gating_output": logits, "renormalize": self.renormalize, "bias": None})
        blocks = self._align(ids, self._block_size_m(M, top_k, E), E)
        h = experts._gemm(x, packed, "w13", blocks, weights, top_k, False, 2 * N,
                          torch.empty(M * top_k, 2 * N, dtype=x.dtype, device=x.device))
        a = torch.empty(M * top_k, N, dtype=x.dtype, device=x.device)
        silu_and_mul(h, a)
        y = experts._gemm(a, packed, "w2", blocks, weights, 1, True, K,
                          torch.empty(M * top_k, K, dtype=x.dtype, device=x.device))
        out = torch.empty(M, K, dtype=x.dtype, device=x.device)
        torch.ops._moe_C.moe_sum(y.view(M, top_k, K), out)
        return out


def main() -> int:
    args = parser(__doc__).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from moe_cuda.vendor import MARLIN_LIBRARY

    MARLIN_LIBRARY.load()
    schemas = {op: str(getattr(torch.ops._moe_C, op).default._schema)
               for op in ("topk_softmax", "moe_align_block_size", "moe_sum", "moe_wna16_marlin_gemm")}
    print(json.dumps(schemas, indent=1), flush=True)
    cases = [(name, f"int4 g{get_preset(name).int4_group_size}", int4_w4a16(get_preset(name).int4_group_size))
             for name in args.presets]
    rows = run_parity(args, cases, "marlin", VllmMarlinPipeline, ("marlin", "vllm_marlin"))
    write_result(args.out / "marlin_parity.json", rows, library_schemas=schemas)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
