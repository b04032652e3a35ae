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

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl
from layer_timing import input_sets, time_layer
from parity_common import call_by_schema, kernels

from moe_core import FusedMoE
from moe_core.presets import get_preset
from moe_core.quant import int4_w4a16
from moe_core.weights.canonical import ExpertWeights


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["qwen3-30b-a3b", "mixtral-8x7b"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 512, 2048])
    parser.add_argument("--kernels", action="store_true", help="list each one's kernels per cell")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    from moe_cuda.vendor import MARLIN_LIBRARY

    MARLIN_LIBRARY.load()
    schemas = {op: str(getattr(torch.ops._moe_C, op).default._schema)
               for op in ("topk_softmax", "moe_align_block_size", "moe_sum", "moe_wna16_marlin_gemm")}
    print(json.dumps(schemas, indent=1), flush=True)
    rows = []
    for name in args.presets:
        preset = get_preset(name)
        quant = int4_w4a16(preset.int4_group_size)
        weights = ExpertWeights.random(preset.config, quant, seed=0, device=dev)
        # Graphs off: the benchmark captures each layer itself, and the kernel lists need plain calls.
        marlin = FusedMoE(preset.config, quant, device=dev, prefer="marlin", cuda_graphs=False)
        marlin.load_weights(weights)
        triton_layer = FusedMoE(preset.config, quant, device=dev, prefer="triton", cuda_graphs=False)
        triton_layer.load_weights(weights)
        del weights
        vllm = VllmMarlinPipeline(marlin)
        for tokens in args.tokens:
            inputs = input_sets(preset, tokens, dev)
            x, logits = inputs[0]
            with torch.inference_mode():
                ours, theirs = marlin(x, logits).float(), vllm(x, logits).float()
            row = {"preset": name, "scheme": f"int4 g{preset.int4_group_size}", "tokens": tokens,
                   "output_rel_diff": float((ours - theirs).norm() / theirs.norm())}
            for label, fn in (("marlin_us", marlin), ("vllm_marlin_us", vllm), ("triton_us", triton_layer)):
                row[label] = round(time_layer(fn, inputs)["us"], 2)
            row["marlin_over_vllm"] = round(row["marlin_us"] / row["vllm_marlin_us"], 3)
            if args.kernels:
                row["kernels"] = {"marlin": kernels(marlin, x, logits), "vllm_marlin": kernels(vllm, x, logits)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
        del marlin, triton_layer, vllm
        torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "library_schemas": schemas, "rows": rows}
    (args.out / "marlin_parity.json").write_text(json.dumps(result, indent=1))
    for row in rows:
        for who, ks in row.get("kernels", {}).items():
            print(f"{row['preset']} M={row['tokens']} {who}: " + "; ".join(f"{n} {us}" for n, us in ks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
