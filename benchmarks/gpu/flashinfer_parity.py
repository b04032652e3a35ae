"""moe-cuda's FlashInfer CUTLASS layer against FlashInfer's fused MoE called as FlashInfer documents it.

The documented call (flashinfer.fused_moe.cutlass_fused_moe): the caller routes (softmax, top-k,
renormalized where the model does) and passes the selected experts (int32) and their weights (fp32)
with the weights in FlashInfer's layout; here those are the packed weights of moe-cuda's layer, so the
two differ only in routing and in the layer's own call. The layer's first eager call runs FlashInfer's
autotuner for the shape, and the documented call reads the same tactics cache; both are then timed
under the benchmark protocol (CUDA graphs, L2 flushed before every replay, median), with moe-triton's
layer on the same weights beside them. Needs the
FlashInfer module (run_moe_cuda.sh's flashinfer phase runs this as flashinfer-parity).

    python3 flashinfer_parity.py --out DIR [--presets qwen3-30b-a3b mixtral-8x7b] [--tokens 1 32 512 2048]
                                 [--schemes bf16 fp8-block] [--kernels]
"""

from __future__ import annotations

import torch
from layer_timing import layer_quant
from parity_common import parser, run_parity, write_result

from moe_core import FusedMoE
from moe_core.presets import get_preset


class DocumentedCall:
    """softmax -> top-k (-> renormalize) -> cutlass_fused_moe, on a moe-cuda FlashInfer layer's weights."""

    def __init__(self, layer: FusedMoE) -> None:
        self.cfg = layer.config
        self.packed = layer.experts._packed()

    def __call__(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        from flashinfer.fused_moe import cutlass_fused_moe

        scores = torch.softmax(logits.float(), dim=-1)
        weights, ids = torch.topk(scores, self.cfg.top_k, dim=-1)
        if self.cfg.routing.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        fp8 = "w31_scale" in self.packed.tensors
        out = cutlass_fused_moe(input=x, token_selected_experts=ids.to(torch.int32), token_final_scales=weights,
                                fc1_expert_weights=self.packed["w31"], fc2_expert_weights=self.packed["w2"],
                                output_dtype=x.dtype,
                                quant_scales=[self.packed["w31_scale"], self.packed["w2_scale"]] if fp8 else [],
                                use_deepseek_fp8_block_scale=fp8)
        return out[0] if isinstance(out, list | tuple) else out


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--schemes", nargs="+", default=["bf16", "fp8-block"])
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [(name, scheme, layer_quant(get_preset(name), scheme)) for name in args.presets for scheme in args.schemes]
    rows = run_parity(args, cases, "flashinfer_cutlass", DocumentedCall, ("moe_cuda", "flashinfer_documented"))
    write_result(args.out / "flashinfer_parity.json", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
