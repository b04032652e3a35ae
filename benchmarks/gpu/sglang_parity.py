"""moe-cuda's SGLang fp8 block layer against SGLang's own CUTLASS fp8 MoE flow over the same library.

SGLang's flow (python/sglang/srt/layers/moe/cutlass_moe.py, `cutlass_fused_experts_fp8`), rebuilt from
sglang-kernel 0.4.6's operators on the weights moe-cuda's layer packed, so the two differ only around
the grouped GEMMs: `topk_softmax` (routing), `prepare_moe_input` (expert offsets, problem sizes and
the row maps), `sgl_per_token_group_quant_fp8` (1 x 128 activation groups), `shuffle_rows`,
`fp8_blockwise_scaled_grouped_mm` for GEMM1, `silu_and_mul`, quantization again, GEMM2, and
`apply_shuffle_mul_sum` (unpermute, router weights, top-k sum). moe-triton's fp8-block layer on the
same weights is timed beside them.

Per cell: each one's time (the benchmark protocol: CUDA graphs, L2 flushed before every replay,
median), the ratio moe-cuda / SGLang flow (target <= 1.1), the relative difference of their outputs,
and with --kernels each one's kernels from one profiled eager call. The library's operator schemas
are printed first (the flow calls them by argument name).

    python3 sglang_parity.py --out DIR [--presets qwen3-30b-a3b mixtral-8x7b] [--tokens 1 32 512 2048] [--kernels]
"""

from __future__ import annotations

import json

import torch
from parity_common import call_by_schema, parser, run_parity, write_result

from moe_core import FusedMoE
from moe_core.quant import fp8_w8a8

OPS = ("topk_softmax", "prepare_moe_input", "shuffle_rows", "apply_shuffle_mul_sum", "silu_and_mul",
       "fp8_blockwise_scaled_grouped_mm")
QUANT_OPS = ("sgl_per_token_group_quant_fp8", "sgl_per_token_group_quant_8bit")  # renamed between versions


def _op(name: str):
    return getattr(torch.ops.sgl_kernel, name)


class SglangCutlassFp8Flow:
    """SGLang's cutlass_fused_experts_fp8 on a moe-cuda SglangFp8BlockExperts layer's packed weights."""

    def __init__(self, layer: FusedMoE) -> None:
        self.cfg = layer.config
        packed = layer.experts._packed()
        E = self.cfg.num_local_experts
        self.w1, self.w1_scale = packed["w13"].transpose(1, 2), packed["w13_scale"].transpose(1, 2)
        self.w2, self.w2_scale = packed["w2"].transpose(1, 2), packed["w2_scale"].transpose(1, 2)
        dev = packed["w13"].device
        K, N = self.cfg.hidden_size, self.cfg.intermediate_size_per_partition
        self.a1_strides = torch.full((E,), K, dtype=torch.int64, device=dev)
        self.c1_strides = torch.full((E,), 2 * N, dtype=torch.int64, device=dev)
        self.a2_strides = torch.full((E,), N, dtype=torch.int64, device=dev)
        self.c2_strides = torch.full((E,), K, dtype=torch.int64, device=dev)
        self.ptrs = [torch.empty(E, dtype=torch.int64, device=dev) for _ in range(5)]
        self.expert_offsets = torch.empty(E + 1, dtype=torch.int32, device=dev)
        self.sizes1 = torch.empty(E, 3, dtype=torch.int32, device=dev)
        self.sizes2 = torch.empty(E, 3, dtype=torch.int32, device=dev)
        self.layouts = [torch.empty(E, 5, dtype=torch.int32, device=dev) for _ in range(2)]
        self.workspace = torch.empty(8 << 20, dtype=torch.uint8, device=dev)
        self.quant_op = next(_op(n) for n in QUANT_OPS if hasattr(torch.ops.sgl_kernel, n))

    def _quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = torch.empty_like(x, dtype=torch.float8_e4m3fn)
        s = torch.empty(x.shape[0], x.shape[1] // 128, dtype=torch.float32, device=x.device)
        finfo = torch.finfo(torch.float8_e4m3fn)
        call_by_schema(self.quant_op, {"input": x, "output_q": q, "output_s": s, "group_size": 128, "eps": 1e-10,
                                       "fp8_min": finfo.min, "fp8_max": finfo.max, "scale_ue8m0": False},
                       aliases={"min_8bit": "fp8_min", "max_8bit": "fp8_max", "output": "output_q"})
        return q, s

    def _gemm(self, out, a, scales_a, b, scales_b, stride_a, stride_c, sizes) -> None:
        call_by_schema(_op("fp8_blockwise_scaled_grouped_mm"), {
            "output": out, "a_ptrs": self.ptrs[0], "b_ptrs": self.ptrs[1], "out_ptrs": self.ptrs[2],
            "a_scales_ptrs": self.ptrs[3], "b_scales_ptrs": self.ptrs[4], "a": a, "b": b, "scales_a": scales_a,
            "scales_b": scales_b, "stride_a": stride_a, "stride_b": stride_a, "stride_c": stride_c,
            "layout_sfa": self.layouts[0], "layout_sfb": self.layouts[1], "problem_sizes": sizes,
            "expert_offsets": self.expert_offsets[:-1], "workspace": self.workspace})

    def __call__(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        M, K = x.shape
        top_k, E, N = cfg.top_k, cfg.num_local_experts, cfg.intermediate_size_per_partition
        weights = torch.empty(M, top_k, dtype=torch.float32, device=x.device)
        ids = torch.empty(M, top_k, dtype=torch.int32, device=x.device)
        call_by_schema(_op("topk_softmax"), {"topk_weights": weights, "topk_ids": ids, "gating_output": logits,
                                             "renormalize": cfg.routing.renormalize, "moe_softcapping": 0.0,
                                             "correction_bias": None},
                       aliases={"topk_indices": "topk_ids"})
        a_map = torch.empty(M * top_k, dtype=torch.int32, device=x.device)
        c_map = torch.empty(M * top_k, dtype=torch.int32, device=x.device)
        call_by_schema(_op("prepare_moe_input"), {
            "topk_ids": ids, "expert_offsets": self.expert_offsets, "blockscale_offsets": None,
            "problem_sizes1": self.sizes1, "problem_sizes2": self.sizes2, "input_permutation": a_map,
            "output_permutation": c_map, "num_experts": E, "n": N, "k": K})
        a_q, a_s = self._quantize(x)
        rep_a = torch.empty(M * top_k, K, dtype=a_q.dtype, device=x.device)
        rep_s = torch.empty(M * top_k, K // 128, dtype=a_s.dtype, device=x.device)
        for src, dst in ((a_q, rep_a), (a_s, rep_s)):
            call_by_schema(_op("shuffle_rows"), {"input": src, "dst2src_map": a_map, "output": dst},
                           aliases={"input_tensor": "input", "output_tensor": "output"})
        c1 = torch.empty(M * top_k, 2 * N, dtype=x.dtype, device=x.device)
        self._gemm(c1, rep_a, rep_s, self.w1, self.w1_scale, self.a1_strides, self.c1_strides, self.sizes1)
        h = torch.empty(M * top_k, N, dtype=x.dtype, device=x.device)
        call_by_schema(_op("silu_and_mul"), {"out": h, "input": c1})
        h_q, h_s = self._quantize(h)
        c2 = torch.empty(M * top_k, K, dtype=x.dtype, device=x.device)
        self._gemm(c2, h_q, h_s, self.w2, self.w2_scale, self.a2_strides, self.c2_strides, self.sizes2)
        out = torch.empty(M, K, dtype=x.dtype, device=x.device)
        call_by_schema(_op("apply_shuffle_mul_sum"), {"input": c2, "output": out, "permutation": c_map,
                                                      "factors": weights.to(x.dtype)})
        return out


def main() -> int:
    args = parser(__doc__).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from moe_cuda.vendor import SGLANG_SM90_LIBRARY

    SGLANG_SM90_LIBRARY.load()
    schemas = {name: str(_op(name).default._schema) for name in OPS + QUANT_OPS if hasattr(torch.ops.sgl_kernel, name)}
    print(json.dumps(schemas, indent=1), flush=True)
    cases = [(name, "fp8-block", fp8_w8a8("block")) for name in args.presets]
    rows = run_parity(args, cases, "sglang_fp8_block", SglangCutlassFp8Flow, ("moe_cuda", "sglang_flow"))
    write_result(args.out / "sglang_parity.json", rows, library_schemas=schemas)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
