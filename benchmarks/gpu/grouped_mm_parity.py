"""moe-cuda's torch grouped GEMM layer against the tightest torch-only flow around the same GEMMs.

The torch-only flow, on the weights moe-cuda's `torch_grouped_mm` layer packed (bf16, SiLU gated):
softmax and top-k routing (renormalized where the model does), one stable sort of the pairs by expert,
the per-expert row ends from a count's cumulative sum (no host sync), the rows gathered, `torch._grouped_mm` for
GEMM1, `silu(gate) * up`, `torch._grouped_mm` for GEMM2, the rows scaled by their router weights and
added into the tokens with one `index_add_` (fp32). The layer differs in its one-launch router and
activation (moe-triton's `routing` and `act_quant`) and its deterministic combine. moe-triton's
layer on the same weights is timed beside them, under the benchmark protocol (CUDA graphs, L2 flushed
before every replay, median).

    python3 grouped_mm_parity.py --out DIR [--presets qwen3-30b-a3b mixtral-8x7b] [--tokens 1 32 512 2048] [--kernels]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from parity_common import parser, run_parity, write_result

from moe_core import FusedMoE
from moe_core.quant import unquantized


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
        counts = torch.zeros(E, dtype=torch.int32, device=x.device).index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)  # bincount would read its maximum on the host
        token = order // top_k
        h = torch._grouped_mm(x[token], self.w13, offs=offsets)
        gate, up = h.chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, self.w2, offs=offsets)
        out = torch.zeros(M, x.shape[1], dtype=torch.float32, device=x.device)
        out.index_add_(0, token, y.float() * weights.flatten()[order, None])
        return out.to(x.dtype)


def main() -> int:
    args = parser(__doc__).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [(name, "bf16", unquantized()) for name in args.presets]
    rows = run_parity(args, cases, "torch_grouped_mm", TorchOnlyFlow, ("moe_cuda", "torch_only"))
    write_result(args.out / "grouped_mm_parity.json", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
