"""Sort (token, slot) pairs by expert, run each expert on its contiguous rows, scatter back.

Shared by every CPU experts class: only the per-expert MLP differs between schemes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

# gemm(weight name "w13" or "w2", local expert id, rows [m, in]) -> [m, out]
ExpertGemm = Callable[[str, int, torch.Tensor], torch.Tensor]
# activation over the GEMM1 outputs of every expert at once: [S, R] -> [S, N]
Activate = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Dispatch:
    """Where each routed (token, slot) pair went, sorted by local expert."""

    token: torch.Tensor  # int64 [S]: source row of each sorted pair (pairs on other ranks dropped)
    weight: torch.Tensor  # fp32 [S]: router weight of each sorted pair
    counts: list[int]  # rows per local expert, in expert order


def dispatch(topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_local_experts: int,
             expert_map: torch.Tensor | None) -> Dispatch:
    k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1).long()
    if expert_map is not None:
        ids = expert_map.long()[ids]  # -1: owned by another rank, contributes zero
    order = torch.argsort(ids, stable=True)
    if expert_map is None:
        counts = torch.bincount(ids, minlength=num_local_experts).tolist()
        kept = order
    else:
        counts = torch.bincount(ids + 1, minlength=num_local_experts + 1).tolist()
        kept = order[counts[0]:]  # the -1 pairs sort first
        counts = counts[1:]
    return Dispatch(token=kept // k, weight=topk_weights.reshape(-1).float()[kept], counts=counts)


def run_experts(hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                num_local_experts: int, expert_map: torch.Tensor | None, weight_on_input: bool,
                gemm: ExpertGemm, activate: Activate) -> torch.Tensor:
    """[M, K] -> [M, K]: sum over top-k of router weight * expert(x); loops over experts, never tokens.

    GEMMs run per expert on contiguous row slices; the activation runs once over all rows, which
    matters at a few tokens, where per-op overhead is a visible share of the layer.
    """
    M, K = hidden_states.shape
    if topk_ids.dim() != 2 or topk_ids.shape[0] != M or tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_ids and topk_weights must both be [{M}, top_k] for {M} tokens, got "
                         f"{list(topk_ids.shape)} and {list(topk_weights.shape)}")
    d = dispatch(topk_weights, topk_ids, num_local_experts, expert_map)
    rows = hidden_states.index_select(0, d.token)
    if weight_on_input:  # Llama4: the router weight scales the expert's input, not its output
        rows = (rows.float() * d.weight.unsqueeze(1)).to(hidden_states.dtype)
    out = torch.zeros(M, K, dtype=torch.float32)
    if rows.shape[0] == 0:
        return out.to(hidden_states.dtype)
    ends = list(itertools.accumulate(d.counts))
    active = [(e, end - c, end) for e, (c, end) in enumerate(zip(d.counts, ends)) if c]
    h = _concat([gemm("w13", e, rows[lo:hi]) for e, lo, hi in active])
    a = activate(h)
    y = _concat([gemm("w2", e, a[lo:hi]) for e, lo, hi in active]).float()
    if not weight_on_input:
        y = y * d.weight.unsqueeze(1)
    # fp32 accumulation of the top-k contributions, one rounding to the layer dtype at the end
    out.index_add_(0, d.token, y)
    return out.to(hidden_states.dtype)


def _concat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
