"""The grouped GEMM of the fused-MoE pipeline, over rows sorted by expert (see `moe_triton.align`).

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

The direct kernels (`moe_gemv1_kernel`, `moe_gemv2_kernel`) serve decode: with a handful of
choices, each expert meets one or two rows, so a 16-row MMA tile is mostly padding and the
alignment and top-k sum launches cost as much as the math. They read topk_ids directly (no
alignment), reduce on the CUDA cores, and GEMV2 sums a token's top-k choices in registers, so
the whole layer is route + two launches. Their tiles are narrow in the output dimension so a single
token's experts still spread over every SM.
"""

from __future__ import annotations

import triton
import triton.language as tl

from moe_triton._details.pdl import wait_then_release

# Activation codes (constexpr); `moe_triton._details.pipeline` maps ActivationKind onto them.
ACT_NONE, ACT_SILU, ACT_GELU, ACT_GELU_TANH, ACT_SWIGLU_OAI, ACT_RELU2 = range(6)


@triton.jit
def activate(gate, up, alpha, limit, ACT: tl.constexpr):
    """The expert activation in fp32 (ACT: one of the ACT_* codes, `quant_act.ActKind` alike): gate
    and up of the gated kinds; the non-gated ones read gate only."""
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
    PDL: tl.constexpr,  # launched dependent on the kernel ahead (`moe_triton._details.pdl`)
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


@triton.jit
def moe_gemv1_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, topk_weights_ptr, topk_ids_ptr, expert_map_ptr,
    N, K, stride_xm, stride_we, stride_wn, stride_bias_e, stride_om,
    alpha, limit,
    TOP_K: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,  # weight on the input: scales the products before bias and activation
    HAS_MAP: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[choice, n] = act(x[choice // TOP_K] . w13[expert][n]) for one choice and BLOCK_N outputs."""
    wait_then_release(PDL)
    pid_n = tl.program_id(0)
    choice = tl.program_id(1)
    expert = tl.load(topk_ids_ptr + choice)
    if HAS_MAP:
        expert = tl.load(expert_map_ptr + expert)
    if expert < 0:
        return  # another rank's expert: GEMV2 skips this choice
    expert = expert.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_wn = offs_n % N  # wrapped rows are never stored, so every weight load stays in bounds
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (choice // TOP_K).to(tl.int64) * stride_xm + offs_k
    w_ptrs = w_ptr + expert * stride_we + offs_wn[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    # Products accumulate elementwise and are reduced once after the loop, keeping the loop pure loads + FMAs.
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if GATED:
        up_ptrs = w_ptrs + N * stride_wn
        acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            x = tl.load(x_ptrs).to(tl.float32)
            w = tl.load(w_ptrs)
        else:
            k_ok = offs_k < K - k * BLOCK_K
            x = tl.load(x_ptrs, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
        acc += x[None, :] * w.to(tl.float32)
        if GATED:
            if EVEN_K:
                wu = tl.load(up_ptrs)
            else:
                wu = tl.load(up_ptrs, mask=k_ok[None, :], other=0.0)
            acc_up += x[None, :] * wu.to(tl.float32)
            up_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    gate = tl.sum(acc, axis=1)
    if GATED:
        up = tl.sum(acc_up, axis=1)
    if MUL_WEIGHT:
        rw = tl.load(topk_weights_ptr + choice).to(tl.float32)
        gate = gate * rw
        if GATED:
            up = up * rw
    if HAS_BIAS:
        bias_row = bias_ptr + expert * stride_bias_e
        gate += tl.load(bias_row + offs_wn).to(tl.float32)
        if GATED:
            up += tl.load(bias_row + N + offs_wn).to(tl.float32)
    if GATED:
        h = activate(gate, up, alpha, limit, ACT)
    else:
        h = activate(gate, gate, alpha, limit, ACT)
    tl.store(out_ptr + choice.to(tl.int64) * stride_om + offs_n, h.to(out_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def moe_gemv2_kernel(
    a_ptr, w_ptr, bias_ptr, out_ptr, topk_weights_ptr, topk_ids_ptr, expert_map_ptr,
    N, K, stride_am, stride_we, stride_wn, stride_bias_e, stride_om,
    TOP_K: tl.constexpr, K_P2: tl.constexpr, HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,  # router weight on the output, after the bias
    HAS_MAP: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[token, n] = sum over the token's choices of weight * (a[choice] . w2[expert][n] + bias).

    All TOP_K experts' tiles are loaded together as one [K_P2, BLOCK_N, BLOCK_K] tile, which keeps
    TOP_K times more bytes in flight per program than a loop over the choices would.
    """
    wait_then_release(PDL)
    pid_n = tl.program_id(0)
    token = tl.program_id(1)
    slots = tl.arange(0, K_P2)
    choices = token * TOP_K + slots
    experts = tl.load(topk_ids_ptr + choices, mask=slots < TOP_K, other=-1)
    if HAS_MAP:
        experts = tl.load(expert_map_ptr + experts, mask=experts >= 0, other=-1)
    live = experts >= 0  # padding slots and other ranks' experts contribute zero
    experts = tl.where(live, experts, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_wn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + choices[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = (w_ptr + experts[:, None, None] * stride_we + offs_wn[None, :, None].to(tl.int64) * stride_wn
              + offs_k[None, None, :])
    acc = tl.zeros([K_P2, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=live[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=live[:, None, None], other=0.0)
        else:
            k_ok = offs_k < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=live[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=live[:, None, None] & k_ok[None, None, :], other=0.0)
        acc += a.to(tl.float32)[:, None, :] * w.to(tl.float32)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    y = tl.sum(acc, axis=2)
    if HAS_BIAS:
        y += tl.load(bias_ptr + experts[:, None] * stride_bias_e + offs_wn[None, :], mask=live[:, None],
                     other=0.0).to(tl.float32)
    if MUL_WEIGHT:
        y = y * tl.load(topk_weights_ptr + choices, mask=live, other=0.0).to(tl.float32)[:, None]
    y = tl.sum(tl.where(live[:, None], y, 0.0), axis=0)
    tl.store(out_ptr + token.to(tl.int64) * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)
