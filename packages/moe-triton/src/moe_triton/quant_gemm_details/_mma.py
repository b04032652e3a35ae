"""The decode-size GEMM of quads weights (int4, int8, MXFP4) in Gluon around warp-level mma.sync (m16n8k16).

Same contract as `_kernel._moe_wgemm_kernel` for quads weights, launched direct (a program per pair,
N tile and K split; `quant_gemm.direct_quant_gemm`) or over aligned blocks of BLOCK_M pairs
(`grouped_quant_gemm`), into every sink but a STORE after a gated activation (whose gate and up
rows lie in other warps: that GEMM1 finishes by last arrival); no NARROW or TAIL blocks, no
GROUP_M. Its twin is `moe_triton.quant_gemm.quant_gemm_torch`.

Why a third kernel: at one token the tl.dot kernel's K loop is bound by instruction issue (under
Triton 3.6, 221 instructions per K tile and thread for 64 weights: cp.async staging, shared-memory
reads, a CTA barrier and wgmma's fences around the dequantization). Here, per K tile and thread,
140 for 64 weights, 246 for 128 (offline SASS, `benchmarks/gpu/decode_mma.py count`):
- the weights are mma.sync's A operand, 16 output rows per warp; the pairs are its N side: a direct
  launch's one pair in an 8-wide N (every column reads it, column 0 is kept), an aligned block's
  BLOCK_M pairs in as many columns, so a pair is padded to 8 columns at most, not to 64;
- each thread copies its quads words (k_width 8: a row's 8 neighbouring words, 16 bytes of int16
  words, 32 of int8's int32 ones) by cp.async into a ring of STAGES K tiles and reads back exactly
  what it copied (Triton's hazard analysis, which cannot see that, still puts two CTA barriers per
  tile around the ring); the
  split's K tiles, at most MAX_TILES, are unrolled; the program's token rows for the whole split
  are read into shared memory once, and each quarter from there;
- each tile's scale rows (zero-point rows, MXFP4's exponent words) travel with its words: 16-byte
  cp.async pieces into a ring per row of the tile (copies into one buffer are fenced from each
  other by a barrier), so a tile waits on no DRAM round trip of its own; a per-channel row is read
  once before the loop (STAGED_SCALES). Loaded in the tile instead (`GemmConfig.scales_in_tile`),
  each group's load is a round trip its sums wait on, but a program keeps fewer registers (a
  copied row is read at its group's start and held through the group's MMAs);
- int4: a quarter of a register pair of words is one shift and one lop3 (the codes in 128's bf16 or
  1024's fp16 mantissa) and one subtraction of 128 + zero point; int8: a prmt, two lop3 and an fma
  per pair of words (`_dequant.byte_quarter_ptx`: code - 128), minus any zero point's offset from
  128; the group's scale multiplies the fp32 sums of its quarters. MXFP4: the e2m1 fields in place
  (`_dequant.e2m1_quarter_ptx`) times their quarter's power of two, exact, before the MMAs.

A dependent launch whose pairs are final before its wait (GEMM2 after GEMM1: EARLY_WEIGHTS) asks
for its first STAGES - 1 tiles of weights before griddepcontrol.wait, while the kernel ahead still runs.
A direct GEMM1 right behind the routing launch (OWN_ROUTE) ranks its pair's expert from the router
logits exactly as that launch does (a softmax over ungrouped experts without a bias chooses by logit:
`moe_core.config.Routing`) and runs its whole split before the wait.

Where it wins and loses (short programs against long ones): docs/design/triton-gemm-quantized.md.

NVIDIA only (mma.sync: sm_80 and later); not run by the CPU interpreter: CI compiles it for sm_90
and the GPU suite checks it against the twin.
"""

from __future__ import annotations

__all__ = ["MAX_TILES", "moe_mma_gemm_kernel"]

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from moe_triton._common import trace
from moe_triton._common.activation import activate
from moe_triton._common.pdl import wait_then_release
from moe_triton.quant_gemm_details._dequant import e2m1_weights, quarter_e8m0_factors
from moe_triton.quant_gemm_details._wgmma import (
    _byte_quarter,
    _e2m1_quarter,
    _nibble,
    _row_copy_layout,
    zero_side_slice,
)

TILE_K = gl.constexpr(128)  # K per quads tile
QUARTER = gl.constexpr(32)  # K per quarter: one word per row and k
DIRECT_COLUMNS = gl.constexpr(8)  # mma.sync's N: a direct launch's pair in column 0
# Renamed after Triton 3.6 (gl.barrier, async_copy.async_load).
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

MAX_TILES = gl.constexpr(8)  # K tiles per program: the loop is unrolled, its tiles' registers named at compile time


@gluon.constexpr_function
def _pow2_at_least(n):
    return 1 << (n - 1).bit_length()


@gluon.jit
def _row_rings(dtype: gl.constexpr, ROWS: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    """A ring of STAGES rows of BLOCK_N for each of a tile's ROWS scale rows (up to four; the others a
    row each, unused): copies into one buffer are fenced from each other by a CTA barrier, copies into
    different ones are not."""
    layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    return (gl.allocate_shared_memory(dtype, [STAGES if ROWS > 0 else 1, BLOCK_N], layout),
            gl.allocate_shared_memory(dtype, [STAGES if ROWS > 1 else 1, BLOCK_N], layout),
            gl.allocate_shared_memory(dtype, [STAGES if ROWS > 2 else 1, BLOCK_N], layout),
            gl.allocate_shared_memory(dtype, [STAGES if ROWS > 3 else 1, BLOCK_N], layout))


@gluon.jit
def _copy(dst, src, mask, EVEN_N: gl.constexpr):
    """cp.async of src into dst, masked to rows below N unless BLOCK_N divides N (EVEN_N)."""
    if EVEN_N:
        _async_load(dst, src)
    else:
        _async_load(dst, src, mask=mask)


@gluon.jit
def _copy_tile(ring, s_rings, z_rings, w_ptrs, w_mask, s_rows, s_mask, z_rows, z_mask, t: gl.constexpr, kt0, k_tiles,
               stride_bt, stride_sk, TILES: gl.constexpr, STAGES: gl.constexpr, EVEN_N: gl.constexpr, SCALE_ROWS: gl.constexpr,
               RING_GROUP: gl.constexpr, HAS_ZP: gl.constexpr):
    """cp.async of K tile kt0 + t's words into ring stage t % STAGES (past the split's last tile that
    tile again: its sums get scale 0; none past TILES) and of its SCALE_ROWS scale rows (zero-point
    rows; MXFP4: its exponent words, RING_GROUP = TILE_K) into that stage of s_rings[r] (z_rings[r]),
    then a commit: one group per call."""
    if t < TILES:
        kt = gl.minimum(kt0 + t, k_tiles - 1)
        _copy(ring.index(t % STAGES), w_ptrs + kt * stride_bt, w_mask, EVEN_N)
        for r in gl.static_range(SCALE_ROWS):
            row = ((kt * TILE_K) // RING_GROUP + r) * stride_sk
            _copy(s_rings[r].index(t % STAGES), s_rows + row, s_mask, EVEN_N)
            if HAS_ZP:
                _copy(z_rings[r].index(t % STAGES), z_rows + row, z_mask, EVEN_N)
    async_copy.commit_group()


_LOWEST_KEY = gl.constexpr(-9223372036854775807 - 1)


@gluon.jit
def _own_expert(route_ptr, slot, num_experts, E_P2: gl.constexpr):
    """The token's slot-th expert as the routing launch chooses it for a softmax over ungrouped experts
    without a bias (`routing_details._kernel.route_topk`'s BY_LOGIT): by logit, highest first, equal
    logits (-Inf ones standing at the lowest finite value) to the lower id. Each warp ranks its own copy
    of the row with shuffles, no barrier until the last reduction."""
    NW: gl.constexpr = gl.num_warps()
    row_l: gl.constexpr = gl.BlockedLayout([1, E_P2 // 32], [1, 32], [NW, 1], [1, 0])
    cols = gl.arange(0, E_P2, layout=gl.SliceLayout(0, row_l))
    ids = gl.expand_dims(gl.arange(0, NW, layout=gl.SliceLayout(1, row_l)) * 0, 1) + gl.expand_dims(cols, 0)
    ok = ids < num_experts
    x = gl.load(route_ptr + ids, mask=ok, other=0.0).to(gl.float32)
    bits = gl.where(x == float("-inf"), -3.4028234663852886e38, x).to(gl.int32, bitcast=True)
    # The logit's bits made order-preserving as a signed integer, the column inverted below them: one
    # max per rank gives the winner (the lower column among equal logits).
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    keys = gl.where(ok, (ordered.to(gl.int64) << 32) | (E_P2 - 1 - ids).to(gl.int64), _LOWEST_KEY)
    for _ in range(slot):
        keys = gl.where(keys == gl.expand_dims(gl.max(keys, axis=1), 1), _LOWEST_KEY, keys)
    col = E_P2 - 1 - (gl.max(keys, axis=1) & 0xFFFFFFFF).to(gl.int32)
    return gl.minimum(gl.max(col, axis=0), num_experts - 1)


@gluon.constexpr_function
def _scale_rows_per_tile(group):
    """Scale rows a K tile spans (groups of 32 or 64: 4 or 2; a tile or more: 1); none per channel (0)."""
    return 0 if group == 0 else max(1, TILE_K.value // group)


@gluon.constexpr_function
def _group_ring(j, group):
    """The scale ring of quarter j's group: a tile's groups of 32 or 64 are rings 0.. onwards."""
    return (j * QUARTER.value) // group if 0 < group < TILE_K.value else 0


@gluon.jit
def _tile_product(acc, words, xs, kt, k_tiles, s_ptrs, z_ptrs, s_rings, z_rings, s_row, z_row, rows_ok, z_rows_ok,
                  stride_sk, stage: gl.constexpr, GROUP: gl.constexpr, WTYPE: gl.constexpr,
                  FOLDED_SCALE: gl.constexpr, HAS_ZP: gl.constexpr, CODE_OFFSET: gl.constexpr, CT: gl.constexpr,
                  STAGED: gl.constexpr, mma: gl.constexpr, w_op: gl.constexpr):
    """acc + one K tile's weights . x per row; a tile past the last (kt >= k_tiles: the split's words
    repeated its last) adds nothing. int4 and int8: (code - zero) . x in fp32, each scale group's sums
    times its scale (GROUP as the kernel's: the whole tile or more, one or two quarters; 0 one row);
    MXFP4: the codes times their quarter's power of two before the MMAs (exact: `_dequant.e8m0_factors`).
    STAGED: the tile's scale (zero-point, exponent-word) rows are stage `stage` of s_rings (z_rings),
    and with GROUP 0 the one row is s_row (z_row); else they are loaded here at s_ptrs (z_ptrs):
    MXFP4's rows in w_op's slice, the scales in mma's."""
    valid = kt < k_tiles
    kt_c = gl.minimum(kt, k_tiles - 1)
    if WTYPE == 3:  # MXFP4 (`_layouts.WType`)
        FT: gl.constexpr = gl.bfloat16 if CT == gl.bfloat16 else gl.float32  # noqa: SIM300
        if STAGED:
            exp_words = s_rings[0].index(stage).load(gl.SliceLayout(1, w_op))
        else:
            exp_words = gl.load(s_ptrs + kt_c * stride_sk, mask=z_rows_ok, other=0)
        part = gl.zeros(acc.shape, gl.float32, layout=mma)
        for j in gl.static_range(4):
            lo, hi = quarter_e8m0_factors(exp_words, j, FT, FOLDED_SCALE)
            part = mma_v2(e2m1_weights(_e2m1_quarter(words, j), lo, hi, FOLDED_SCALE, CT), xs[j], part)
        acc += gl.where(valid, part, 0.0)
    else:
        if WTYPE == 1:  # int8: `_byte_quarter` is code - 128 already
            P: gl.constexpr = -128.0
        elif CT == gl.float16:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
            P: gl.constexpr = 1024.0
        else:
            P: gl.constexpr = 128.0
        # Quarters per scale group in the tile.
        QPG: gl.constexpr = GROUP // QUARTER if GROUP > 0 and GROUP < TILE_K else 4
        part = gl.zeros(acc.shape, gl.float32, layout=mma)
        for j in gl.static_range(4):
            if GROUP == 0:  # one scale row (per channel)
                g = 0
            elif GROUP >= TILE_K:
                g = kt_c // (GROUP // TILE_K)
            else:
                g = kt_c * (TILE_K // GROUP) + (j * QUARTER) // GROUP
            if STAGED and j % QPG == 0:
                # A copied scale read before its group's MMAs: ptxas then scales each group's sums as
                # they finish instead of holding every group's to the tile's end.
                if GROUP == 0:
                    s = s_row
                else:
                    s = s_rings[_group_ring(j, GROUP)].index(stage).load(gl.SliceLayout(1, mma)).to(gl.float32)
            if HAS_ZP and j % QPG == 0:
                if STAGED and GROUP == 0:
                    z = z_row
                elif STAGED:
                    z = z_rings[_group_ring(j, GROUP)].index(stage).load(gl.SliceLayout(1, w_op))
                else:
                    z = gl.load(z_ptrs + g * stride_sk, mask=z_rows_ok, other=0)
                z = gl.expand_dims(z.to(CT) + P, 1)
            if WTYPE == 1:
                w = _byte_quarter(words, j, CT)
                if HAS_ZP:
                    w = w - z
            else:
                if not HAS_ZP and j % QPG == 0:
                    z = gl.full([acc.shape[0], QUARTER], P + CODE_OFFSET, CT, layout=w_op)
                w = _nibble(words, j, CT) - z
            part = mma_v2(w, xs[j], part)
            if j % QPG == QPG - 1:
                if not STAGED:
                    s = gl.load(s_ptrs + g * stride_sk, mask=rows_ok, other=0.0).to(gl.float32)
                acc += part * gl.expand_dims(gl.where(valid, s, 0.0), 1)
                part = gl.zeros(acc.shape, gl.float32, layout=mma)
    return acc


@gluon.jit
def _finish_row_tile(fin_ptr, row, out_row, pid_n, N, stride_fm, alpha, limit, ACT: gl.constexpr,
                     GATE_UP_CHUNK: gl.constexpr, BLOCK_N: gl.constexpr, NW: gl.constexpr):
    """Stores one output row's N tile of whole sums (at `row`, read at L2 where the atomics landed)
    finished: after the activation, of gate and up chunks of GATE_UP_CHUNK rows interleaved
    (`_layouts.GateUpInterleave`) when gated."""
    fin_l: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    if GATE_UP_CHUNK > 0:
        j = gl.arange(0, BLOCK_N // 2, layout=fin_l)
        gate_n = pid_n * BLOCK_N + (j // GATE_UP_CHUNK) * (2 * GATE_UP_CHUNK) + j % GATE_UP_CHUNK
        ok = gate_n < N
        gate = gl.load(row + gate_n, mask=ok, other=0.0, cache_modifier=".cg")
        up = gl.load(row + gate_n + GATE_UP_CHUNK, mask=ok, other=0.0, cache_modifier=".cg")
        y = activate(gate, up, alpha, limit, ACT)
        cols = pid_n * (BLOCK_N // 2) + j
        gl.store(fin_ptr + out_row * stride_fm + cols, y.to(fin_ptr.dtype.element_ty), mask=cols < N // 2)
    else:
        cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=fin_l)
        sums = gl.load(row + cols, mask=cols < N, other=0.0, cache_modifier=".cg")
        y = activate(sums, sums, alpha, limit, ACT)
        gl.store(fin_ptr + out_row * stride_fm + cols, y.to(fin_ptr.dtype.element_ty), mask=cols < N)


@gluon.jit
def _arrive(fin_ptr, sums_ptr, arrivals_ptr, expected, out_rows, valid, pid_n, N, stride_sm, stride_fm, alpha, limit,
            ACT: gl.constexpr, GATE_UP_CHUNK: gl.constexpr, BLOCK_N: gl.constexpr, NW: gl.constexpr,
            ONE_ROW: gl.constexpr):
    """Counts this program's contribution to its output rows' N tile (its partial sums already added
    to sums_ptr; one counter per (output row, N tile)); each row's last of `expected` contributors
    stores it finished (`_finish_row_tile`). ONE_ROW: out_rows is the one row (a direct launch's
    pair), counted once; else a vector of the block's rows, `valid` those to count."""
    _cta_barrier()  # every thread's atomics issued before the acquire-release counts publish them
    n_tiles = gl.num_programs(1)
    if ONE_ROW:
        if gl.atomic_add(arrivals_ptr + out_rows * n_tiles + pid_n, 1, sem="acq_rel") == expected - 1:
            _finish_row_tile(fin_ptr, sums_ptr + out_rows * stride_sm, out_rows, pid_n, N, stride_fm, alpha, limit, ACT,
                             GATE_UP_CHUNK, BLOCK_N, NW)
    else:
        ones = gl.full(out_rows.shape, 1, gl.int32, layout=out_rows.type.layout)
        last = valid & (gl.atomic_add(arrivals_ptr + out_rows * n_tiles + pid_n, ones, mask=valid, sem="acq_rel")
                        == expected - 1)
        # The block's rows in turn: a row's finish reads its whole N tile, a few of them are last.
        for i in range(0, out_rows.shape[0]):
            pick = gl.arange(0, out_rows.shape[0], layout=out_rows.type.layout) == i
            if gl.max(gl.where(pick & last, 1, 0), 0) > 0:
                row = gl.max(gl.where(pick, out_rows, 0), 0)
                _finish_row_tile(fin_ptr, sums_ptr + row * stride_sm, row, pid_n, N, stride_fm, alpha, limit, ACT,
                                 GATE_UP_CHUNK, BLOCK_N, NW)


@gluon.jit
def moe_mma_gemm_kernel(
    a_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, fin_ptr,
    arrivals_ptr, zero_ptr, N, K, num_valid, expected, zero_numel, zero_chunk, alpha, limit,
    stride_am, stride_be, stride_bn, stride_bt, stride_se, stride_sk, stride_biase, stride_cm, stride_fm,
    GROUP: gl.constexpr,  # K per scale row: 32, 64 or a multiple of 128; 0: one row (per channel)
    WTYPE: gl.constexpr,  # `_layouts.WType`: 0 int4 (int16 quads words), 1 int8 (int32 byte quads), 3 MXFP4 (int16)
    FOLDED_SCALE: gl.constexpr,  # MXFP4: every e8m0 exponent at most 128 (one factor per weight)
    HAS_ZP: gl.constexpr, CODE_OFFSET: gl.constexpr, HAS_BIAS: gl.constexpr,
    A_ROWS_DIV: gl.constexpr, MUL_ROUTED: gl.constexpr, REDUCE_TOPK: gl.constexpr,
    SINK: gl.constexpr,  # `_kernel.Sink`: 0 STORE (not gated), 1 ATOMIC, 2 LAST_ARRIVAL (`_arrive`)
    ACT: gl.constexpr, GATE_UP_CHUNK: gl.constexpr, ZERO_SIDE: gl.constexpr,
    DIRECT: gl.constexpr,  # a program per pair (sorted_ids_ptr: topk_ids; expert_ids_ptr: the expert map)
    HAS_MAP: gl.constexpr,  # DIRECT with an expert map
    N_FIRST: gl.constexpr,  # aligned launches: N tiles on the grid's first axis, M blocks on its second
    BLOCK_M: gl.constexpr,  # aligned launches: pairs per block (the MMA's columns); 8 or more
    TILES: gl.constexpr,  # K tiles per program (the split's), 1..MAX_TILES; no program's split is empty
    BLOCK_N: gl.constexpr,  # 16 x num_warps x a power of two
    EVEN_N: gl.constexpr,  # BLOCK_N divides N (no row masks)
    STAGES: gl.constexpr,  # K tiles of words in flight (the ring's stages), 2 or more
    PDL: gl.constexpr, EARLY_WEIGHTS: gl.constexpr,  # DIRECT with PDL: the pairs are final before the wait
    # Each tile's scale rows (zero-point rows, MXFP4's exponent words) copied with its words into the ring,
    # per-channel rows loaded once before the K loop; else loaded in the tile. Needs rows of whole 16-byte
    # pieces: N and the scale strides multiples of 16 elements (as Triton specializes them)
    STAGED_SCALES: gl.constexpr = False,
    # DIRECT GEMM1 with PDL and no expert map, right behind the routing launch (a_rows_div = top_k): each pair's
    # expert from the logits [tokens, num_experts] at route_ptr, ranked as that launch ranks them (`_own_expert`)
    OWN_ROUTE: gl.constexpr = False, ROUTE_E_P2: gl.constexpr = 32,  # num_experts' power of two, 32 or more
    route_ptr=None, stride_route=0, num_experts=0,
    # `moe_triton._common.trace`: a row per program that does not return early
    trace_ptr=None, TRACE: gl.constexpr = False,
):
    """c[pair // REDUCE_TOPK, n] (+)= (a[pair // A_ROWS_DIV] @ W[expert]^T (+ bias) (* topk weight)) over
    the program's K split, for the program's pairs and N tile; the sinks as `_kernel._moe_wgemm_kernel`'s
    (LAST_ARRIVAL of a direct launch: one counted row per program)."""
    NW: gl.constexpr = gl.num_warps()
    CT: gl.constexpr = a_ptr.dtype.element_ty
    COLS: gl.constexpr = DIRECT_COLUMNS if DIRECT else BLOCK_M
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8])
    w_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    x_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    gl.static_assert(TILES >= 1 and TILES <= MAX_TILES, "K tiles per program: 1..MAX_TILES")
    gl.static_assert(STAGES >= 2, "a ring of two stages or more")
    gl.static_assert(GROUP % TILE_K == 0 or GROUP == 64 or GROUP == 32, "scale groups: 32, 64, multiples of 128, 0")
    gl.static_assert(WTYPE != 3 or (GROUP == QUARTER and not HAS_ZP), "MXFP4: an exponent per quarter, no zero points")
    gl.static_assert(WTYPE == 0 or WTYPE == 1 or WTYPE == 3, "int4, int8 or MXFP4 quads")
    gl.static_assert(SINK != 0 or GATE_UP_CHUNK == 0, "a gated activation finishes by last arrival")
    gl.static_assert(not EARLY_WEIGHTS or (DIRECT and PDL), "weights ahead of the wait: dependent direct launches")
    gl.static_assert(not OWN_ROUTE or (DIRECT and PDL and not HAS_MAP and not EARLY_WEIGHTS),
                     "a pair's own routing: dependent direct launches without an expert map")
    gl.static_assert(not (N_FIRST and (DIRECT or SINK == 2)), "last-arrival counters index N tiles by the second axis")

    if N_FIRST:
        pid_n = gl.program_id(0)
        pid_m = gl.program_id(1)
    else:
        pid_m = gl.program_id(0)
        pid_n = gl.program_id(1)
    n0 = pid_n * BLOCK_N
    k_tiles = gl.cdiv(K, TILE_K)
    kt0 = gl.program_id(2) * TILES
    rows = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, w_op))
    words_i = gl.arange(0, QUARTER, layout=gl.SliceLayout(0, w_op))
    acc_rows = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
    rows_ok = acc_rows < N
    z_rows_ok = rows < N
    w_mask = gl.expand_dims(z_rows_ok, 1)  # unused with EVEN_N

    # Each thread reads back only the words it copied: the ring's layout only keeps 16-byte pieces whole.
    ring = gl.allocate_shared_memory(b_ptr.dtype.element_ty, [STAGES, BLOCK_N, QUARTER],
                                     gl.SwizzledSharedLayout(8, 1, 1, [1, 0]))
    # K per scale ring row: MXFP4's exponent words hold a whole tile (`_layouts.pack_e8m0_tiles`).
    RING_GROUP: gl.constexpr = TILE_K if WTYPE == 3 else GROUP
    SCALE_ROWS: gl.constexpr = _scale_rows_per_tile(RING_GROUP) if STAGED_SCALES else 0
    s_rings = _row_rings(s_ptr.dtype.element_ty, SCALE_ROWS, STAGES, BLOCK_N)
    z_rings = _row_rings(z_ptr.dtype.element_ty, SCALE_ROWS if HAS_ZP else 0, STAGES, BLOCK_N)
    t_start = trace.now(TRACE)
    if OWN_ROUTE:
        # GEMM1 of a few tokens: the pair's expert from the router's logits (the routing launch's choice by
        # construction), so that the whole split runs while that launch still does.
        e = _own_expert(route_ptr + (pid_m // A_ROWS_DIV).to(gl.int64) * stride_route, pid_m % A_ROWS_DIV,
                        num_experts, ROUTE_E_P2)
    elif EARLY_WEIGHTS:
        # The pairs are final before this launch's wait: the first tiles' words are on their way
        # while the kernel ahead still runs (only its output, this GEMM's input, needs the wait).
        e = gl.load(sorted_ids_ptr + pid_m)
        if HAS_MAP:
            e = gl.load(expert_ids_ptr + e)
    else:
        wait_then_release(PDL)
        t_released = trace.now(TRACE)
        if DIRECT:
            e = gl.load(sorted_ids_ptr + pid_m)
            if HAS_MAP:
                e = gl.load(expert_ids_ptr + e)
        else:
            if pid_m * BLOCK_M >= gl.load(num_post_ptr):
                if ZERO_SIDE:  # a block past the call's pairs still owns its slice of the side job
                    zero_side_slice(zero_ptr, zero_numel, zero_chunk)
                return
            e = gl.load(expert_ids_ptr + pid_m)
    if OWN_ROUTE:
        e_c = e.to(gl.int64)  # one of this rank's experts
    else:
        e_c = gl.maximum(e, 0).to(gl.int64)  # another rank's expert (-1): read expert 0's, never used
    w_ptrs = b_ptr + e_c * stride_be + gl.expand_dims(rows, 1) * stride_bn + gl.expand_dims(words_i, 0)
    if SCALE_ROWS > 0:  # the scale (zero-point) rows' copies: 16-byte pieces of the tile's N rows
        s_l: gl.constexpr = _row_copy_layout(s_ptr.dtype.element_ty, NW)
        n_s = gl.max_contiguous(gl.multiple_of(n0 + gl.arange(0, BLOCK_N, layout=s_l), 16), 16)
        z_l: gl.constexpr = _row_copy_layout(z_ptr.dtype.element_ty, NW)
        n_z = gl.max_contiguous(gl.multiple_of(n0 + gl.arange(0, BLOCK_N, layout=z_l), 16), 16)
        s_rows, s_mask = s_ptr + e_c * stride_se + n_s, n_s < N
        z_rows, z_mask = z_ptr + e_c * stride_se + n_z, n_z < N
    else:
        s_rows, s_mask, z_rows, z_mask = s_ptr, False, z_ptr, False  # unused
    for t in gl.static_range(STAGES - 1):
        _copy_tile(ring, s_rings, z_rings, w_ptrs, w_mask, s_rows, s_mask, z_rows, z_mask, t, kt0, k_tiles, stride_bt,
                   stride_sk, TILES, STAGES, EVEN_N, SCALE_ROWS, RING_GROUP, HAS_ZP)
    if STAGED_SCALES and GROUP == 0:  # one row for every tile: asked for with the first tiles
        s_row = gl.load(s_ptr + e_c * stride_se + acc_rows, mask=rows_ok, other=0.0).to(gl.float32)
        z_row = gl.load(z_ptr + e_c * stride_se + rows, mask=z_rows_ok, other=0) if HAS_ZP else z_rows_ok
    else:
        s_row, z_row = rows_ok, z_rows_ok  # unused
    if EARLY_WEIGHTS:
        wait_then_release(PDL)
        t_released = trace.now(TRACE)

    if ZERO_SIDE and not OWN_ROUTE:  # after the wait (OWN_ROUTE: after its own, below)
        zero_side_slice(zero_ptr, zero_numel, zero_chunk)

    # The block's pairs: the epilogue's columns (ids, valid, out_rows) and the x copies' (clamped to a
    # valid pair: padding columns read a real row, never stored).
    cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, mma))
    x_l: gl.constexpr = gl.BlockedLayout([8, 1], [16, 2], [1, NW], [0, 1])  # 16 bytes of a token's row each
    x_cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, x_l))
    if DIRECT:
        ids = pid_m + cols * 0
        valid = cols == 0
        x_ids = pid_m + x_cols * 0
    else:
        ids = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + cols)
        valid = ids < num_valid
        x_ids = gl.minimum(gl.load(sorted_ids_ptr + pid_m * BLOCK_M + x_cols), num_valid - 1)
    out_rows = (ids // REDUCE_TOPK).to(gl.int64)

    if e < 0:  # expert owned by another rank: its pairs contribute nothing, but are counted
        async_copy.wait_group(0)  # no copy outlives the program (EARLY_WEIGHTS read expert 0's)
        if SINK == 2:
            if DIRECT:
                _arrive(fin_ptr, c_ptr, arrivals_ptr, expected, (pid_m // REDUCE_TOPK).to(gl.int64), valid, pid_n, N,
                        stride_cm, stride_fm, alpha, limit, ACT, GATE_UP_CHUNK, BLOCK_N, NW, True)
            else:
                _arrive(fin_ptr, c_ptr, arrivals_ptr, expected, out_rows, valid, pid_n, N, stride_cm, stride_fm,
                        alpha, limit, ACT, GATE_UP_CHUNK, BLOCK_N, NW, False)
        return

    # The split's token rows, k-major per column, for every warp: read once, shared behind one barrier.
    SPAN: gl.constexpr = _pow2_at_least(TILES) * TILE_K  # tensor shapes are powers of two
    ks = kt0 * TILE_K + gl.arange(0, SPAN, layout=gl.SliceLayout(1, x_l))
    x_ptrs = a_ptr + gl.expand_dims((x_ids // A_ROWS_DIV).to(gl.int64) * stride_am, 0) + gl.expand_dims(ks, 1)
    xs = gl.allocate_shared_memory(CT, [SPAN, COLS], gl.SwizzledSharedLayout(8, 1, 1, [0, 1]))
    # Past K (a padded last tile, or a split past the last tile): zeros.
    xs.store(gl.load(x_ptrs, mask=gl.expand_dims(ks < K, 1), other=0.0))
    if WTYPE == 3:  # MXFP4: its exponent words are read with the weights' rows
        s_ptrs = s_ptr + e_c * stride_se + rows
    else:
        s_ptrs = s_ptr + e_c * stride_se + acc_rows
    z_ptrs = z_ptr + e_c * stride_se + rows
    _cta_barrier()

    acc = gl.zeros([BLOCK_N, COLS], gl.float32, layout=mma)
    for t in gl.static_range(TILES):
        # Tile t + STAGES - 1 refills the stage tile t - 1 was read from (by the same threads that copy it).
        _copy_tile(ring, s_rings, z_rings, w_ptrs, w_mask, s_rows, s_mask, z_rows, z_mask, t + STAGES - 1, kt0, k_tiles,
                   stride_bt, stride_sk, TILES, STAGES, EVEN_N, SCALE_ROWS, RING_GROUP, HAS_ZP)
        async_copy.wait_group(STAGES - 1)
        words = ring.index(t % STAGES).load(w_op)
        x_t = xs.slice(t * TILE_K, TILE_K, dim=0)
        quarters = (x_t.slice(0, QUARTER, dim=0).load(x_op), x_t.slice(QUARTER, QUARTER, dim=0).load(x_op),
                    x_t.slice(2 * QUARTER, QUARTER, dim=0).load(x_op), x_t.slice(3 * QUARTER, QUARTER, dim=0).load(x_op))
        acc = _tile_product(acc, words, quarters, kt0 + t, k_tiles, s_ptrs, z_ptrs, s_rings, z_rings, s_row, z_row, rows_ok,
                            z_rows_ok, stride_sk, t % STAGES, GROUP, WTYPE, FOLDED_SCALE, HAS_ZP,
                            CODE_OFFSET, CT, STAGED_SCALES, mma, w_op)
    if OWN_ROUTE:  # the routing launch clears the sums and counts the sinks add to: wait for it now
        wait_then_release(PDL)
        t_released = trace.now(TRACE)
        if ZERO_SIDE:
            zero_side_slice(zero_ptr, zero_numel, zero_chunk)

    trace.mark_products_done(trace_ptr, TRACE)
    if HAS_BIAS:  # noqa: SIM102 (HAS_BIAS is a compile-time switch, kt0 a run-time value)
        if kt0 == 0:  # once per output, not once per K-split
            acc += gl.expand_dims(gl.load(bias_ptr + e_c * stride_biase + acc_rows, mask=rows_ok,
                                          other=0.0).to(gl.float32), 1)
    if MUL_ROUTED:
        acc *= gl.expand_dims(gl.load(topk_w_ptr + ids, mask=valid, other=0.0).to(gl.float32), 0)
    keep = gl.expand_dims(valid, 0)
    if not EVEN_N:
        keep = keep & gl.expand_dims(rows_ok, 1)
    c_ptrs = c_ptr + gl.expand_dims(out_rows * stride_cm, 0) + gl.expand_dims(acc_rows, 1)
    if SINK == 0:
        gl.store(c_ptrs, activate(acc, acc, alpha, limit, ACT).to(c_ptr.dtype.element_ty), mask=keep)
    else:
        gl.atomic_add(c_ptrs, acc, mask=keep, sem="relaxed")
    if SINK == 2:
        if DIRECT:
            _arrive(fin_ptr, c_ptr, arrivals_ptr, expected, (pid_m // REDUCE_TOPK).to(gl.int64), valid, pid_n, N,
                    stride_cm, stride_fm, alpha, limit, ACT, GATE_UP_CHUNK, BLOCK_N, NW, True)
        else:
            _arrive(fin_ptr, c_ptr, arrivals_ptr, expected, out_rows, valid, pid_n, N, stride_cm, stride_fm, alpha,
                    limit, ACT, GATE_UP_CHUNK, BLOCK_N, NW, False)
    trace.store(trace_ptr, t_start, t_released, TRACE)
