"""The tl.dot grouped GEMM over rows sorted by expert (see `moe_triton.align`).

One kernel serves both GEMMs. GEMM1 reads hidden-state rows (row = sorted id // top_k), computes
the gate and up halves of w13 in one program and applies the activation in its epilogue, so the
2N-wide intermediate never reaches memory. GEMM2 reads the activation rows (row = sorted id),
adds the bias, multiplies the router weight and stores one row per (token, slot).

B is stored [E, out, in] (canonical layout) and read as [BLOCK_K, BLOCK_N] tiles, either through
pointers or (B_TMA) through a host tensor descriptor over B viewed as [E * out, in]: the copy
engine then moves B tiles into shared memory without the warps computing addresses, and zero-fills
past K, so the K loop needs no masks on B. A stays a pointer gather (its rows are scattered
tokens, which Hopper's TMA cannot gather). NARROW (`TileConfig.narrow`) runs a block with at most
half its rows valid (an expert's last) over that half only: with 128-row blocks, 32 rows of MMA
padding per expert on average instead of 64.
"""

from __future__ import annotations

import triton
import triton.language as tl

from moe_triton._common.activation import activate
from moe_triton._common.pdl import wait_then_release


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(row block, column tile) of program pid: programs that share a column tile's weights run
    close together (L2 reuse across GROUP_M row blocks); GROUP_M 1 puts a row block's tiles first."""
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


@triton.jit
def moe_gemm_kernel(
    a_ptr, b_ptr, b_desc, bias_ptr, c_ptr, topk_weights_ptr,
    sorted_ids_ptr, expert_ids_ptr, total_ptr,
    N, K, EM, num_valid,
    stride_am, stride_be, stride_bn, stride_bk, stride_bias_e, stride_cm,
    alpha, limit,
    A_ROW_DIV: tl.constexpr,  # GEMM1: top_k (rows of A are tokens); GEMM2: 1 (rows are choices)
    GATED: tl.constexpr,  # B rows [0, N) are the gate, [N, 2N) the up projection
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,  # multiply by the row's router weight: GEMM1 (ACT != 0) before its bias
                               # and activation (weight on the input), GEMM2 (ACT == 0) after its bias
    ZERO_FOREIGN: tl.constexpr,  # write zeros for blocks of experts another rank owns
    EVEN_K: tl.constexpr,
    B_TMA: tl.constexpr,  # read B through b_desc ([E * out, in], block [BLOCK_N, BLOCK_K]) instead of b_ptr
    UPCAST: tl.constexpr,  # the CPU interpreter mishandles 16-bit dot: compute it in fp32 there
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NARROW: tl.constexpr,  # a block with at most BLOCK_M / 2 valid rows (an expert's last) multiplies only those
    PDL: tl.constexpr,  # launched dependent on the kernel ahead (`moe_triton._common.pdl`)
):
    wait_then_release(PDL)
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(EM, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert == -1:
        if ZERO_FOREIGN:
            ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            tl.store(c_ptr + ids[:, None].to(tl.int64) * stride_cm + offs_n[None, :],
                     tl.zeros([BLOCK_M, BLOCK_N], dtype=c_ptr.dtype.element_ty),
                     mask=(ids < num_valid)[:, None] & (offs_n[None, :] < N))
        return
    block = (a_ptr, b_ptr, b_desc, bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, pid_m * BLOCK_M, pid_n, expert,
             N, K, num_valid, stride_am, stride_be, stride_bn, stride_bk, stride_bias_e, stride_cm, alpha, limit)
    if NARROW:
        # Valid rows are a prefix of the block (the alignment pads each expert's last block).
        if tl.load(sorted_ids_ptr + pid_m * BLOCK_M + BLOCK_M // 2) >= num_valid:
            _gemm_rows(*block, A_ROW_DIV, GATED, ACT, HAS_BIAS, MUL_WEIGHT, EVEN_K, B_TMA, UPCAST, DOT_PRECISION,
                       BLOCK_M // 2, BLOCK_N, BLOCK_K)
        else:
            _gemm_rows(*block, A_ROW_DIV, GATED, ACT, HAS_BIAS, MUL_WEIGHT, EVEN_K, B_TMA, UPCAST, DOT_PRECISION,
                       BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        _gemm_rows(*block, A_ROW_DIV, GATED, ACT, HAS_BIAS, MUL_WEIGHT, EVEN_K, B_TMA, UPCAST, DOT_PRECISION,
                   BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _gemm_rows(a_ptr, b_ptr, b_desc, bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, row0, pid_n, expert,
               N, K, num_valid, stride_am, stride_be, stride_bn, stride_bk, stride_bias_e, stride_cm, alpha, limit,
               A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
               MUL_WEIGHT: tl.constexpr, EVEN_K: tl.constexpr, B_TMA: tl.constexpr, UPCAST: tl.constexpr,
               DOT_PRECISION: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """`moe_gemm_kernel`'s product and epilogue over sorted rows [row0, row0 + ROWS) and BLOCK_N columns."""
    ids = tl.load(sorted_ids_ptr + row0 + tl.arange(0, ROWS))
    row_ok = ids < num_valid
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_dtype = c_ptr.dtype.element_ty
    c_ptrs = c_ptr + ids[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    c_mask = row_ok[:, None] & (offs_n[None, :] < N)

    # Wrapping the column index keeps every B load in bounds without a mask; wrapped columns are
    # never stored.
    offs_bn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    a_rows = (ids // A_ROW_DIV).to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + expert * stride_be + offs_bn[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    if GATED:
        up_ptrs = b_ptrs + N * stride_bn
        acc_up = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    # First B row of this tile in the [E * out, in] view.
    desc_row = expert.to(tl.int32) * (2 * N if GATED else N) + pid_n * BLOCK_N
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        else:
            k_ok = offs_k < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if B_TMA:
            # Columns past N read the next rows (up half or next expert), which are never stored.
            b = b_desc.load([desc_row, k * BLOCK_K]).T
        elif EVEN_K:
            b = tl.load(b_ptrs)
        else:
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if GATED:
            if B_TMA:
                bu = b_desc.load([desc_row + N, k * BLOCK_K]).T
            elif EVEN_K:
                bu = tl.load(up_ptrs)
            else:
                bu = tl.load(up_ptrs, mask=k_ok[:, None], other=0.0)
            if UPCAST:
                bu = bu.to(tl.float32)
            acc_up = tl.dot(a, bu, acc_up, input_precision=DOT_PRECISION)
            up_ptrs += BLOCK_K * stride_bk
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk

    if MUL_WEIGHT:
        w = tl.load(topk_weights_ptr + ids, mask=row_ok, other=0.0).to(tl.float32)
    if MUL_WEIGHT and ACT != 0:
        # Weight on the input (Llama4): (w x) W = w (x W), so it scales the accumulator.
        acc = acc * w[:, None]
        if GATED:
            acc_up = acc_up * w[:, None]
    if HAS_BIAS:
        bias_row = bias_ptr + expert * stride_bias_e
        acc += tl.load(bias_row + offs_bn).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(bias_row + N + offs_bn).to(tl.float32)[None, :]
    if GATED:
        acc = activate(acc, acc_up, alpha, limit, ACT)
    elif ACT != 0:
        acc = activate(acc, acc, alpha, limit, ACT)
    elif MUL_WEIGHT:
        acc = acc * w[:, None]
    tl.store(c_ptrs, acc.to(out_dtype), mask=c_mask)
