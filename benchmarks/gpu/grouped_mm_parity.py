"""moe-cuda's torch grouped GEMM layer against the tightest torch-only flow around the same GEMMs.

The torch-only flow, on the weights moe-cuda's `torch_grouped_mm` layer packed (bf16, SiLU gated):
softmax and top-k routing (renormalized where the model does), one stable sort of the pairs by expert,
the per-expert row ends from a bincount's cumulative sum, the rows gathered, `torch._grouped_mm` for
GEMM1, `silu(gate) * up`, `torch._grouped_mm` for GEMM2, the rows scaled by their router weights and
added into the tokens with one `index_add_` (fp32). The layer differs in its one-launch router and
activation (`moe_cuda.routing`, `moe_cuda.activation`) and its deterministic combine. moe-triton's
layer on the same weights is timed beside them, under the benchmark protocol (CUDA graphs, L2 flushed
before every replay, median).

    python3 grouped_mm_parity.py --out DIR [--presets qwen3-30b-a3b mixtral-8x7b] [--tokens 1 32 512 2048] [--kernels]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from layer_timing import input_sets, time_layer
from parity_common import kernels

from moe_core import FusedMoE
from moe_core.presets import get_preset
from moe_core.quant import unquantized
from moe_core.weights.canonical import ExpertWeights


class TorchOnlyFlow:
    """The torch-only MoE flow around torch._grouped_mm, on a moe-cuda grouped layer's packed weights."""

    def __init__(self, layer: FusedMoE) -> None:
        self.cfg = layer.config
        packed = layer.experts._packed()
        self.w13, self.w2 = packed["w13"].transpose(1, 2), packed["w2"].transpose(1, 2)  # [E, K, R], [E, N, K]

    def __call__(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        M, top_k, E = x.shape[0], cfg.top_k, cfg.num_experts
        weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1)
        if cfg.routing.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        offsets = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
        token = order // top_k
        h = torch._grouped_mm(x[token], self.w13, offs=offsets)
        gate, up = h.chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, self.w2, offs=offsets)
        out = torch.zeros(M, x.shape[1], dtype=torch.float32, device=x.device)
        out.index_add_(0, token, y.float() * weights.flatten()[order, None])
        return out.to(x.dtype)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["qwen3-30b-a3b", "mixtral-8x7b"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 512, 2048])
    parser.add_argument("--kernels", action="store_true", help="list each one's kernels per cell")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    rows = []
    for name in args.presets:
        preset = get_preset(name)
        weights = ExpertWeights.random(preset.config, unquantized(), seed=0, device=dev)
        # Graphs off: the benchmark captures each layer itself, and the kernel lists need plain calls.
        ours = FusedMoE(preset.config, unquantized(), device=dev, prefer="torch_grouped_mm", cuda_graphs=False)
        ours.load_weights(weights)
        triton_layer = FusedMoE(preset.config, unquantized(), device=dev, prefer="triton", cuda_graphs=False)
        triton_layer.load_weights(weights)
        del weights
        flow = TorchOnlyFlow(ours)
        for tokens in args.tokens:
            inputs = input_sets(preset, tokens, dev)
            x, logits = inputs[0]
            with torch.inference_mode():
                a, b = ours(x, logits).float(), flow(x, logits).float()
            row = {"preset": name, "scheme": "bf16", "tokens": tokens,
                   "output_rel_diff": float((a - b).norm() / b.norm())}
            for label, fn in (("moe_cuda_us", ours), ("torch_only_us", flow), ("triton_us", triton_layer)):
                row[label] = round(time_layer(fn, inputs)["us"], 2)
            row["moe_cuda_over_torch_only"] = round(row["moe_cuda_us"] / row["torch_only_us"], 3)
            if args.kernels:
                row["kernels"] = {"moe_cuda": kernels(ours, x, logits), "torch_only": kernels(flow, x, logits)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
        del ours, triton_layer, flow
        torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": rows}
    (args.out / "grouped_mm_parity.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
