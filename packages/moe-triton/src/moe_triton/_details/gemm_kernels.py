"""The grouped GEMM of the fused-MoE pipeline, over rows sorted by expert (see `moe_triton.align`).

One kernel serves both GEMMs. GEMM1 reads hidden-state rows (row = sorted id // top_k), computes
the gate and up halves of w13 in one program and applies the activation in its epilogue, so the
2N-wide intermediate never reaches memory. GEMM2 reads the activation rows (row = sorted id),
adds the bias, multiplies the router weight and stores one row per (token, slot).

B is stored [E, out, in] (canonical layout) and read as [BLOCK_K, BLOCK_N] tiles.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Activation codes (constexpr); `moe_triton._details.pipeline` maps ActivationKind onto them.
ACT_NONE, ACT_SILU, ACT_GELU, ACT_GELU_TANH, ACT_SWIGLU_OAI, ACT_RELU2 = range(6)


@triton.jit
def _activate(gate, up, alpha, limit, ACT: tl.constexpr):
    if ACT == 1:
        out = gate * tl.sigmoid(gate) * up
    elif ACT == 2:
        out = 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476)) * up
    elif ACT == 3:
        # tanh(z) = 2 * sigmoid(2z) - 1 keeps this portable across Triton backends.
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        out = gate * tl.sigmoid(2.0 * z) * up
    elif ACT == 4:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        out = gate * tl.sigmoid(alpha * gate) * (up + 1.0)
    elif ACT == 5:
        r = tl.maximum(gate, 0.0)
        out = r * r
    else:
        out = gate
    return out


@triton.jit
def moe_gemm_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr, topk_weights_ptr,
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
    UPCAST: tl.constexpr,  # the CPU interpreter mishandles 16-bit dot: compute it in fp32 there
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(EM, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Programs that share B tiles run close together (L2 reuse across GROUP_M row blocks).
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ids = tl.load(sorted_ids_ptr + offs_m)
    row_ok = ids < num_valid
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    out_dtype = c_ptr.dtype.element_ty
    c_ptrs = c_ptr + ids[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    c_mask = row_ok[:, None] & (offs_n[None, :] < N)
    if expert == -1:
        if ZERO_FOREIGN:
            tl.store(c_ptrs, tl.zeros([BLOCK_M, BLOCK_N], dtype=out_dtype), mask=c_mask)
        return

    # Wrapping the column index keeps every B load in bounds without a mask; wrapped columns are
    # never stored.
    offs_bn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    a_rows = (ids // A_ROW_DIV).to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + expert * stride_be + offs_bn[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if GATED:
        up_ptrs = b_ptrs + N * stride_bn
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if GATED:
            if EVEN_K:
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
        acc = _activate(acc, acc_up, alpha, limit, ACT)
    elif ACT != 0:
        acc = _activate(acc, acc, alpha, limit, ACT)
    elif MUL_WEIGHT:
        acc = acc * w[:, None]
    tl.store(c_ptrs, acc.to(out_dtype), mask=c_mask)
