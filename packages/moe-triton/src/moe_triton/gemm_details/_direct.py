"""The direct (decode) kernels: GEMM1 and GEMM2 read topk_ids themselves, no alignment.

With a handful of choices each expert meets one or two rows, so a 16-row MMA tile is mostly
padding and the alignment and top-k sum launches cost as much as the math. These kernels reduce
on the CUDA cores, and GEMV2 sums a token's top-k choices in registers, so the whole layer is
route + two launches. Their tiles are narrow in the output dimension so a single token's experts
still spread over every SM.
"""

from __future__ import annotations

import triton
import triton.language as tl

from moe_triton._common.activation import activate
from moe_triton._common.pdl import wait_then_release


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
