"""The top-k reduce behind a GEMM2 that stores each (token, choice) row: out[t] = sum over j of
rows[t * top_k + j], summed in fp32 in choice order and stored in out's dtype. `topk_sum_torch` is
its twin.

It only streams memory (M top_k K values read, M K written), close to a device copy of as many
bytes, and it launches dependent on the GEMM2 ahead of it (`moe_triton._common.pdl`).
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
def topk_sum_kernel(rows_ptr, out_ptr, M, K, TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
                    PDL: tl.constexpr):
    wait_then_release(PDL)
    pid = tl.program_id(0)
    col_blocks = tl.cdiv(K, BLOCK_K)
    t = (pid // col_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = (pid % col_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (t < M)[:, None] & (c < K)[None, :]
    src = rows_ptr + (t.to(tl.int64) * (TOP_K * K))[:, None] + c[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(src + j * K, mask=mask, other=0.0).to(tl.float32)
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
    topk_sum_kernel[grid](rows, out, M, K, TOP_K=top_k, BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K, num_warps=NUM_WARPS,
                          **dependent_options(rows.device))
    return out


def topk_sum_torch(rows: torch.Tensor, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """`topk_sum` in torch: fp32 sums in choice order."""
    M, K = _check(rows, top_k)
    per_choice = rows.view(M, top_k, K)
    acc = torch.zeros(M, K, dtype=torch.float32, device=rows.device)
    for j in range(top_k):
        acc += per_choice[:, j].float()
    return acc.to(dtype)
