"""The top-k reduce behind a GEMM2 that stores each (token, choice) row: out[t] = sum over j of
rows[t * top_k + j], summed in fp32 in choice order and stored in out's dtype. `topk_sum_torch` is
its twin.

`gather_topk_sum` is the same reduce over rows stored in another order (a grouped GEMM's
expert-sorted rows): out[t] = sum over j of weights[s] * rows[s], s = slot[t * top_k + j], a choice
with slot -1 (an expert another rank owns) adding nothing and its row never read; its twin is
`gather_topk_sum_torch`.

Both only stream memory (M top_k K values read, M K written), close to a device copy of as many
bytes, and launch dependent on the kernel ahead of them (`moe_triton._common.pdl`).
Measurements: docs/design/triton-routing-align-reduce.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_triton._common.intmath import cdiv
from moe_triton._common.pdl import dependent_options, wait_then_release

# Tokens x columns per program: 1 x 1024 at 4 warps, 8 values (16 bytes) per thread and choice
# (the shape matters little: the kernel is bandwidth-bound).
BLOCK_T = 1
BLOCK_K = 1024
NUM_WARPS = 4


@triton.jit
def topk_sum_kernel(rows_ptr, out_ptr, slot_ptr, weights_ptr, M, K, TOP_K: tl.constexpr, BLOCK_T: tl.constexpr,
                    BLOCK_K: tl.constexpr, GATHER: tl.constexpr, WEIGHTED: tl.constexpr, PDL: tl.constexpr):
    wait_then_release(PDL)
    pid = tl.program_id(0)
    col_blocks = tl.cdiv(K, BLOCK_K)
    t = (pid // col_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = (pid % col_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (t < M)[:, None] & (c < K)[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        if GATHER:
            s = tl.load(slot_ptr + t * TOP_K + j, mask=t < M, other=-1)
            taken = mask & (s >= 0)[:, None]
            v = tl.load(rows_ptr + (s.to(tl.int64) * K)[:, None] + c[None, :], mask=taken, other=0.0).to(tl.float32)
            if WEIGHTED:
                v = v * tl.load(weights_ptr + s, mask=s >= 0, other=0.0)[:, None]
        else:
            v = tl.load(rows_ptr + (t.to(tl.int64) * (TOP_K * K) + j * K)[:, None] + c[None, :], mask=mask,
                        other=0.0).to(tl.float32)
        acc += v
    tl.store(out_ptr + (t.to(tl.int64) * K)[:, None] + c[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


def _check(rows: torch.Tensor, top_k: int) -> tuple[int, int]:
    if rows.dim() != 2 or not rows.is_contiguous():
        raise ValueError(f"rows: a contiguous [M * top_k, K] tensor is accepted; got shape {tuple(rows.shape)}, "
                         f"contiguous={rows.is_contiguous()}")
    if top_k < 1 or rows.shape[0] % top_k:
        raise ValueError(f"top_k={top_k}: a positive divisor of the {rows.shape[0]} rows is accepted")
    return rows.shape[0] // top_k, rows.shape[1]


def topk_sum(rows: torch.Tensor, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """[M * top_k, K] rows in choice order (row t * top_k + j) -> [M, K] sums in `dtype`."""
    M, K = _check(rows, top_k)
    out = torch.empty(M, K, dtype=dtype, device=rows.device)
    if M == 0:
        return out
    grid = (cdiv(M, BLOCK_T) * cdiv(K, BLOCK_K),)
    topk_sum_kernel[grid](rows, out, rows, rows, M, K, TOP_K=top_k, BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K, GATHER=False,
                          WEIGHTED=False, num_warps=NUM_WARPS, **dependent_options(rows.device))
    return out


def _check_gather(rows: torch.Tensor, slot: torch.Tensor, top_k: int, weights: torch.Tensor | None) -> int:
    if rows.dim() != 2 or not rows.is_contiguous():
        raise ValueError(f"rows: a contiguous [P, K] tensor is accepted; got shape {tuple(rows.shape)}, "
                         f"contiguous={rows.is_contiguous()}")
    if slot.dim() != 1 or slot.dtype != torch.int32 or not slot.is_contiguous():
        raise ValueError(f"slot: a contiguous int32 [M * top_k] tensor is accepted; got {slot.dtype} "
                         f"{tuple(slot.shape)}")
    if top_k < 1 or slot.numel() % top_k:
        raise ValueError(f"top_k={top_k}: a positive divisor of the {slot.numel()} slots is accepted")
    if weights is not None and (weights.shape != (rows.shape[0],) or weights.dtype != torch.float32
                                or not weights.is_contiguous()):
        raise ValueError(f"weights: a contiguous fp32 [{rows.shape[0]}] tensor (one per row) is accepted; got "
                         f"{weights.dtype} {tuple(weights.shape)}")
    return slot.numel() // top_k


def gather_topk_sum(rows: torch.Tensor, slot: torch.Tensor, top_k: int, dtype: torch.dtype,
                    weights: torch.Tensor | None = None) -> torch.Tensor:
    """[P, K] rows in any order -> [M, K] sums in `dtype`: choice j of token t is row slot[t * top_k + j]
    (int32 [M * top_k]; -1: no row), times weights[that row] (fp32 [P]) where given."""
    M = _check_gather(rows, slot, top_k, weights)
    K = rows.shape[1]
    out = torch.empty(M, K, dtype=dtype, device=rows.device)
    if M == 0:
        return out
    grid = (cdiv(M, BLOCK_T) * cdiv(K, BLOCK_K),)
    topk_sum_kernel[grid](rows, out, slot, weights if weights is not None else rows, M, K, TOP_K=top_k,
                          BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K, GATHER=True, WEIGHTED=weights is not None,
                          num_warps=NUM_WARPS, **dependent_options(rows.device))
    return out


def gather_topk_sum_torch(rows: torch.Tensor, slot: torch.Tensor, top_k: int, dtype: torch.dtype,
                          weights: torch.Tensor | None = None) -> torch.Tensor:
    """`gather_topk_sum` in torch: fp32 products and sums in choice order."""
    M = _check_gather(rows, slot, top_k, weights)
    per_choice = slot.view(M, top_k).long()
    acc = torch.zeros(M, rows.shape[1], dtype=torch.float32, device=rows.device)
    for j in range(top_k):
        s = per_choice[:, j]
        taken = s >= 0
        v = torch.where(taken[:, None], rows[s.clamp(min=0)].float(), 0.0)
        if weights is not None:
            v = v * torch.where(taken, weights[s.clamp(min=0)], 0.0)[:, None]
        acc += v
    return acc.to(dtype)


def topk_sum_torch(rows: torch.Tensor, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """`topk_sum` in torch: fp32 sums in choice order."""
    M, K = _check(rows, top_k)
    per_choice = rows.view(M, top_k, K)
    acc = torch.zeros(M, K, dtype=torch.float32, device=rows.device)
    for j in range(top_k):
        acc += per_choice[:, j].float()
    return acc.to(dtype)
