"""Routed pairs sorted by expert, pad-free, with everything a grouped GEMM and its combine read.

A grouped GEMM (torch's `_grouped_mm`, CUTLASS's grouped kernels) wants each expert's rows as one
contiguous segment, and the combine after it wants each (token, choice) pair's row among the sorted
ones. `permute_by_expert(topk_ids, topk_weights, num_experts)` makes both in two launches: the
alignment kernel's stable counting sort at blocks of one row (`align_block_size`), then one pass
writing every field below (a torch flow of the same took a dozen small kernels: the dtype casts,
the gathers, two binary searches, the inverse permutation). `permute_by_expert_torch` is its twin.

Ids lie in [0, num_experts]; the id num_experts marks a pair computed elsewhere (an expert another
rank owns): those pairs sort after every expert's segment and have slot -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moe_triton._common.intmath import cdiv, next_power_of_2
from moe_triton.align import align_block_size

__all__ = ["ExpertPermutation", "permute_by_expert", "permute_by_expert_torch"]

_BLOCK = 1024  # sorted rows per program of the fields pass


@dataclass(frozen=True, eq=False)
class ExpertPermutation:
    pair: torch.Tensor  # int64 [P], P = M * top_k: the flat index (token * top_k + choice) of each sorted pair
    token: torch.Tensor  # int64 [P]: the token row of each sorted pair
    expert: torch.Tensor  # int64 [P]: its expert; num_experts for pairs computed elsewhere (sorted last)
    weight: torch.Tensor  # fp32 [P]: its router weight
    slot: torch.Tensor  # int32 [P], flat pair order: each pair's sorted row, -1 for pairs computed elsewhere
    offsets: torch.Tensor  # int32 [num_experts]: end row of each expert's segment (nondecreasing)
    starts: torch.Tensor  # int32 [num_experts]: start row of each segment (offsets shifted right by one)
    counts: torch.Tensor  # int32 [num_experts]: rows per expert

    @property
    def local(self) -> torch.Tensor:
        """bool [P]: the pair is computed here."""
        return self.expert < self.counts.numel()


@triton.jit
def _lower_bound(sorted_ptr, P, target, steps):
    """For each lane, the first index of sorted_ptr[0:P] holding a value >= target (P if none)."""
    lo = tl.zeros_like(target)
    hi = tl.zeros_like(target) + P
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(sorted_ptr + mid, mask=active, other=0)
        right = active & (v < target)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    return lo


@triton.jit
def _fields_kernel(sorted_pairs_ptr, sorted_experts_ptr, weights_ptr, pair_ptr, token_ptr, expert_ptr, weight_ptr,
                   slot_ptr, offsets_ptr, starts_ptr, counts_ptr, P, TOP_K, num_experts, steps,
                   BLOCK: tl.constexpr, E_BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = rows < P
    pair = tl.load(sorted_pairs_ptr + rows, mask=m, other=0)
    expert = tl.load(sorted_experts_ptr + rows, mask=m, other=0)
    tl.store(pair_ptr + rows, pair.to(tl.int64), mask=m)
    tl.store(token_ptr + rows, (pair // TOP_K).to(tl.int64), mask=m)
    tl.store(expert_ptr + rows, expert.to(tl.int64), mask=m)
    tl.store(weight_ptr + rows, tl.load(weights_ptr + pair, mask=m, other=0.0).to(tl.float32), mask=m)
    tl.store(slot_ptr + pair, tl.where(expert < num_experts, rows, -1), mask=m)
    if tl.program_id(0) == 0:  # the segments: two binary searches per expert over the sorted experts
        e = tl.arange(0, E_BLOCK)
        em = e < num_experts
        starts = _lower_bound(sorted_experts_ptr, P, e, steps)
        ends = _lower_bound(sorted_experts_ptr, P, e + 1, steps)
        tl.store(starts_ptr + e, starts, mask=em)
        tl.store(offsets_ptr + e, ends, mask=em)
        tl.store(counts_ptr + e, ends - starts, mask=em)


def _check(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int) -> None:
    if topk_ids.dim() != 2 or topk_ids.dtype != torch.int32:
        raise ValueError(f"topk_ids: int32 [M, top_k] is accepted; got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights: a floating tensor shaped as topk_ids {tuple(topk_ids.shape)} is accepted; "
                         f"got {topk_weights.dtype} {tuple(topk_weights.shape)}")
    if topk_weights.device != topk_ids.device:
        raise ValueError(f"topk_weights is on {topk_weights.device}, topk_ids on {topk_ids.device}")
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts={num_experts!r}: a positive int is accepted")


def permute_by_expert(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int) -> ExpertPermutation:
    """The pairs of `topk_ids` (int32 [M, top_k], ids in [0, num_experts], num_experts: computed
    elsewhere) sorted by expert, stable (token order within an expert). Ids are not checked (that
    would cost a host sync); the twin checks them."""
    _check(topk_ids, topk_weights, num_experts)
    dev, (M, top_k) = topk_ids.device, topk_ids.shape
    P = M * top_k
    out = ExpertPermutation(
        pair=torch.empty(P, dtype=torch.int64, device=dev), token=torch.empty(P, dtype=torch.int64, device=dev),
        expert=torch.empty(P, dtype=torch.int64, device=dev), weight=torch.empty(P, dtype=torch.float32, device=dev),
        slot=torch.empty(P, dtype=torch.int32, device=dev),
        offsets=torch.zeros(num_experts, dtype=torch.int32, device=dev),
        starts=torch.zeros(num_experts, dtype=torch.int32, device=dev),
        counts=torch.zeros(num_experts, dtype=torch.int32, device=dev))
    if P == 0:
        return out
    # One-row blocks: no padding, so the sorted pairs and each row's expert are [P] each.
    sorted_pairs, sorted_experts, _ = align_block_size(topk_ids.contiguous(), 1, num_experts + 1)
    _fields_kernel[(cdiv(P, _BLOCK),)](
        sorted_pairs, sorted_experts, topk_weights.contiguous(), out.pair, out.token, out.expert, out.weight, out.slot,
        out.offsets, out.starts, out.counts, P, top_k, num_experts, P.bit_length(),
        BLOCK=_BLOCK, E_BLOCK=next_power_of_2(num_experts), num_warps=4)
    return out


def permute_by_expert_torch(topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                            num_experts: int) -> ExpertPermutation:
    """`permute_by_expert` in torch: a stable argsort."""
    _check(topk_ids, topk_weights, num_experts)
    flat = topk_ids.reshape(-1).long()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) > num_experts):
        raise ValueError(f"topk_ids must lie in [0, {num_experts}], got [{int(flat.min())}, {int(flat.max())}]")
    order = torch.argsort(flat, stable=True)
    expert = flat[order]
    counts = torch.zeros(num_experts + 1, dtype=torch.int32, device=flat.device)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    counts = counts[:num_experts]
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    rows = torch.arange(flat.numel(), dtype=torch.int32, device=flat.device)
    slot = torch.empty_like(rows).index_copy_(0, order, torch.where(expert < num_experts, rows, -1))
    return ExpertPermutation(pair=order, token=order // topk_ids.shape[1], expert=expert,
                             weight=topk_weights.reshape(-1).float()[order], slot=slot, offsets=offsets,
                             starts=offsets - counts, counts=counts)
