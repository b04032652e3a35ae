"""The Triton routing kernel behind `moe_triton.routing.route`.

Columns are laid out as [groups, experts per group], each padded to a power of two; an
ungrouped router is one group. Padded columns hold -inf so they are never chosen. Programs past
the routing's own may quantize the layer input for the kernels behind, and then clear a buffer for
them (`launch_route`'s quantize and zero).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from moe_triton._common import trace
from moe_triton._common.intmath import cdiv, next_power_of_2
from moe_triton._common.pdl import dependent_launch
from moe_triton._common.target import interpreting
from moe_triton.act_quant import fp8_groups

# Each program is one warp over this many scores or more: one row of 128 or more experts, or
# as many rows of fewer experts (mixtral's 8: 16 rows), so every reduction stays within the warp
# (faster than several rows on several warps: docs/design/triton-routing-align-reduce.md).
_WARP_SCORES = 128


# int32 elements each zeroing program clears (`launch_route`'s zero).
_ZERO_BLOCK = 1024
# Input columns (four fp8 groups of 128) each quantizing program takes (`launch_route`'s quantize).
_QUANT_BLOCK = 512


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, zero_ptr, x_ptr, xq_ptr, xs_ptr, M, stride_m, zero_numel,
                  K, stride_x, stride_xq, stride_xs, renormalize_eps, scaling,
                  TOP_K: tl.constexpr, K_P2: tl.constexpr, SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr,
                  GROUPS: tl.constexpr, G_P2: tl.constexpr, PER_GROUP: tl.constexpr, PG_P2: tl.constexpr,
                  TOPK_GROUPS: tl.constexpr, RENORMALIZE: tl.constexpr, SCALE: tl.constexpr,
                  BLOCK_M: tl.constexpr, ZERO_BLOCK: tl.constexpr, QUANT_BLOCK: tl.constexpr,
                  INTERPRET: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr, trace_ptr=None,
                  TRACE: tl.constexpr = False):
    t_start = trace.now(TRACE)
    if LAUNCH_DEPENDENTS:
        # The dependent launch behind (alignment, or a one-token GEMM1) may start now: it waits for
        # this kernel's results itself (`moe_triton._common.pdl`).
        gdc_launch_dependents()
    route_programs = tl.cdiv(M, BLOCK_M)
    if tl.program_id(0) < route_programs:
        _route_rows(logits_ptr, bias_ptr, weights_ptr, ids_ptr, M, stride_m, renormalize_eps, scaling,
                    TOP_K, K_P2, SOFTMAX, HAS_BIAS, GROUPS, G_P2, PER_GROUP, PG_P2, TOPK_GROUPS, RENORMALIZE, SCALE,
                    BLOCK_M)
    else:
        side = tl.program_id(0) - route_programs  # the side jobs' programs: quantizing, then zeroing
        if QUANT_BLOCK > 0:
            chunks = tl.cdiv(K, QUANT_BLOCK)
            if side < M * chunks:
                _quantize_chunk(x_ptr, xq_ptr, xs_ptr, side // chunks, side % chunks, K, stride_x, stride_xq,
                                stride_xs, QUANT_BLOCK, INTERPRET)
            side = side - M * chunks
        if ZERO_BLOCK > 0:
            offs = side * ZERO_BLOCK + tl.arange(0, ZERO_BLOCK)
            # (A quantizing program's side is negative here, and so are its offsets: it stores nothing.)
            tl.store(zero_ptr + offs, tl.zeros([ZERO_BLOCK], dtype=tl.int32), mask=(offs >= 0) & (offs < zero_numel))
    trace.store(trace_ptr, t_start, t_start, TRACE)


@triton.jit
def _quantize_chunk(x_ptr, xq_ptr, xs_ptr, row, chunk, K, stride_x, stride_xq, stride_xs, QUANT_BLOCK: tl.constexpr,
                    INTERPRET: tl.constexpr):
    """QUANT_BLOCK columns of one input row -> e4m3 codes and one fp32 scale per 128 of them
    (`act_quant`'s GROUP128, code for code). K is a multiple of 128."""
    G: tl.constexpr = QUANT_BLOCK // 128
    cols = chunk * QUANT_BLOCK + tl.arange(0, G)[:, None] * 128 + tl.arange(0, 128)[None, :]
    ok = cols < K
    y = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    codes, s = fp8_groups(y, xq_ptr.dtype.element_ty, INTERPRET)
    tl.store(xq_ptr + row.to(tl.int64) * stride_xq + cols, codes, mask=ok)
    groups = chunk * G + tl.arange(0, G)
    tl.store(xs_ptr + row * stride_xs + groups, s, mask=groups * 128 < K)


@triton.jit
def _route_rows(logits_ptr, bias_ptr, weights_ptr, ids_ptr, M, stride_m, renormalize_eps, scaling,
                TOP_K: tl.constexpr, K_P2: tl.constexpr, SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr,
                GROUPS: tl.constexpr, G_P2: tl.constexpr, PER_GROUP: tl.constexpr, PG_P2: tl.constexpr,
                TOPK_GROUPS: tl.constexpr, RENORMALIZE: tl.constexpr, SCALE: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's BLOCK_M rows of logits -> their top-k weights and ids."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    top_w, top_id = route_topk(logits_ptr, bias_ptr, rows, M, stride_m, renormalize_eps, scaling, TOP_K, K_P2, SOFTMAX,
                               HAS_BIAS, GROUPS, G_P2, PER_GROUP, PG_P2, TOPK_GROUPS, RENORMALIZE, SCALE, BLOCK_M)
    slots = tl.arange(0, K_P2)
    out = rows[:, None] * TOP_K + slots[None, :]
    out_ok = (rows < M)[:, None] & (slots[None, :] < TOP_K)
    tl.store(weights_ptr + out, top_w, mask=out_ok)
    tl.store(ids_ptr + out, top_id, mask=out_ok)


@triton.jit
def route_topk(logits_ptr, bias_ptr, rows, M, stride_m, renormalize_eps, scaling,
               TOP_K: tl.constexpr, K_P2: tl.constexpr, SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr,
               GROUPS: tl.constexpr, G_P2: tl.constexpr, PER_GROUP: tl.constexpr, PG_P2: tl.constexpr,
               TOPK_GROUPS: tl.constexpr, RENORMALIZE: tl.constexpr, SCALE: tl.constexpr, BLOCK_M: tl.constexpr):
    """Top-k weights (fp32) and ids (int32) of the logits rows `rows` ([BLOCK_M]), [BLOCK_M, K_P2]
    each, slot s < TOP_K holding the s-th choice: the router's whole semantics, for any kernel that
    routes its own tokens."""
    C: tl.constexpr = G_P2 * PG_P2
    cols = tl.arange(0, C)
    group = cols // PG_P2
    member = cols % PG_P2
    expert = group * PER_GROUP + member
    col_ok = (group < GROUPS) & (member < PER_GROUP)
    row_ok = rows < M
    ok = row_ok[:, None] & col_ok[None, :]
    x = tl.load(logits_ptr + rows[:, None] * stride_m + expert[None, :], mask=ok, other=0.0).to(tl.float32)
    neg_inf = float("-inf")
    pos_inf = float("inf")
    lowest = -3.4028234663852886e38  # the most negative finite fp32
    # Infinite logits as route_torch defines them: +Inf experts are chosen first (lower ids first),
    # weighted by their score's limit; a row of -Inf only chooses no expert (weight 0).
    unbounded = (x == pos_inf) & col_ok[None, :]
    num_unbounded = tl.sum(unbounded.to(tl.int32), axis=1)
    row_unbounded = num_unbounded > 0
    ruled_out = (x == neg_inf) & col_ok[None, :]
    no_expert = tl.sum(ruled_out.to(tl.int32), axis=1) == GROUPS * PER_GROUP
    # A row without a possible expert is routed as zeros, then given weight 0: no NaN on the way.
    x = tl.where(no_expert[:, None], 0.0, x)
    ruled_out = ruled_out & ~no_expert[:, None]
    if SOFTMAX:
        x = tl.where(col_ok[None, :], x, neg_inf)
        bounded = tl.where(row_unbounded[:, None] & col_ok[None, :], 0.0, x)  # +Inf rows: scored below
        row_max = tl.max(bounded, axis=1)
        e = tl.exp(bounded - row_max[:, None])
        row_sum = tl.sum(e, axis=1)
        scores = e / row_sum[:, None]
        unbounded_score = 1.0 / tl.maximum(num_unbounded, 1).to(tl.float32)
        scores = tl.where(row_unbounded[:, None], tl.where(unbounded, unbounded_score[:, None], 0.0), scores)
    else:
        scores = tl.sigmoid(x)
        unbounded_score = tl.full([BLOCK_M], 1.0, tl.float32)
    # A softmax over ungrouped experts without a bias chooses by the logits (`Routing`): the same order,
    # without the ties fp32 rounding makes among probabilities (GEMM1's own ranking relies on it).
    BY_LOGIT: tl.constexpr = SOFTMAX and not HAS_BIAS and GROUPS == 1
    if BY_LOGIT:
        choice = x
    elif HAS_BIAS:
        choice = scores + tl.load(bias_ptr + expert, mask=col_ok, other=0.0)[None, :]
    elif SOFTMAX:  # the other experts of a +Inf row score 0: their logits keep softmax's order
        choice = tl.where(row_unbounded[:, None], x, scores)
    else:
        choice = scores
    choice = tl.where(unbounded, pos_inf, choice)
    choice = tl.where(col_ok[None, :], choice, neg_inf)
    # -Inf experts rank below every possible one whatever the bias (lower ids first), above dropped groups.
    selectable = tl.where(ruled_out, lowest, choice)
    if GROUPS > 1:
        grouped = tl.reshape(choice, [BLOCK_M, G_P2, PG_P2])
        best = tl.max(grouped, axis=2)
        if PER_GROUP > 1:
            at = tl.argmax(grouped, axis=2)
            lane = tl.arange(0, PG_P2)
            second = tl.max(tl.where(lane[None, None, :] == at[:, :, None], neg_inf, grouped), axis=2)
            # A group holding a +Inf expert is kept first, even beside a -Inf one (whose sum is NaN).
            group_score = tl.where(best == pos_inf, best, best + second)
        else:
            group_score = best
        # Groups of -Inf experts only rank below every other real group (lower ids first among them).
        hopeless = tl.min(tl.reshape(ruled_out | ~col_ok[None, :], [BLOCK_M, G_P2, PG_P2]).to(tl.int32), axis=2) > 0
        group_score = tl.where(hopeless, lowest, group_score)
        gids = tl.arange(0, G_P2)
        group_score = tl.where(gids[None, :] < GROUPS, group_score, neg_inf)
        keep = tl.zeros([BLOCK_M, G_P2], dtype=tl.int1)
        for _ in tl.static_range(TOPK_GROUPS):
            g = tl.argmax(group_score, axis=1)
            hit = gids[None, :] == g[:, None]
            keep = keep | hit
            group_score = tl.where(hit, neg_inf, group_score)
        keep_cols = tl.reshape(tl.broadcast_to(keep[:, :, None], [BLOCK_M, G_P2, PG_P2]), [BLOCK_M, C])
        selectable = tl.where(keep_cols, selectable, neg_inf)
    # Each choice becomes one int64 key: the score's bits made order-preserving as a signed integer
    # (flip the magnitude bits of negatives), then the column inverted so that equal scores go to
    # the lower column. One max per top-k step then yields the winner, its column and its score.
    bits = selectable.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    keys = (ordered.to(tl.int64) << 32) | (C - 1 - cols).to(tl.int64)[None, :]
    slots = tl.arange(0, K_P2)
    top_w = tl.zeros([BLOCK_M, K_P2], dtype=tl.float32)
    top_id = tl.zeros([BLOCK_M, K_P2], dtype=tl.int32)
    for s in tl.static_range(TOP_K):
        best = tl.max(keys, axis=1)
        c = C - 1 - (best & 0xFFFFFFFF).to(tl.int32)
        hit = cols[None, :] == c[:, None]
        if HAS_BIAS:  # the bias steers the choice only: the weight is the plain score
            w = tl.sum(tl.where(hit, scores, 0.0), axis=1)
        else:
            top_bits = (best >> 32).to(tl.int32)
            w = (top_bits ^ ((top_bits >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
            chose_unbounded = w == pos_inf
            if BY_LOGIT:  # the chosen logit's probability, as `scores` computes it (no reduction per choice)
                w = tl.exp(w - row_max) / row_sum
            if SOFTMAX:  # in a +Inf row the others' choice is their logit; their score is 0
                w = tl.where(row_unbounded, 0.0, w)
            w = tl.where(chose_unbounded, unbounded_score, tl.where(w == lowest, 0.0, w))
        eid = (c // PG_P2) * PER_GROUP + c % PG_P2
        top_w = tl.where(slots[None, :] == s, w[:, None], top_w)
        top_id = tl.where(slots[None, :] == s, eid[:, None], top_id)
        keys = tl.where(hit, -9223372036854775807 - 1, keys)
    if RENORMALIZE:
        top_w = top_w / (tl.sum(top_w, axis=1)[:, None] + renormalize_eps)
    if SCALE:
        top_w = top_w * scaling
    top_w = tl.where(no_expert[:, None], 0.0, top_w)
    top_id = tl.where(no_expert[:, None], slots[None, :], top_id)
    return top_w, top_id


def route_constexprs(num_experts: int, top_k: int, *, softmax: bool, has_bias: bool, groups: int, topk_groups: int,
                     renormalize: bool, scaling: float) -> dict:
    """`route_topk`'s compile-time arguments for a router of this shape and kind."""
    per_group = num_experts // groups
    return dict(TOP_K=top_k, K_P2=next_power_of_2(top_k), SOFTMAX=softmax, HAS_BIAS=has_bias, GROUPS=groups,
                G_P2=next_power_of_2(groups), PER_GROUP=per_group, PG_P2=next_power_of_2(per_group),
                TOPK_GROUPS=topk_groups, RENORMALIZE=renormalize, SCALE=scaling != 1.0)


def launch_route(logits: torch.Tensor, bias: torch.Tensor | None, weights: torch.Tensor, ids: torch.Tensor, *,
                 top_k: int, softmax: bool, groups: int, topk_groups: int, renormalize: bool,
                 renormalize_eps: float, scaling: float, zero: torch.Tensor | None = None,
                 quantize: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
    """zero: a contiguous int32 buffer that programs of this launch beside the routing's fill with
    zeros (the sums a split GEMM1 adds into), so that it needs no launch of its own. quantize: (x
    [M, K], codes e4m3 [M, K], scales fp32 [M, K / 128]) that programs beside the routing's fill from
    x per 128-wide group (`act_quant`'s GROUP128), checked by `moe_triton.routing.route`."""
    M, E = logits.shape
    zero_programs = 0
    if zero is not None:
        if zero.dtype != torch.int32 or not zero.is_contiguous() or zero.device != logits.device:
            raise ValueError(f"zero must be a contiguous int32 tensor on {logits.device}, got {zero.dtype} "
                             f"on {zero.device}, contiguous={zero.is_contiguous()}")
        zero_programs = cdiv(zero.numel(), _ZERO_BLOCK)
    consts = route_constexprs(E, top_k, softmax=softmax, has_bias=bias is not None, groups=groups,
                              topk_groups=topk_groups, renormalize=renormalize, scaling=scaling)
    block_m = max(1, min(_WARP_SCORES // (consts["G_P2"] * consts["PG_P2"]), next_power_of_2(M)))
    x, codes, scales = quantize if quantize is not None else (logits, ids, weights)
    quant_programs = M * cdiv(x.shape[1], _QUANT_BLOCK) if quantize is not None else 0
    programs = cdiv(M, block_m) + quant_programs + zero_programs
    trace_buf = trace.buffer("route", programs, logits.device)
    _route_kernel[(programs,)](
        logits, bias if bias is not None else logits, weights, ids, zero if zero is not None else ids,
        x, codes, scales, M, logits.stride(0), zero.numel() if zero is not None else 0,
        x.shape[1], x.stride(0), codes.stride(0), scales.stride(0), float(renormalize_eps), float(scaling),
        **consts, BLOCK_M=block_m, ZERO_BLOCK=_ZERO_BLOCK if zero_programs else 0,
        QUANT_BLOCK=_QUANT_BLOCK if quantize is not None else 0, INTERPRET=interpreting(),
        LAUNCH_DEPENDENTS=dependent_launch(logits.device), trace_ptr=trace_buf, TRACE=trace_buf is not None,
        num_warps=1)
