"""The fused decode kernel: both GEMMs, the gated activation and the weighted top-k sum of a few
tokens' routed experts in one launch.

A program owns one (token, choice) pair and one slice of CHANNELS (128 or 64) intermediate channels:
GEMM1 over those channels' gate and up rows (w13 rows 2 CHANNELS s onwards: 32-row chunks of gate then
up, the layer's `GateUpInterleave`) and all of K gives the slice's activation exactly, which times the
matching columns of w2 (a K tile of w2's quads holds 128; a 64-channel slice reads the whole tile and
multiplies the other half by zeros) is the slice's share of the pair's output row. With K_SPLIT > 1,
that many programs share a slice's K tiles: their GEMM1 partial sums meet in fp32 at L2 (`part_ptr`)
and the last to arrive goes on alone.
The shares are added in fp32 at L2 (`acc_ptr`); the program that arrives last casts the rows into
`out_ptr` and zeroes the accumulator and the counter for the next call. No alignment, no
intermediate tensor, no second launch; each pair reads its expert's weights once.
With ROUTE, each program also routes its token from the router logits (`routing_details`'
`route_topk`: the router's own semantics), so the whole layer is this one launch.

Weights are quads (`quant_gemm_details._layouts`): int4 in int16 words, int8 in int32 words,
symmetric, scales [E, K / group, N] with groups of 32, 64, 128 or one per channel; MXFP4 e2m1 codes
in int16 words, their e8m0 exponents int32 [E, K tiles, N] (`_layouts.pack_e8m0_tiles`). A pair is one
token, so both GEMMs are matrix-vector products on the CUDA cores: each thread multiplies its codes
by the token's values in fp32 and keeps [rows, 32] partial sums, reduced over k once at the end (GEMM1)
or once per block of output rows (GEMM2). A tensor-core dot would pad the token to 16 columns and,
scaled per group, wait on each dot in turn: a chain of dependent latencies, not a stream of bytes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from moe_triton.quant_gemm_details._dequant import (
    int4_zero,
    quarter_e8m0_exponent,
    unpack_byte_quads,
    unpack_e2m1_quads,
    unpack_quads,
)
from moe_triton.routing_details._kernel import route_constexprs, route_topk

__all__ = ["MAX_TOKENS", "SLICE", "fused_decode_launch"]

# Intermediate channels per program by default: one K tile of w2's quads (64 doubles the programs).
SLICE = 128
# Tokens per call: each (token, choice) pair reads its expert's weights itself, so beyond a few
# tokens the layer's aligned GEMMs, which read an expert once for all its pairs, read less.
MAX_TOKENS = 8


@triton.jit
def _quarters(words, WTYPE: tl.constexpr, CODE_OFFSET: tl.constexpr, CT: tl.constexpr, PTX: tl.constexpr):
    """The four quarters of a quads tile as code values (exact) in CT: int4 (WTYPE 0) codes minus
    CODE_OFFSET, int8 (WTYPE 1) codes minus 128, MXFP4 (WTYPE 3) the e2m1 values themselves (the
    unpack's 2^-126 undone by one exact multiply: at most 6 in magnitude)."""
    # One return after the branches: the compiler builds the statements after a returning
    # compile-time branch too (the e2m1 unpack's bf16-only assertion then fails for fp16 int4).
    if WTYPE == 0:
        q0, q1, q2, q3 = unpack_quads(words, CT, PTX)
        z = int4_zero(words, words, False, CODE_OFFSET, CT, words.shape[0])
        q0, q1, q2, q3 = q0 - z, q1 - z, q2 - z, q3 - z
    elif WTYPE == 1:
        q0, q1, q2, q3 = unpack_byte_quads(words, CT, PTX)
    else:
        q0, q1, q2, q3 = unpack_e2m1_quads(words, CT, PTX)
        up = tl.full(q0.shape, 8.507059173023462e37, CT)  # 2^126
        q0, q1, q2, q3 = q0 * up, q1 * up, q2 * up, q3 * up
    return q0, q1, q2, q3


@triton.jit
def _e8m0(words, j: tl.constexpr, FOLDED: tl.constexpr):
    """2^(s - 127) in fp32 of quarter j's e8m0 exponent s in exponent words, exactly (s = 0: the
    subnormal 2^-127)."""
    s = quarter_e8m0_exponent(words, j, FOLDED)
    return tl.where(s > 0, (s << 23).to(tl.float32, bitcast=True), 5.877471754111438e-39)


@triton.jit
def _tile_scales(s_ptrs, k0, stride_g, mask, GROUP: tl.constexpr, WTYPE: tl.constexpr, FOLDED: tl.constexpr):
    """fp32 scales of the four quarters of the K tile at k0, one per row: int4/int8 rows of
    [K / GROUP, N] scales; MXFP4 the exponents of one word per row and tile ([K tiles, N]; FOLDED:
    `WeightOperand.folded_scale`'s words)."""
    if WTYPE == 3:
        words = tl.load(s_ptrs + (k0 // 128) * stride_g, mask=mask, other=0)
        return _e8m0(words, 0, FOLDED), _e8m0(words, 1, FOLDED), _e8m0(words, 2, FOLDED), _e8m0(words, 3, FOLDED)
    f0 = tl.load(s_ptrs + (k0 // GROUP) * stride_g, mask=mask, other=0.0).to(tl.float32)
    if GROUP % 128 == 0:  # one group (or a whole channel) spans the tile: one load
        return f0, f0, f0, f0
    f2 = tl.load(s_ptrs + ((k0 + 64) // GROUP) * stride_g, mask=mask, other=0.0).to(tl.float32)
    if GROUP == 64:
        return f0, f0, f2, f2
    return (f0, tl.load(s_ptrs + ((k0 + 32) // GROUP) * stride_g, mask=mask, other=0.0).to(tl.float32),
            f2, tl.load(s_ptrs + ((k0 + 96) // GROUP) * stride_g, mask=mask, other=0.0).to(tl.float32))


@triton.jit
def _publish(PTX: tl.constexpr):
    """A gpu-scope fence in every thread: its relaxed atomics are performed before the barrier that
    follows, so the one thread's acquire-release count after it publishes every thread's adds, not
    only its own. PTX only: the interpreter runs programs one at a time; other GPUs rely on the
    barrier and the count alone, as the GEMMs' last-arrival sums do."""
    if PTX:
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, 0;", "=r,r", [tl.full([1], 0, tl.int32)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _tile_products(w0, w1, w2, w3, v0, v1, v2, v3, f0, f1, f2, f3, ONE_SCALE: tl.constexpr):
    """[rows, 32] fp32: a K tile's four quarters of codes times the vector's matching values ([32]
    fp32 each), each quarter times its rows' scale (ONE_SCALE: one scale spans the tile, applied once)."""
    p0 = w0.to(tl.float32) * v0[None, :]
    p1 = w1.to(tl.float32) * v1[None, :]
    p2 = w2.to(tl.float32) * v2[None, :]
    p3 = w3.to(tl.float32) * v3[None, :]
    if ONE_SCALE:
        return (p0 + p1 + p2 + p3) * f0[:, None]
    return p0 * f0[:, None] + p1 * f1[:, None] + p2 * f2[:, None] + p3 * f3[:, None]


@triton.jit
def _fused_decode_kernel(
    x_ptr, ids_ptr, wts_ptr, logits_ptr, bias_ptr, w13_ptr, s13_ptr, w2_ptr, s2_ptr, b13_ptr, b2_ptr,
    acc_ptr, out_ptr, count_ptr, part_ptr, group_count_ptr,
    M, K, R1, k_tiles, tiles_per, renormalize_eps, scaling, alpha, limit,
    stride_xm, stride_om, stride_lm,
    stride_w13e, stride_w13r, stride_w13t, stride_s13e, stride_s13g,
    stride_w2e, stride_w2r, stride_w2t, stride_s2e, stride_s2g, stride_b13e, stride_b2e,
    GROUP1: tl.constexpr, GROUP2: tl.constexpr, WTYPE: tl.constexpr, CODE_OFFSET: tl.constexpr,
    FOLDED1: tl.constexpr, FOLDED2: tl.constexpr, SWIGLU: tl.constexpr, EXPERT_BIAS: tl.constexpr,
    CHANNELS: tl.constexpr, BLOCK_H: tl.constexpr,
    K_SPLIT: tl.constexpr, UPCAST: tl.constexpr, PTX: tl.constexpr, ROUTE: tl.constexpr,
    TOP_K: tl.constexpr, K_P2: tl.constexpr, SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr,
    GROUPS: tl.constexpr, G_P2: tl.constexpr, PER_GROUP: tl.constexpr, PG_P2: tl.constexpr,
    TOPK_GROUPS: tl.constexpr, RENORMALIZE: tl.constexpr, SCALE: tl.constexpr,
):
    pair = tl.program_id(0)
    s = tl.program_id(1)
    t_begin = tl.program_id(2) * tiles_per  # this program's K tiles: [t_begin, t_end), maybe none
    t_end = tl.minimum(k_tiles, t_begin + tiles_per)
    OUT_T: tl.constexpr = x_ptr.dtype.element_ty
    CT: tl.constexpr = tl.float32 if UPCAST else OUT_T
    m = pair // TOP_K
    if ROUTE:
        # The router's own top-k of the token's logits (a few hundred cycles), this pair's slot of it.
        top_w, top_id = route_topk(logits_ptr, bias_ptr, m + tl.arange(0, 1), M, stride_lm, renormalize_eps, scaling,
                                   TOP_K, K_P2, SOFTMAX, HAS_BIAS, GROUPS, G_P2, PER_GROUP, PG_P2, TOPK_GROUPS,
                                   RENORMALIZE, SCALE, 1)
        slot = tl.arange(0, K_P2)[None, :] == pair % TOP_K
        e = tl.sum(tl.where(slot, top_id, 0)).to(tl.int64)
        weight = tl.sum(tl.where(slot, top_w, 0.0))
    else:
        e = tl.load(ids_ptr + pair).to(tl.int64)
        weight = tl.load(wts_ptr + pair).to(tl.float32)
    q = tl.arange(0, 32)

    # GEMM1: the slice's w13 rows (gate and up of its channels) against the token over the program's
    # K tiles. Scale rows are N-contiguous.
    ROWS: tl.constexpr = 2 * CHANNELS
    QUARTERS: tl.constexpr = CHANNELS // 32  # of the w2 tile the slice's channels fill
    rows = s * ROWS + tl.arange(0, ROWS)
    in_rows = rows < R1  # the last slice of an intermediate size 128 does not divide (gpt-oss) is half one
    w13 = w13_ptr + e * stride_w13e + rows[:, None] * stride_w13r + q[None, :]
    s13 = s13_ptr + e * stride_s13e + rows
    x_row = x_ptr + m * stride_xm
    acc1 = tl.zeros((ROWS, 32), tl.float32)
    # Each step issues the next tile's load before it unpacks and multiplies this one, so a program
    # keeps two tiles of weights in flight (the loads feed inline asm, which Triton does not pipeline);
    # the last step re-reads its own tile (cached) rather than branch.
    ahead = tl.load(w13 + tl.minimum(t_begin, k_tiles - 1) * stride_w13t, mask=in_rows[:, None], other=0)
    for t in range(t_begin, t_end):
        words = ahead
        ahead = tl.load(w13 + tl.minimum(t + 1, t_end - 1) * stride_w13t, mask=in_rows[:, None], other=0)
        w0, w1, w2, w3 = _quarters(words, WTYPE, CODE_OFFSET, CT, PTX)
        k0 = t * 128
        f0, f1, f2, f3 = _tile_scales(s13, k0, stride_s13g, in_rows, GROUP1, WTYPE, FOLDED1)
        xs = x_row + k0 + q
        acc1 += _tile_products(w0, w1, w2, w3,
                               tl.load(xs, mask=k0 + q < K, other=0.0).to(tl.float32),
                               tl.load(xs + 32, mask=k0 + 32 + q < K, other=0.0).to(tl.float32),
                               tl.load(xs + 64, mask=k0 + 64 + q < K, other=0.0).to(tl.float32),
                               tl.load(xs + 96, mask=k0 + 96 + q < K, other=0.0).to(tl.float32),
                               f0, f1, f2, f3, WTYPE != 3 and GROUP1 % 128 == 0)
    h = tl.sum(acc1, axis=1)
    if K_SPLIT > 1:
        # The slice's K_SPLIT partial sums meet at L2 (relaxed adds, fenced, then published by the
        # acquire-release count); the last to arrive goes on with the whole of them and leaves that
        # scratch zeroed.
        group = pair * tl.num_programs(1) + s
        part = part_ptr + pair * R1 + rows
        tl.atomic_add(part, h, mask=in_rows, sem="relaxed")
        _publish(PTX)
        tl.debug_barrier()
        arrived = tl.atomic_add(group_count_ptr + group, 1, sem="acq_rel")
    else:
        arrived = 0
    if arrived == K_SPLIT - 1:
        if K_SPLIT > 1:
            h = tl.load(part, mask=in_rows, other=0.0, cache_modifier=".cg")
            tl.debug_barrier()  # threads holding the same rows: every load before any zeroing store
            tl.store(part, tl.zeros_like(h), mask=in_rows)
            tl.atomic_xchg(group_count_ptr + group, 0)
        if EXPERT_BIAS:
            h += tl.load(b13_ptr + e * stride_b13e + rows, mask=in_rows, other=0.0)

        # SiLU(gate) * up per channel, times the pair's routing weight, rounded to the layer dtype as the
        # layer's GEMM1 stores it: [QUARTERS, 32 channels] = the slice's channels in order, quarters
        # `first` onwards of w2's K tile; the tile's other quarters (a slice of 64 channels) multiply zeros.
        gate, up = tl.split(tl.permute(tl.reshape(h, (QUARTERS, 2, 32)), (0, 2, 1)))
        if SWIGLU:  # gpt-oss: clamped, gate * sigmoid(alpha * gate) * (up + 1); channels past N give 0
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
            act = gate / (1.0 + tl.exp(-alpha * gate)) * (up + 1.0)
        else:
            act = gate / (1.0 + tl.exp(-gate)) * up
        act = (act * weight).to(OUT_T).to(tl.float32)
        tile = s // (4 // QUARTERS)
        first = (s % (4 // QUARTERS)) * QUARTERS
        quarter = first + tl.arange(0, QUARTERS)[:, None]
        a0 = tl.sum(tl.where(quarter == 0, act, 0.0), axis=0)
        a1 = tl.sum(tl.where(quarter == 1, act, 0.0), axis=0)
        a2 = tl.sum(tl.where(quarter == 2, act, 0.0), axis=0)
        a3 = tl.sum(tl.where(quarter == 3, act, 0.0), axis=0)

        # GEMM2: the K tile of w2 holding these channels, for every output row, added to the pair's token row.
        c0 = tile * 128
        w2_tile = w2_ptr + e * stride_w2e + tile * stride_w2t + q[None, :]
        first_rows = tl.arange(0, BLOCK_H)[:, None]
        w2_ahead = tl.load(w2_tile + first_rows * stride_w2r, mask=first_rows < K, other=0)
        for h0 in range(0, K, BLOCK_H):
            out_rows = h0 + tl.arange(0, BLOCK_H)
            valid = out_rows < K
            w2_words = w2_ahead
            next_rows = out_rows[:, None] + BLOCK_H
            w2_ahead = tl.load(w2_tile + next_rows * stride_w2r, mask=next_rows < K, other=0)
            v0, v1, v2, v3 = _quarters(w2_words, WTYPE, CODE_OFFSET, CT, PTX)
            g0, g1, g2, g3 = _tile_scales(s2_ptr + e * stride_s2e + out_rows, c0, stride_s2g, valid, GROUP2, WTYPE,
                                          FOLDED2)
            share = tl.sum(_tile_products(v0, v1, v2, v3, a0, a1, a2, a3, g0, g1, g2, g3,
                                          WTYPE != 3 and GROUP2 % 128 == 0), axis=1)
            if EXPERT_BIAS:  # noqa: SIM102 (a compile-time branch around a run-time one)
                if s == 0:  # once per pair: by its first slice
                    share += tl.load(b2_ptr + e * stride_b2e + out_rows, mask=valid, other=0.0) * weight
            tl.atomic_add(acc_ptr + m * K + out_rows, share, mask=valid, sem="relaxed")

        # The shares' adds are relaxed (no fence each); every thread's are performed before the barrier,
        # and the acquire-release count publishes them all; the last slice to finish reads the sums at
        # L2, stores the rows and leaves the scratch zeroed.
        _publish(PTX)
        tl.debug_barrier()
        done = tl.atomic_add(count_ptr, 1, sem="acq_rel")
        if done == tl.num_programs(0) * tl.num_programs(1) - 1:
            for start in range(0, M * K, BLOCK_H):
                offs = start + tl.arange(0, BLOCK_H)
                inside = offs < M * K
                sums = tl.load(acc_ptr + offs, mask=inside, other=0.0, cache_modifier=".cg")
                tl.debug_barrier()  # as above: every load of these sums before any zeroing store
                tl.store(out_ptr + (offs // K) * stride_om + offs % K, sums.to(OUT_T), mask=inside)
                tl.store(acc_ptr + offs, tl.zeros_like(sums), mask=inside)
            tl.atomic_xchg(count_ptr, 0)


def fused_decode_launch(x, w13, s13, w2, s2, acc, out, count, *, top_k: int, group1: int, group2: int, wtype: int,
                        code_offset: int, folded: tuple[bool, bool], upcast: bool, ptx: bool, routed=None,
                        router=None, biases=None, swiglu: tuple[float, float] | None = None, channels: int = SLICE,
                        block_h: int = 128, k_split: int = 1, partials=None, num_warps: int = 8) -> None:
    """One launch over (pairs, slices, k_split); see the module docstring for the operands. routed: (topk
    weights fp32, topk ids int32), [M, top_k] each; or router: (logits [M, E], fp32 correction bias
    or None, `routing_details._kernel.route_constexprs`, renormalize_eps, scaling), routed in the kernel.
    biases: the experts' fp32 (w13 [E, 2N] in w13's row order, w2 [E, K]) or None; swiglu: gpt-oss's
    (alpha, limit), else SiLU. folded: MXFP4's `WeightOperand.folded_scale` of w13 and w2 (else False).
    partials (k_split > 1): zeroed fp32 [M * top_k * w13 rows] for GEMM1's
    partial sums and int32 [M * top_k * slices] arrival counts, left zeroed."""
    M, K = x.shape
    if router is not None:
        logits, bias, route_consts, renormalize_eps, scaling = router
        weights = ids = logits
    else:
        (weights, ids), logits, bias, renormalize_eps, scaling = routed, x, None, 0.0, 1.0
        route_consts = route_constexprs(1, top_k, softmax=True, has_bias=False, groups=1, topk_groups=1,
                                        renormalize=False, scaling=1.0)
    b13, b2 = biases if biases is not None else (acc, acc)
    alpha, limit = swiglu if swiglu is not None else (0.0, 0.0)
    rows, k_tiles = w13.shape[1], w13.shape[2]
    part, group_count = partials if k_split > 1 else (acc, count)
    _fused_decode_kernel[(M * top_k, -(-rows // (2 * channels)), k_split)](
        x, ids, weights, logits, bias if bias is not None else logits, w13, s13, w2, s2, b13, b2, acc, out, count,
        part, group_count, M, K, rows, k_tiles, -(-k_tiles // k_split),
        float(renormalize_eps), float(scaling), float(alpha), float(limit),
        x.stride(0), out.stride(0), logits.stride(0),
        w13.stride(0), w13.stride(1), w13.stride(2), s13.stride(0), s13.stride(1),
        w2.stride(0), w2.stride(1), w2.stride(2), s2.stride(0), s2.stride(1), b13.stride(0), b2.stride(0),
        GROUP1=group1, GROUP2=group2, WTYPE=wtype, CODE_OFFSET=code_offset, FOLDED1=folded[0], FOLDED2=folded[1],
        SWIGLU=swiglu is not None,
        EXPERT_BIAS=biases is not None, CHANNELS=channels, BLOCK_H=block_h, K_SPLIT=k_split, UPCAST=upcast,
        PTX=ptx, ROUTE=router is not None, **route_consts, num_warps=num_warps,
    )

