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

import argparse
import json
from pathlib import Path

import torch
import triton
from layer_timing import input_sets, layer_quant, time_layer
from parity_common import kernels

from moe_core import FusedMoE
from moe_core.presets import get_preset
from moe_core.weights.canonical import ExpertWeights


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["qwen3-30b-a3b", "mixtral-8x7b"])
    parser.add_argument("--schemes", nargs="+", default=["bf16", "fp8-block"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 512, 2048])
    parser.add_argument("--kernels", action="store_true", help="list each one's kernels per cell")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    rows = []
    for name in args.presets:
        preset = get_preset(name)
        for scheme in args.schemes:
            quant = layer_quant(preset, scheme)
            weights = ExpertWeights.random(preset.config, quant, seed=0, device=dev)
            # Graphs off: the benchmark captures each layer itself, and the kernel lists need plain calls.
            ours = FusedMoE(preset.config, quant, device=dev, prefer="flashinfer_cutlass", cuda_graphs=False)
            ours.load_weights(weights)
            triton_layer = FusedMoE(preset.config, quant, device=dev, prefer="triton", cuda_graphs=False)
            triton_layer.load_weights(weights)
            del weights
            documented = DocumentedCall(ours)
            for tokens in args.tokens:
                inputs = input_sets(preset, tokens, dev)
                x, logits = inputs[0]
                with torch.inference_mode():
                    a = ours(x, logits).float()  # the layer's first eager call tunes FlashInfer's tactics
                    b = documented(x, logits).float()
                row = {"preset": name, "scheme": scheme, "tokens": tokens,
                       "output_rel_diff": float((a - b).norm() / b.norm())}
                for label, fn in (("moe_cuda_us", ours), ("flashinfer_documented_us", documented),
                                  ("triton_us", triton_layer)):
                    row[label] = round(time_layer(fn, inputs)["us"], 2)
                row["moe_cuda_over_flashinfer"] = round(row["moe_cuda_us"] / row["flashinfer_documented_us"], 3)
                if args.kernels:
                    row["kernels"] = {"moe_cuda": kernels(ours, x, logits),
                                      "flashinfer_documented": kernels(documented, x, logits)}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
            del ours, triton_layer, documented
            torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": rows}
    (args.out / "flashinfer_parity.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
