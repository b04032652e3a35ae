"""Pad-free expert permutation and the steps around the grouped GEMMs, without a host sync: on CUDA
mostly moe-triton's kernels (sort, activation, top-k sum), elsewhere torch, their twins.

Routed (token, choice) pairs are sorted by local expert; each expert's rows are one contiguous
segment of the sorted rows, `offsets` holding each segment's end (int32, cumulative), which is what
`torch._grouped_mm` and the CUTLASS grouped GEMMs read. Choices of experts another rank owns (expert
parallelism) are sorted after every local segment, computed by no GEMM, and masked out of the sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_core.config import Activation, MoEConfig, Routing
from moe_core.routing import route_torch
from moe_triton.act_quant import QMode, act_quant, act_quant_torch
from moe_triton.align import align_block_size
from moe_triton.routing import route as route_one_launch
from moe_triton.topk_sum import gather_topk_sum

__all__ = ["ExpertPermutation", "activate", "choice_slots", "combine", "permute_by_expert", "route", "row_pass",
           "sort_by_expert"]


def route(router_logits: torch.Tensor, routing: Routing, top_k: int,
          correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The router of every moe-cuda class: moe-triton's one-launch router on CUDA; on the CPU, where these
    classes run only as the tests' twins of their vendor kernels, its torch twin `route_torch`."""
    if router_logits.is_cuda:
        return route_one_launch(router_logits, routing, top_k, correction_bias)
    return route_torch(router_logits, routing, top_k, correction_bias)


@dataclass(frozen=True, eq=False)
class ExpertPermutation:
    pair: torch.Tensor  # int64 [P], P = M * top_k: the flat index (token * top_k + choice) of each sorted pair
    token: torch.Tensor  # int64 [P]: the token row of each sorted pair
    expert: torch.Tensor  # int64 [P]: its local expert; num_local_experts for choices owned elsewhere (last)
    weight: torch.Tensor  # fp32 [P]: its router weight
    offsets: torch.Tensor  # int32 [E_local]: end row of each local expert's segment (nondecreasing)
    starts: torch.Tensor  # int32 [E_local]: start row of each segment (offsets shifted right by one)
    counts: torch.Tensor  # int32 [E_local]: rows per local expert

    @property
    def local(self) -> torch.Tensor:
        """bool [P]: the pair is computed here (its expert is local)."""
        return self.expert < self.counts.numel()


def permute_by_expert(topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_local_experts: int,
                      expert_map: torch.Tensor | None) -> ExpertPermutation:
    """Sort the M * top_k routed pairs by local expert (stable: token order within an expert): on CUDA
    by moe-triton's alignment kernel with blocks of one row (`sort_by_expert`), elsewhere by a stable
    torch argsort, its twin."""
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
                         "must both be [M, top_k]")
    ids = topk_ids
    if expert_map is not None:
        ids = expert_map.to(ids.device)[ids.long()]
        ids = torch.where(ids < 0, num_local_experts, ids)
    if ids.is_cuda and ids.numel():
        order, sorted_ids, offsets, starts = sort_by_expert(ids, num_local_experts)
        counts = offsets - starts
    else:
        flat = ids.reshape(-1).long()
        order = torch.argsort(flat, stable=True)
        sorted_ids = flat[order]
        counts = torch.zeros(num_local_experts + 1, dtype=torch.int32, device=flat.device)
        counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        counts = counts[:num_local_experts]
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        starts = offsets - counts
    return ExpertPermutation(pair=order, token=order // topk_ids.shape[1], expert=sorted_ids,
                             weight=topk_weights.reshape(-1).float()[order], offsets=offsets,
                             starts=starts, counts=counts)


def sort_by_expert(ids: torch.Tensor, num_local_experts: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Local expert ids [M, top_k] (num_local_experts: owned elsewhere) -> (order int64 [P]: the flat pair
    of each sorted row, their experts int64 [P], each local expert's end and start row, int32 [E_local]),
    through moe-triton's `align_block_size` with blocks of one row: a stable counting sort, one launch up
    to 4096 pairs and a few beyond, where a torch argsort of 16,384 pairs took eight radix passes."""
    sorted_pairs, sorted_experts, _ = align_block_size(ids.to(torch.int32), 1, num_local_experts + 1)
    experts = torch.arange(num_local_experts, dtype=torch.int32, device=ids.device)
    offsets = torch.searchsorted(sorted_experts, experts, right=True, out_int32=True)
    starts = torch.searchsorted(sorted_experts, experts, out_int32=True)
    return sorted_pairs.long(), sorted_experts.long(), offsets, starts


def row_pass(h: torch.Tensor, activation: Activation | None, qmode: QMode, out_dtype: torch.dtype
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """moe-triton's row pass over h's rows (the activation, then fp8 quantization as `qmode` says):
    its one-launch kernel `act_quant` on CUDA, its torch twin `act_quant_torch` elsewhere."""
    run = act_quant if h.is_cuda else act_quant_torch
    return run(h, activation, qmode, out_dtype, h.shape[0])


def activate(h: torch.Tensor, config: MoEConfig) -> torch.Tensor:
    """GEMM1 output [P, R] -> [P, N] in h's dtype; the nonlinearity in fp32, as the reference computes it."""
    return row_pass(h, config.activation, QMode.NONE, h.dtype)[0]


def choice_slots(perm: ExpertPermutation) -> torch.Tensor:
    """int32 [P]: for each (token, choice) pair in flat order, its row among the sorted rows, or -1
    where another rank owns its expert (what `gather_topk_sum` reads)."""
    positions = torch.arange(perm.pair.numel(), dtype=torch.int32, device=perm.pair.device)
    return torch.empty_like(positions).index_copy_(0, perm.pair, torch.where(perm.local, positions, -1))


def combine(y: torch.Tensor, perm: ExpertPermutation, num_tokens: int, weighted: bool) -> torch.Tensor:
    """Sum the sorted rows y [P, K] back into tokens [M, K], times the router weights when `weighted`.

    Rows of experts owned elsewhere hold whatever the GEMM left there: they are masked, never multiplied.
    Each token's choices are summed in choice order in fp32, never by atomic adds, so the result is the
    same bits on every call: on CUDA by one gathering pass of moe-triton's `gather_topk_sum` (each
    choice's sorted row found through its slot); elsewhere in torch, its twin.
    """
    if y.is_cuda:
        top_k = perm.pair.numel() // num_tokens if num_tokens else 1
        return gather_topk_sum(y, choice_slots(perm), top_k, y.dtype, perm.weight if weighted else None)
    scale = torch.where(perm.local, perm.weight if weighted else torch.ones_like(perm.weight), 0.0)
    contrib = torch.where(perm.local[:, None], y.float(), 0.0) * scale[:, None]
    unsorted = torch.empty_like(contrib).index_copy_(0, perm.pair, contrib)
    return unsorted.view(num_tokens, -1, y.shape[1]).sum(1).to(y.dtype)
