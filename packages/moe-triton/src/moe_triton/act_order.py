"""GEMM1's input for act-order (GPTQ desc_act) weights: out[p] = x[p // pairs_per_row, perm[expert[p]]].

The WNA16 processor sorts each expert's input channels by scale group, so the GEMMs see plain
grouped weights; each (token, choice) pair then needs the token's row in its expert's sorted channel
order. One launch gathers them, reading the int32 permutations as they are: [pairs, K] in x's dtype,
zero for pairs whose expert is -1 (another rank's, skipped by the GEMM). `permute_pair_rows_torch` is
its twin. It only streams memory (pairs K values written), once per layer call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_triton._common.intmath import cdiv

__all__ = ["permute_pair_rows", "permute_pair_rows_torch"]

BLOCK_K = 1024
NUM_WARPS = 4


@triton.jit
def permute_pair_rows_kernel(x_ptr, perm_ptr, expert_ptr, out_ptr, K, x_stride, pairs_per_row,
                             BLOCK_K: tl.constexpr):
    pair = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    expert = tl.load(expert_ptr + pair)
    inside = c < K
    mask = inside & (tl.full([BLOCK_K], 0, tl.int32) + expert >= 0)
    src = tl.load(perm_ptr + expert.to(tl.int64) * K + c, mask=mask, other=0)
    row = (pair // pairs_per_row).to(tl.int64)
    values = tl.load(x_ptr + row * x_stride + src, mask=mask, other=0.0)
    tl.store(out_ptr + pair.to(tl.int64) * K + c, values, mask=inside)


def _check(x: torch.Tensor, perm: torch.Tensor, pair_expert: torch.Tensor, pairs_per_row: int) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x: a [rows, K] tensor with unit column stride is accepted; got shape {list(x.shape)}")
    if perm.dim() != 2 or perm.shape[1] != x.shape[1] or perm.dtype != torch.int32 or not perm.is_contiguous():
        raise ValueError(f"perm: a contiguous int32 [experts, {x.shape[1]}] tensor is accepted; got "
                         f"{perm.dtype} {list(perm.shape)}")
    if pair_expert.dim() != 1 or pair_expert.dtype != torch.int32:
        raise ValueError(f"pair_expert: an int32 vector is accepted; got {pair_expert.dtype} {list(pair_expert.shape)}")
    if pairs_per_row < 1 or pair_expert.numel() != x.shape[0] * pairs_per_row:
        raise ValueError(f"{pair_expert.numel()} pairs are not {pairs_per_row} for each of {x.shape[0]} rows")


def permute_pair_rows(x: torch.Tensor, perm: torch.Tensor, pair_expert: torch.Tensor,
                      pairs_per_row: int) -> torch.Tensor:
    """x [M, K], perm int32 [E, K] (each expert's channel order), pair_expert int32 [M * pairs_per_row]
    (local expert of each pair, -1: none) -> [M * pairs_per_row, K] in x's dtype."""
    _check(x, perm, pair_expert, pairs_per_row)
    pairs, K = pair_expert.numel(), x.shape[1]
    out = torch.empty(pairs, K, dtype=x.dtype, device=x.device)
    if pairs:
        grid = (pairs, cdiv(K, BLOCK_K))
        permute_pair_rows_kernel[grid](x, perm, pair_expert.contiguous(), out, K, x.stride(0), pairs_per_row,
                                       BLOCK_K=BLOCK_K, num_warps=NUM_WARPS)
    return out


def permute_pair_rows_torch(x: torch.Tensor, perm: torch.Tensor, pair_expert: torch.Tensor,
                            pairs_per_row: int) -> torch.Tensor:
    """`permute_pair_rows` in torch."""
    _check(x, perm, pair_expert, pairs_per_row)
    rows = torch.arange(pair_expert.numel(), device=x.device) // pairs_per_row
    expert = pair_expert.long()
    gathered = x[rows.unsqueeze(1), perm.long()[expert.clamp(min=0)]]
    return torch.where((expert >= 0).unsqueeze(1), gathered, torch.zeros((), dtype=x.dtype, device=x.device))
