"""The tl.dot grouped GEMM for every quantized weight type, over align-sorted (token, k) pairs.

A program owns one M-block of sorted pairs (all of one expert), one N-tile and one K-split. It
streams the expert's weights once per (M-block, N-tile), dequantizes them in registers
(`_dequant`) and feeds `tl.dot`; small M is parallelised over N and K (split-K with fp32 atomics)
so that enough programs stream weights at once to saturate memory bandwidth. DIRECT skips the
alignment: a block per pair, read from topk_ids (each streams its expert: one token's top-k choices
are distinct experts, a few tokens' mostly are; `quantized.DIRECT_MAX_TOKENS`).

A tile's result goes to one `Sink`: stored once (after GEMM1's activation, when its columns are
interleaved gate/up chunks), added atomically into fp32 sums, or added and finished row by row by
its last contributor (LAST_ARRIVAL). A launch may also zero the next GEMM's sums on the side.

Every launch may be programmatically dependent (`moe_triton._common.pdl`): its programs wait for
the kernel ahead before they write anything or read what it may have written. A one-token GEMM2
of quads uses that head start: before its wait it asks L2 for its first K tiles of weights
(PREFETCH_TILES, a bulk prefetch), which arrive while GEMM1 runs. A GEMM2 may instead wait for
its own block of GEMM1's rows only (`Ready`): GEMM1 counts each block as its programs store it.

Launch-order and block options:
- N_FIRST: N tiles vary fastest, so the programs running together share one block of gathered
  activation rows (read from DRAM once, then from L2).
- GROUP_M (with N_FIRST; 1: none): M blocks in groups of GROUP_M, M fastest within a group, the
  group's N tiles in turn: the programs running together share each weight tile across the group's blocks
  (read from DRAM once where an expert has several blocks) and the group's activation rows.
- NARROW: an aligned block whose second half is padding (an expert's last) runs over its first
  half only (`_wgemm_rows` is compiled for both row counts).
- TAIL (quads): a full block takes in its expert's next block when that holds at most TAIL
  valid pairs: a second accumulator fed by the same dequantized weights, and the next block's
  program exits, so the expert's weights are dequantized once less.
- SWAP_AB (4-bit weights and quads always, fp8 as launched): out^T = W . X^T, the (dequantized) weights
  as the MMA's 64-row operand and the few token rows on its narrow N side.
Measurements behind each: docs/design/triton-gemm-quantized.md. The kernels keep their names
(`_moe_wgemm_kernel`, `_zero_kernel`): profiles and the benchmark's ncu filters select them by name.
"""

from __future__ import annotations

import enum

import triton
import triton.language as tl

from moe_triton._common import trace
from moe_triton._common.activation import activate
from moe_triton._common.pdl import release_dependents, wait_then_release
from moe_triton.quant_gemm_details._dequant import (
    dequantize,
    e2m1_weights,
    int4_zero,
    int8_zero,
    paired_scales,
    quarter_e8m0_factors,
    unpack_byte_quads,
    unpack_e2m1_quads,
    unpack_quads,
)


class AScale(enum.IntEnum):
    """Scales of fp8 activations; weights: the matching fp8 weight scale granularity."""

    NONE = 0  # 16-bit activations
    ROW = 1  # one scale per A row (per-token, and per-tensor expanded to rows), weights per tensor or channel
    GROUP = 2  # one per (row, 128 k), weights in 128x128 blocks


class Ready(enum.IntEnum):
    """How GEMM2's programs wait for GEMM1's rows: for the whole launch, or block by block."""

    ALL = 0  # the dependent launch's wait: all of the kernel ahead finished
    COUNT = 1  # GEMM1: each program adds 1 to its block's counter (ready_ptr[block]) once its rows are
    # stored (and to the next block's when it took that block in), and the elements its side job
    # zeroed to ready_ptr[num_blocks]
    WAIT = 2  # GEMM2 right behind a COUNT launch: no wait for the launch; each program waits for its
    # block's counter (and a taken-in block's) to reach `ready_target`, and, adding into sums that
    # GEMM1 zeroes on the side, for ready_ptr[num_blocks] to reach `zeroed_target`


class Sink(enum.IntEnum):
    """Where a GEMM's tile of results goes (after bias and router weight)."""

    STORE = 0  # written once per row in out's dtype (after the activation, if any)
    ATOMIC = 1  # added into fp32 out (split-K or the top-k reduce); out is zero on entry
    LAST_ARRIVAL = 2  # added into fp32 sums; the tile's last contributor writes it finished (`quant_gemm.LastArrival`)


# A bulk prefetch into L2 (sm_90), issued by the program's first thread only: every thread runs the
# statement, and one request per program is what is wanted.
_PREFETCH_L2_ASM = tl.constexpr("""{
.reg .pred p;
.reg .u32 t;
mov.u32 t, %tid.x;
setp.eq.u32 p, t, 0;
@p cp.async.bulk.prefetch.L2.global [$1], $2;
mov.u32 $0, 0;
}""")


@triton.jit
def _prefetch_l2(ptr, nbytes):
    """Asks L2 for nbytes from ptr, rounded out to whole 16-byte granules (which never leave the
    allocation: allocations are 256-byte aligned). A hint: nothing reaches registers."""
    start = ptr.to(tl.int64)
    lo = start & -16
    hi = (start + nbytes + 15) & -16
    tl.inline_asm_elementwise(_PREFETCH_L2_ASM, "=r,l,r", [lo, (hi - lo).to(tl.int32)], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _prefetch_weights_l2(b_ptr, s_ptr, z_ptr, e, n0, N, kt0, kt1, stride_be, stride_bt, stride_se, stride_sk,
                         HAS_ZP: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """L2 prefetches of one program's quads weights: K tiles kt0..kt1 of rows n0.. (stored
    tile-major, so one tile's rows are one run) and the scale (and zero-point) rows they use
    (N contiguous)."""
    QK: tl.constexpr = BLOCK_K // 4
    word_bytes: tl.constexpr = b_ptr.dtype.element_ty.primitive_bitwidth // 8  # int16 or (int8 quads) int32
    rows = tl.minimum(N - n0, BLOCK_N)
    for kt in range(kt0, kt1):
        _prefetch_l2(b_ptr + e * stride_be + kt * stride_bt + n0 * QK, rows * QK * word_bytes)
    scale_bytes: tl.constexpr = s_ptr.dtype.element_ty.primitive_bitwidth // 8
    for g in range(kt0 * BLOCK_K // GROUP, tl.cdiv(kt1 * BLOCK_K, GROUP)):
        _prefetch_l2(s_ptr + e * stride_se + g * stride_sk + n0, rows * scale_bytes)
        if HAS_ZP:
            _prefetch_l2(z_ptr + e * stride_se + g * stride_sk + n0, rows)


@triton.jit
def _quarter_weights(j: tl.constexpr, values, scales, zeros, exp_words, WTYPE: tl.constexpr, HAS_ZP: tl.constexpr,
                     FOLDED_SCALE: tl.constexpr, FT: tl.constexpr, CT: tl.constexpr, ROW_SCALE: tl.constexpr):
    """Quarter j's weights in CT, [BLOCK_N, 32]: MXFP4's e2m1 values times their e8m0 factors, int8's
    centered codes times their scales, or codes less their zero points times their scales; with
    ROW_SCALE the integer weights unscaled (scaled after the K loop)."""
    if WTYPE == 3:
        lo, hi = quarter_e8m0_factors(exp_words, j, FT, FOLDED_SCALE)
        w = e2m1_weights(values[j], lo, hi, FOLDED_SCALE, CT)
    else:
        if WTYPE == 1 and not HAS_ZP:  # centered codes: nothing to subtract
            w = values[j]
        else:
            w = values[j] - zeros[j]
        if not ROW_SCALE:
            w = w * scales[j]
    return w


@triton.jit
def _quarters_as_tile(q0, q1, q2, q3):
    """Four quarters [BN, QK] of a quads K tile (quarter j holds k = j * QK + i) as the tile, [BN, 4 QK]
    in k order: one dot per K tile. Each thread's elements of a quarter in wgmma's register operand
    layout are those of the tile's k steps 2j and 2j + 1, so the join moves no data between threads."""
    t = tl.join(tl.join(q0, q2), tl.join(q1, q3))  # [BN, QK, p, c]: quarter 2p + c
    BN: tl.constexpr = q0.shape[0]
    QK: tl.constexpr = q0.shape[1]
    return tl.reshape(tl.permute(t, (0, 2, 3, 1)), (BN, 4 * QK))


@triton.jit
def _dot_at(w, a_ptrs, row_mask, k, K, acc_t, CT: tl.constexpr, K_TAIL: tl.constexpr):
    """acc_t + w . A^T, A's [BM, k] tile read at a_ptrs (masked rows, and with K_TAIL columns k >= K,
    read as zeros)."""
    mask = row_mask[:, None] & (k < K)[None, :] if K_TAIL else row_mask[:, None]
    return tl.dot(w, tl.trans(tl.load(a_ptrs, mask=mask, other=0.0).to(CT)), acc_t)


ZERO_BLOCK = tl.constexpr(512)  # elements per store of the zeroing side job


@triton.jit
def _store_finished(out_ptr, acc, out_rows, row_mask, pid_n, N, stride_om, alpha, limit, ACT: tl.constexpr,
                    GATE_UP_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stores a [BM, BLOCK_N] tile of whole sums (GEMM columns pid_n * BLOCK_N + i of N) after the
    activation (identity when ACT is 0). GATE_UP_CHUNK > 0: the tile's columns are interleaved
    gate/up chunks (`_layouts.GateUpInterleave`), so it yields BLOCK_N / 2 outputs."""
    BM: tl.constexpr = acc.shape[0]
    if GATE_UP_CHUNK > 0:
        pairs = tl.reshape(acc, (BM, BLOCK_N // (2 * GATE_UP_CHUNK), 2, GATE_UP_CHUNK))
        gate, up = tl.split(tl.permute(pairs, (0, 1, 3, 2)))
        half: tl.constexpr = BLOCK_N // 2
        y = activate(tl.reshape(gate, (BM, half)), tl.reshape(up, (BM, half)), alpha, limit, ACT)
        cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        col_mask = cols < N // 2
    else:
        y = activate(acc, acc, alpha, limit, ACT)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_mask = cols < N
    tl.store(out_ptr + out_rows[:, None] * stride_om + cols[None, :], y.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _arrive(fin_ptr, sums_ptr, arrivals_ptr, expected, out_rows, row_mask, offs_n, n_mask, pid_n, N, stride_sm,
            stride_fm, alpha, limit, ACT: tl.constexpr, GATE_UP_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, row0=0,
            ONE_ROW: tl.constexpr = False):
    """Counts one program's contribution to its rows of an N tile (partial sums already added to
    sums_ptr; one counter per (output row, N tile)); the last of a row's `expected` contributors
    reads the row's whole sums and stores it finished. ONE_ROW: the block's only valid row is row0
    (a direct launch's pair): one count, and only its last contributor runs the finish (otherwise
    every program computes its rows' finish, masked to the rows it is last for)."""
    # Every thread's atomics are issued before the acquire-release counts publish them.
    tl.debug_barrier()
    if ONE_ROW:
        if tl.atomic_add(arrivals_ptr + row0 * tl.num_programs(1) + pid_n, 1, sem="acq_rel") == expected - 1:
            rows = tl.zeros((1,), tl.int64) + row0
            tile = tl.load(sums_ptr + rows[:, None] * stride_sm + offs_n[None, :], mask=n_mask[None, :], other=0.0,
                           cache_modifier=".cg")
            _store_finished(fin_ptr, tile, rows, rows >= 0, pid_n, N, stride_fm, alpha, limit, ACT, GATE_UP_CHUNK,
                            BLOCK_N)
    else:
        counters = arrivals_ptr + out_rows * tl.num_programs(1) + pid_n
        last = row_mask & (tl.atomic_add(counters, 1, mask=row_mask, sem="acq_rel") == expected - 1)
        # Read at L2, where the other programs' atomics landed.
        tile = tl.load(sums_ptr + out_rows[:, None] * stride_sm + offs_n[None, :],
                       mask=last[:, None] & n_mask[None, :], other=0.0, cache_modifier=".cg")
        _store_finished(fin_ptr, tile, out_rows, last, pid_n, N, stride_fm, alpha, limit, ACT, GATE_UP_CHUNK, BLOCK_N)


@triton.jit
def _moe_wgemm_kernel(
    a_ptr, a_scale_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr, topk_w_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr, fin_ptr, arrivals_ptr, zero_ptr, ready_ptr,
    N, K, num_valid, expected, zero_numel, zero_chunk, num_blocks, ready_target, zeroed_target, alpha, limit,
    stride_am, stride_ak, stride_asm, stride_ask,
    stride_be, stride_bk, stride_bn, stride_bt,
    stride_se, stride_sk, stride_sn,
    stride_biase, stride_cm, stride_fm,
    GROUP: tl.constexpr, WTYPE: tl.constexpr, A_SCALE: tl.constexpr, W_SCALE_PER_N: tl.constexpr,
    HAS_ZP: tl.constexpr, CODE_OFFSET: tl.constexpr, HAS_BIAS: tl.constexpr,
    A_ROWS_DIV: tl.constexpr, MUL_ROUTED: tl.constexpr, REDUCE_TOPK: tl.constexpr, SINK: tl.constexpr,
    ACT: tl.constexpr, GATE_UP_CHUNK: tl.constexpr, ZERO_SIDE: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr, UPCAST: tl.constexpr, DIRECT: tl.constexpr, HAS_MAP: tl.constexpr,
    QUADS: tl.constexpr, PTX: tl.constexpr, POST_SCALE: tl.constexpr, FOLDED_SCALE: tl.constexpr,
    PDL: tl.constexpr, K_TAIL: tl.constexpr, N_FIRST: tl.constexpr, GROUP_M: tl.constexpr,
    NARROW: tl.constexpr, PREFETCH_TILES: tl.constexpr, TAIL: tl.constexpr, ONE_DOT: tl.constexpr,
    READY: tl.constexpr = 0, SCALE_PAIRS: tl.constexpr = False, ROW_SCALE: tl.constexpr = False, trace_ptr=None,
    TRACE: tl.constexpr = False,
):
    t_start = trace.now(TRACE)
    if N_FIRST:
        # N tiles vary fastest in the launch order: the programs running together share one block
        # of gathered activation rows (read from DRAM once, then from L2) and a few experts' weights.
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        if GROUP_M > 1:
            # The same programs renumbered: GROUP_M blocks (fewer in the last group) x every N tile,
            # M fastest, so a weight tile is read by the group's blocks together.
            n_tiles = tl.num_programs(0)
            per_group = GROUP_M * n_tiles
            pid = pid_m * n_tiles + pid_n
            first_m = (pid // per_group) * GROUP_M
            group_rows = tl.minimum(tl.num_programs(1) - first_m, GROUP_M)
            pid_m = first_m + (pid % per_group) % group_rows
            pid_n = (pid % per_group) // group_rows
    else:
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
    tl.static_assert(not (N_FIRST and SINK == 2), "last-arrival counters index N tiles by the grid's second axis")
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    kt0 = tl.program_id(2) * per_split
    kt1 = tl.minimum(kt0 + per_split, k_tiles)
    if PREFETCH_TILES > 0:
        # Before the wait, while the kernel ahead (GEMM1) still streams its weights: this program's
        # first K tiles head for L2, so its K loop starts on L2 hits instead of a cold DRAM stream
        # after GEMM1's tail. It reads only topk_ids or the alignment's blocks, complete before the
        # kernel ahead passed its own wait (no launch can start before that), the expert map and the
        # weights.
        tl.static_assert(QUADS and PDL, "L2 prefetch: dependent launches of quads")
        if DIRECT:
            pre_e = tl.load(sorted_ids_ptr + pid_m)
            if HAS_MAP:
                pre_e = tl.load(expert_ids_ptr + pre_e)
        else:
            pre_e = tl.load(expert_ids_ptr + pid_m)
            pre_e = tl.where(pid_m * BLOCK_M < tl.load(num_post_ptr), pre_e, -1)  # a block past the last: none
        if pre_e >= 0:
            # MXFP4's exponent words hold a whole K tile each: one scale row per tile.
            _prefetch_weights_l2(b_ptr, s_ptr, z_ptr, pre_e.to(tl.int64), pid_n * BLOCK_N, N, kt0,
                                 tl.minimum(kt1, kt0 + PREFETCH_TILES), stride_be, stride_bt, stride_se, stride_sk,
                                 HAS_ZP, BLOCK_K if WTYPE == 3 else GROUP, BLOCK_N, BLOCK_K)
    # Launched while the previous kernel may still run (programmatic dependent launch).
    if READY == 2:
        # Behind GEMM1, which counts its blocks as it stores them: the waits are per block, below.
        release_dependents(PDL)
    else:
        wait_then_release(PDL)
    t_released = trace.now(TRACE)
    if ZERO_SIDE:
        # A side job: clear the next GEMM's int32/fp32 accumulators (zero bits), a slice per program,
        # which saves that GEMM a fill launch.
        pid = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)
        z_end = tl.minimum(pid * zero_chunk + zero_chunk, zero_numel)
        for zero_start in range(pid * zero_chunk, z_end, ZERO_BLOCK):
            z_offs = zero_start + tl.arange(0, ZERO_BLOCK)
            tl.store(zero_ptr + z_offs, tl.zeros((ZERO_BLOCK,), tl.int32), mask=z_offs < z_end)
        if READY == 1 and z_end > pid * zero_chunk:
            _count(ready_ptr + num_blocks, z_end - pid * zero_chunk)
    tl.static_assert(QUADS or not K_TAIL, "only the quads layout pads K to whole tiles")
    # The launcher leaves no K-split empty; the return tells the compiler the K loop below runs at
    # least once (without it ptxas serializes the wgmma of the loop).
    if kt0 >= kt1:
        return
    if DIRECT:
        # One block per pair, read straight from topk_ids (sorted_ids_ptr) and the expert map
        # (expert_ids_ptr): no alignment launch. Row 0 is the pair, the others are padding.
        e = tl.load(sorted_ids_ptr + pid_m).to(tl.int64)
        if HAS_MAP:
            e = tl.load(expert_ids_ptr + e).to(tl.int64)
    else:
        if pid_m * BLOCK_M >= tl.load(num_post_ptr):
            return
        e = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if e < 0:  # expert owned by another rank: its pairs contribute nothing, but are counted
        if SINK == 2:
            if READY == 2:
                _wait_count(ready_ptr + num_blocks, zeroed_target, PTX)
            ids = _block_ids(sorted_ids_ptr, pid_m, num_valid, DIRECT, BLOCK_M, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            _arrive(fin_ptr, c_ptr, arrivals_ptr, expected, (ids // REDUCE_TOPK).to(tl.int64), ids < num_valid,
                    offs_n, offs_n < N, pid_n, N, stride_cm, stride_fm, alpha, limit, ACT, GATE_UP_CHUNK, BLOCK_N)
        return
    tile = (a_ptr, a_scale_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, fin_ptr, arrivals_ptr,
            pid_m, pid_n, e, kt0, kt1, N, K, num_valid, expected, alpha, limit,
            stride_am, stride_ak, stride_asm, stride_ask, stride_be, stride_bk, stride_bn, stride_bt,
            stride_se, stride_sk, stride_sn, stride_biase, stride_cm, stride_fm)
    tl.static_assert(not ((NARROW or TAIL > 0) and DIRECT), "direct blocks hold one pair")
    absorbs = False
    if TAIL > 0:
        tl.static_assert(QUADS and SWAP_AB and not POST_SCALE and TAIL < BLOCK_M,
                         "taken-in tails: quads, swapped, not scaled per tile, TAIL below BLOCK_M")
        # A block with at most TAIL valid pairs after one of the same expert's (an expert's last
        # after a full one) is taken in by that block: the same test on both sides.
        has_prev = pid_m > 0
        prev_e = tl.load(expert_ids_ptr + pid_m - 1, mask=has_prev, other=-1)
        if has_prev & (tl.load(sorted_ids_ptr + pid_m * BLOCK_M + TAIL) >= num_valid) & (prev_e == e):
            return
        has_next = (pid_m + 1) * BLOCK_M < tl.load(num_post_ptr)
        next_e = tl.load(expert_ids_ptr + pid_m + 1, mask=has_next, other=-1)
        next_tail = tl.load(sorted_ids_ptr + (pid_m + 1) * BLOCK_M + TAIL, mask=has_next, other=0)
        absorbs = has_next & (next_e == e) & (next_tail >= num_valid)
    if READY == 2:
        _wait_count(ready_ptr + pid_m, ready_target, PTX)
        if absorbs:
            _wait_count(ready_ptr + pid_m + 1, ready_target, PTX)
        if SINK != 0:
            _wait_count(ready_ptr + num_blocks, zeroed_target, PTX)
        t_released = trace.now(TRACE)
    # Valid pairs are a prefix of the block (the alignment pads each expert's last block). Without
    # NARROW (TAIL) this is False at compile time and only the whole block's code is built.
    narrow = NARROW and tl.load(sorted_ids_ptr + pid_m * BLOCK_M + BLOCK_M // 2) >= num_valid
    # (Compile-time values lose that status in a tuple: they are spelled out per call.)
    if absorbs:
        _wgemm_rows(*tile, GROUP, WTYPE, A_SCALE, W_SCALE_PER_N, HAS_ZP, CODE_OFFSET, HAS_BIAS, A_ROWS_DIV,
                    MUL_ROUTED, REDUCE_TOPK, SINK, ACT, GATE_UP_CHUNK, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB, UPCAST,
                    DIRECT, QUADS, PTX, POST_SCALE, FOLDED_SCALE, K_TAIL, BLOCK_M, TAIL, ONE_DOT, SCALE_PAIRS,
                    ROW_SCALE, trace_ptr, TRACE)
    elif narrow:
        _wgemm_rows(*tile, GROUP, WTYPE, A_SCALE, W_SCALE_PER_N, HAS_ZP, CODE_OFFSET, HAS_BIAS, A_ROWS_DIV,
                    MUL_ROUTED, REDUCE_TOPK, SINK, ACT, GATE_UP_CHUNK, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB, UPCAST,
                    DIRECT, QUADS, PTX, POST_SCALE, FOLDED_SCALE, K_TAIL, BLOCK_M // 2, 0, ONE_DOT, SCALE_PAIRS,
                    ROW_SCALE, trace_ptr, TRACE)
    else:
        _wgemm_rows(*tile, GROUP, WTYPE, A_SCALE, W_SCALE_PER_N, HAS_ZP, CODE_OFFSET, HAS_BIAS, A_ROWS_DIV,
                    MUL_ROUTED, REDUCE_TOPK, SINK, ACT, GATE_UP_CHUNK, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB, UPCAST,
                    DIRECT, QUADS, PTX, POST_SCALE, FOLDED_SCALE, K_TAIL, BLOCK_M, 0, ONE_DOT, SCALE_PAIRS,
                    ROW_SCALE, trace_ptr, TRACE)
    if READY == 1:
        _count(ready_ptr + pid_m, 1)
        if absorbs:
            _count(ready_ptr + pid_m + 1, 1)
    trace.store(trace_ptr, t_start, t_released, TRACE)


@triton.jit
def _count(ptr, n):
    """Adds n to the int32 counter at ptr once every thread of the program has issued its stores
    (one thread's release-add after the barrier publishes them all)."""
    tl.debug_barrier()
    tl.atomic_add(ptr, n, sem="release")


@triton.jit
def _wait_count(ptr, target, PTX: tl.constexpr):
    """Waits until the int32 counter at ptr reaches target, then acquires it: what the counting
    programs stored before their release-adds is visible to all of this program's later loads.

    The polls read at L2 (volatile): an acquire per poll would also empty the SM's L1, which the
    programs of the launch ahead running beside it read through. On NVIDIA one thread polls, 128 ns
    apart, and acquires in PTX (Triton 3.6 drops an atomic add of zero whose result is unused), then
    a barrier passes the acquire to the other threads: with every warp polling, a launch ahead that
    runs in one wave took up to 13% longer (docs/design/triton-gemm-quantized.md). Elsewhere there is
    no dependent launch: the counters are final before this program starts."""
    if PTX:
        tl.inline_asm_elementwise(
            """{
            .reg .pred other_thread, below;
            .reg .b32 thread, count;
            mov.u32 thread, %tid.x;
            setp.ne.u32 other_thread, thread, 0;
            @other_thread bra DONE;
            POLL:
            ld.volatile.global.b32 count, [$1];
            setp.lt.s32 below, count, $2;
            @!below bra ACQUIRE;
            nanosleep.u32 128;
            bra POLL;
            ACQUIRE:
            ld.acquire.gpu.global.b32 count, [$1];
            DONE:
            mov.u32 $0, 0;
            }""", "=r,l,r", [ptr, target], dtype=tl.int32, is_pure=False, pack=1)
    else:
        while tl.load(ptr, volatile=True) < target:
            pass
        tl.atomic_add(ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _block_ids(sorted_ids_ptr, pid_m, num_valid, DIRECT: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr):
    """Pair ids of block pid_m's first ROWS rows; num_valid marks padding."""
    if DIRECT:
        ids = tl.where(tl.arange(0, ROWS) == 0, pid_m, num_valid)
    else:
        ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, ROWS))
    return ids


@triton.jit
def _int_zero(zero_ptrs, n_mask, WTYPE: tl.constexpr, HAS_ZP: tl.constexpr, CODE_OFFSET: tl.constexpr,
              CT: tl.constexpr, BLOCK_N: tl.constexpr):
    """One scale row's zero of integer quads, [BN, 1] in CT: int4's biased like the codes (`int4_zero`),
    int8's centered like them (`int8_zero`)."""
    if WTYPE == 1:
        z = int8_zero(zero_ptrs, n_mask, HAS_ZP, CT, BLOCK_N)
    else:
        z = int4_zero(zero_ptrs, n_mask, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)
    return z


@triton.jit
def _int_group(s_base, s_pairs, z_base, row, n_mask, pair_mask, WTYPE: tl.constexpr, HAS_ZP: tl.constexpr,
               CODE_OFFSET: tl.constexpr, CT: tl.constexpr, BLOCK_N: tl.constexpr, SCALE_PAIRS: tl.constexpr):
    """(scale, zero) of the scale row at element offset `row`, [BN, 1] in CT (the zero: `_int_zero`).
    SCALE_PAIRS: the scales read from s_pairs as int32 words of two rows' scales (`paired_scales`), a
    load the pipeline stages with cp.async (4 bytes or more), where a thread's share of a plain row is
    one 2-byte scale, loaded and waited for in its K tile."""
    if SCALE_PAIRS:
        s = paired_scales(tl.load(s_pairs + row // 2, mask=pair_mask, other=0), s_base.dtype.element_ty)
    else:
        s = tl.load(s_base + row, mask=n_mask, other=0.0)
    # Through fp32: the interpreter mishandles a direct bf16 -> fp16 cast.
    s = tl.expand_dims(s.to(tl.float32).to(CT), 1)
    return s, _int_zero(z_base + row, n_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)


@triton.jit
def _wgemm_rows(
    a_ptr, a_scale_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, fin_ptr, arrivals_ptr,
    pid_m, pid_n, e, kt0, kt1, N, K, num_valid, expected, alpha, limit,
    stride_am, stride_ak, stride_asm, stride_ask, stride_be, stride_bk, stride_bn, stride_bt,
    stride_se, stride_sk, stride_sn, stride_biase, stride_cm, stride_fm,
    GROUP: tl.constexpr, WTYPE: tl.constexpr, A_SCALE: tl.constexpr, W_SCALE_PER_N: tl.constexpr,
    HAS_ZP: tl.constexpr, CODE_OFFSET: tl.constexpr, HAS_BIAS: tl.constexpr, A_ROWS_DIV: tl.constexpr,
    MUL_ROUTED: tl.constexpr, REDUCE_TOPK: tl.constexpr, SINK: tl.constexpr, ACT: tl.constexpr,
    GATE_UP_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr, UPCAST: tl.constexpr, DIRECT: tl.constexpr, QUADS: tl.constexpr,
    PTX: tl.constexpr, POST_SCALE: tl.constexpr, FOLDED_SCALE: tl.constexpr, K_TAIL: tl.constexpr,
    ROWS: tl.constexpr, TAIL: tl.constexpr, ONE_DOT: tl.constexpr, SCALE_PAIRS: tl.constexpr, ROW_SCALE: tl.constexpr,
    trace_ptr, TRACE: tl.constexpr,
):
    """`_moe_wgemm_kernel`'s product and sink over the first ROWS pairs of block pid_m (expert e,
    N tile pid_n, K tiles [kt0, kt1)), and with TAIL over the next block's first TAIL pairs too
    (quads: a second accumulator fed by the same dequantized weights). ROW_SCALE (integer quads with
    one scale row for all of K, per channel): the codes less their zero points, exact in CT, go
    unscaled into the dots, and the sums take the scale once after the K loop, where scaling per
    weight costs a multiply per weight pair and a scale load per K tile."""
    ids = _block_ids(sorted_ids_ptr, pid_m, num_valid, DIRECT, BLOCK_M, ROWS)
    row_mask = ids < num_valid
    out_rows = (ids // REDUCE_TOPK).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    a_rows = (ids // A_ROWS_DIV).to(tl.int64)
    sink_args = (a_scale_ptr, s_ptr, bias_ptr, c_ptr, topk_w_ptr, fin_ptr, arrivals_ptr, pid_n, N, expected, alpha, limit,
                 stride_asm, stride_se, stride_sn, stride_biase, stride_cm, stride_fm)

    # Dequantized weights' type: the activations' (16-bit paths); fp32 under the CPU interpreter,
    # whose bf16 dot is wrong.
    CT: tl.constexpr = tl.float32 if UPCAST else a_ptr.dtype.element_ty
    # MXFP4: e2m1 values are scaled in FT, which holds every e8m0 scale (fp16 does not), after an
    # unpack in bf16 (PTX) or FT.
    FT: tl.constexpr = tl.bfloat16 if CT == tl.bfloat16 else tl.float32  # noqa: SIM300 (CT: compile-time dtype)
    UNPACK_T: tl.constexpr = tl.bfloat16 if PTX else FT
    tl.static_assert(SWAP_AB == (QUADS or WTYPE == 0) or WTYPE == 2,  # noqa: SIM300
                     "4-bit weights and quads run swapped, canonical int8 not, fp8 either way")
    a_base = a_ptr + a_rows[:, None] * stride_am
    b_base = b_ptr + e * stride_be + offs_n[None, :] * stride_bn
    bt_base = b_ptr + e * stride_be + offs_n[:, None] * stride_bn
    s_base = s_ptr + e * stride_se + offs_n * stride_sn
    z_base = z_ptr + e * stride_se + offs_n * stride_sn
    if SCALE_PAIRS:  # the launch checked: 16-bit scales, unit N stride, rows and N even, 4-byte aligned
        offs_pair = tl.arange(0, BLOCK_N // 2)
        s_pairs = (s_ptr + e * stride_se + pid_n * BLOCK_N).to(tl.pointer_type(tl.int32), bitcast=True) + offs_pair
        pair_mask = pid_n * BLOCK_N + 2 * offs_pair < N
    else:
        s_pairs, pair_mask = s_base, n_mask  # unused
    if SWAP_AB:
        acc_t = tl.zeros((BLOCK_N, ROWS), dtype=tl.float32)
    else:
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)

    if QUADS:
        # out^T = W . X^T: the dequantized weights are the MMA's A operand, which Hopper's wgmma
        # reads from registers, and the few token rows sit on the MMA's narrow N side instead of
        # padding its 64-row M side.
        QK: tl.constexpr = BLOCK_K // 4
        offs_q = tl.arange(0, QK)
        if TAIL > 0:
            tail_ids = tl.load(sorted_ids_ptr + (pid_m + 1) * BLOCK_M + tl.arange(0, TAIL))
            tail_mask = tail_ids < num_valid
            tail_a_rows = (tail_ids // A_ROWS_DIV).to(tl.int64)
            tail_base = a_ptr + tail_a_rows[:, None] * stride_am
            tail_acc_t = tl.zeros((BLOCK_N, TAIL), dtype=tl.float32)
        if ROW_SCALE:
            tl.static_assert((WTYPE == 0 or WTYPE == 1) and not POST_SCALE, "one scale row: integer quads")
            row_zero = _int_zero(z_base, n_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)
        if POST_SCALE == 2:
            s_ahead = tl.load(s_base + (kt0 * BLOCK_K // GROUP) * stride_sk, mask=n_mask, other=0.0)
        for kt in range(kt0, kt1):
            k0 = kt * BLOCK_K
            if POST_SCALE == 2:
                # The tile's scales were asked for one tile ahead: the pipeliner stages only what feeds
                # the dots, so a scale loaded in its own tile is a DRAM round trip the loop waits for
                # (the last tile asks for its own again: no read past the split).
                s_tile = s_ahead
                s_ahead = tl.load(s_base + (tl.minimum(kt + 1, kt1 - 1) * BLOCK_K // GROUP) * stride_sk, mask=n_mask,
                                  other=0.0)
            words = tl.load(bt_base + kt * stride_bt + offs_q[None, :] * stride_bk, mask=n_mask[:, None], other=0)
            if WTYPE == 3:
                tl.static_assert(GROUP == QK, "MXFP4: one scale group per quarter")
                values = unpack_e2m1_quads(words, UNPACK_T, PTX)
            elif WTYPE == 1:
                v0, v1, v2, v3 = unpack_byte_quads(words, CT, PTX)
            else:
                v0, v1, v2, v3 = unpack_quads(words, CT, PTX)
            k = k0 + offs_q
            a_ptrs = a_base + k[None, :] * stride_ak
            k_tile = k0 + tl.arange(0, BLOCK_K)
            g = (k0 // GROUP) * stride_sk
            if POST_SCALE:
                tl.static_assert(WTYPE == 0 or WTYPE == 1, "scaled after the dots: integer tiles inside one scale group")
                # The tile lies in one scale group: the zero point is subtracted in CT (exact), and the
                # scale multiplies the tile's fp32 partial product, once per output instead of per weight.
                z = _int_zero(z_base + g, n_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)
                if WTYPE == 1 and not HAS_ZP:  # centered codes: nothing to subtract
                    d0, d1, d2, d3 = v0, v1, v2, v3
                else:
                    d0, d1, d2, d3 = v0 - z, v1 - z, v2 - z, v3 - z
                if ONE_DOT:
                    part = _dot_at(_quarters_as_tile(d0, d1, d2, d3), a_base + k_tile[None, :] * stride_ak, row_mask,
                                   k_tile, K, tl.zeros((BLOCK_N, ROWS), dtype=tl.float32), CT, K_TAIL)
                else:
                    part = _dot_at(d0, a_ptrs, row_mask, k, K, tl.zeros((BLOCK_N, ROWS), dtype=tl.float32), CT, K_TAIL)
                    part = _dot_at(d1, a_ptrs + QK * stride_ak, row_mask, k + QK, K, part, CT, K_TAIL)
                    part = _dot_at(d2, a_ptrs + 2 * QK * stride_ak, row_mask, k + 2 * QK, K, part, CT, K_TAIL)
                    part = _dot_at(d3, a_ptrs + 3 * QK * stride_ak, row_mask, k + 3 * QK, K, part, CT, K_TAIL)
                if POST_SCALE == 1:
                    s_tile = tl.load(s_base + g, mask=n_mask, other=0.0)
                acc_t += part * tl.expand_dims(s_tile.to(tl.float32), 1)
            else:
                if ROW_SCALE:
                    values, zeros = (v0, v1, v2, v3), (row_zero, row_zero, row_zero, row_zero)
                    scales = zeros  # unused
                elif WTYPE == 0 or WTYPE == 1:
                    s0, z0 = _int_group(s_base, s_pairs, z_base, g, n_mask, pair_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT,
                                        BLOCK_N, SCALE_PAIRS)
                    if GROUP >= BLOCK_K:  # the tile lies in one scale group: one load serves its quarters
                        s1, z1, s2, z2, s3, z3 = s0, z0, s0, z0, s0, z0
                    elif GROUP == 2 * QK:  # two groups, a pair of quarters each
                        g = ((k0 + 2 * QK) // GROUP) * stride_sk
                        s2, z2 = _int_group(s_base, s_pairs, z_base, g, n_mask, pair_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT,
                                            BLOCK_N, SCALE_PAIRS)
                        s1, z1, s3, z3 = s0, z0, s2, z2
                    else:
                        g = ((k0 + QK) // GROUP) * stride_sk
                        s1, z1 = _int_group(s_base, s_pairs, z_base, g, n_mask, pair_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT,
                                            BLOCK_N, SCALE_PAIRS)
                        g = ((k0 + 2 * QK) // GROUP) * stride_sk
                        s2, z2 = _int_group(s_base, s_pairs, z_base, g, n_mask, pair_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT,
                                            BLOCK_N, SCALE_PAIRS)
                        g = ((k0 + 3 * QK) // GROUP) * stride_sk
                        s3, z3 = _int_group(s_base, s_pairs, z_base, g, n_mask, pair_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT,
                                            BLOCK_N, SCALE_PAIRS)
                    # Codes and zeros are small integers (int4 below 16, int8 centered within +-255): the
                    # subtraction is exact in CT, so the only rounding is the scale's multiply, as in the reference.
                    values, scales, zeros = (v0, v1, v2, v3), (s0, s1, s2, s3), (z0, z1, z2, z3)
                else:
                    scales, zeros = values, values  # unused (MXFP4 scales by its exponent words)
                if WTYPE == 3:
                    # Quarter j is scale group j (32 k), its e8m0 exponents in the tile's words
                    # (`_layouts.pack_e8m0_tiles`): one 4-byte load per row, which the pipeline prefetches
                    # with the codes (single bytes it cannot: they were loaded, and waited for, per quarter).
                    exp_words = tl.load(s_base + kt * stride_sk, mask=n_mask, other=0)
                else:
                    exp_words = n_mask  # unused
                if ONE_DOT:
                    w_tile = _quarters_as_tile(
                        _quarter_weights(0, values, scales, zeros, exp_words, WTYPE, HAS_ZP, FOLDED_SCALE, FT, CT,
                                         ROW_SCALE),
                        _quarter_weights(1, values, scales, zeros, exp_words, WTYPE, HAS_ZP, FOLDED_SCALE, FT, CT,
                                         ROW_SCALE),
                        _quarter_weights(2, values, scales, zeros, exp_words, WTYPE, HAS_ZP, FOLDED_SCALE, FT, CT,
                                         ROW_SCALE),
                        _quarter_weights(3, values, scales, zeros, exp_words, WTYPE, HAS_ZP, FOLDED_SCALE, FT, CT,
                                         ROW_SCALE))
                    acc_t = _dot_at(w_tile, a_base + k_tile[None, :] * stride_ak, row_mask, k_tile, K, acc_t, CT, K_TAIL)
                    if TAIL > 0:
                        tail_acc_t = _dot_at(w_tile, tail_base + k_tile[None, :] * stride_ak, tail_mask, k_tile, K,
                                             tail_acc_t, CT, K_TAIL)
                else:
                    for j in tl.static_range(4):
                        w = _quarter_weights(j, values, scales, zeros, exp_words, WTYPE, HAS_ZP, FOLDED_SCALE, FT, CT,
                                             ROW_SCALE)
                        acc_t = _dot_at(w, a_ptrs + j * QK * stride_ak, row_mask, k + j * QK, K, acc_t, CT, K_TAIL)
                        if TAIL > 0:
                            tail_acc_t = _dot_at(w, tail_base + (k + j * QK)[None, :] * stride_ak, tail_mask,
                                                 k + j * QK, K, tail_acc_t, CT, K_TAIL)
        if ROW_SCALE:
            row_scale = tl.expand_dims(tl.load(s_base, mask=n_mask, other=0.0).to(tl.float32), 1)
            acc_t *= row_scale
            if TAIL > 0:
                tail_acc_t *= row_scale
        acc = tl.trans(acc_t)
        if TAIL > 0:
            _finish_rows(tl.trans(tail_acc_t), tail_ids, tail_mask, (tail_ids // REDUCE_TOPK).to(tl.int64),
                         tail_a_rows, e, kt0, offs_n, n_mask, *sink_args, A_SCALE, W_SCALE_PER_N, HAS_BIAS,
                         MUL_ROUTED, SINK, ACT, GATE_UP_CHUNK, BLOCK_N)
    elif WTYPE == 0:
        # int4 halves (a K the quads cannot pad), swapped as the quads: two dots over K halves.
        HALF: tl.constexpr = BLOCK_K // 2
        offs_h = tl.arange(0, HALF)
        for kt in range(kt0, kt1):
            k0 = kt * BLOCK_K
            a_lo = tl.load(a_base + (k0 + offs_h)[None, :] * stride_ak, mask=row_mask[:, None], other=0.0)
            a_hi = tl.load(a_base + (k0 + HALF + offs_h)[None, :] * stride_ak, mask=row_mask[:, None], other=0.0)
            g_lo = (k0 // GROUP) * stride_sk
            g_hi = ((k0 + HALF) // GROUP) * stride_sk
            packed = tl.load(bt_base + kt * stride_bt + offs_h[None, :] * stride_bk, mask=n_mask[:, None], other=0)
            w_lo = dequantize(packed & 0xF, s_base + g_lo, z_base + g_lo, n_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT, 0,
                               PTX)
            w_hi = dequantize(packed >> 4, s_base + g_hi, z_base + g_hi, n_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT, 0,
                               PTX)
            acc_t = tl.dot(w_lo, tl.trans(a_lo.to(CT)), acc_t)
            acc_t = tl.dot(w_hi, tl.trans(a_hi.to(CT)), acc_t)
        acc = tl.trans(acc_t)
    elif SWAP_AB:
        # fp8 swapped (a few rows per block): out^T = W . X^T with both operands K-major, as Hopper's fp8
        # wgmma reads them from shared memory; the weight tile is its 64-row side, the token rows its
        # narrow N side. Unswapped, a block below 64 rows runs the fp8 dot as fp16 mma.sync, converting
        # every code first.
        offs_k = tl.arange(0, BLOCK_K)
        for kt in range(kt0, kt1):
            k0 = kt * BLOCK_K
            # No fill values, as below: masked rows and columns are never stored.
            codes_t = tl.load(bt_base + (k0 + offs_k)[None, :] * stride_bk, mask=n_mask[:, None])
            a = tl.load(a_base + (k0 + offs_k)[None, :] * stride_ak, mask=row_mask[:, None])
            # Each K tile's product promoted to the fp32 accumulator (see the unswapped K loop).
            part = tl.dot(codes_t, tl.trans(a))
            if A_SCALE == 2:
                acc_t += _fp8_block_scaled(part, k0, a_scale_ptr, s_ptr, a_rows, row_mask, e, pid_n, offs_n, n_mask,
                                           stride_asm, stride_ask, stride_se, stride_sn, stride_sk, BLOCK_N, True)
            else:
                acc_t += part
        acc = tl.trans(acc_t)
    else:
        offs_k = tl.arange(0, BLOCK_K)
        for kt in range(kt0, kt1):
            k0 = kt * BLOCK_K
            # No fill values: masked rows and columns are never stored, and an fp8 fill is not allowed.
            codes = tl.load(b_base + (k0 + offs_k)[:, None] * stride_bk, mask=n_mask[None, :])
            a = tl.load(a_base + (k0 + offs_k)[None, :] * stride_ak, mask=row_mask[:, None])
            if WTYPE == 1:
                g = (k0 // GROUP) * stride_sk
                w = dequantize(codes, s_base + g, z_base + g, n_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT, 1, PTX)
                acc = tl.dot(a.to(CT), w, acc)
            elif A_SCALE == 2:
                acc += _fp8_block_scaled(tl.dot(a, codes), k0, a_scale_ptr, s_ptr, a_rows, row_mask, e, pid_n, offs_n,
                                         n_mask, stride_asm, stride_ask, stride_se, stride_sn, stride_sk, BLOCK_N, False)
            else:
                # Summed outside the dot: Hopper's fp8 MMA accumulates in reduced precision, so each
                # K tile's partial result is promoted to the fp32 accumulator (as DeepSeek-V3 does).
                acc += tl.dot(a, codes)

    trace.mark_products_done(trace_ptr, TRACE)
    # A direct launch's GEMM1 finishes its one row (the activation) by its last contributor alone; GEMM2's
    # finish is a copy, and there the one-row count measured slower (docs/design/triton-gemm-quantized.md).
    _finish_rows(acc, ids, row_mask, out_rows, a_rows, e, kt0, offs_n, n_mask, *sink_args, A_SCALE, W_SCALE_PER_N,
                 HAS_BIAS, MUL_ROUTED, SINK, ACT, GATE_UP_CHUNK, BLOCK_N, pid_m // REDUCE_TOPK, DIRECT and ACT != 0)


@triton.jit
def _fp8_block_scaled(part, k0, a_scale_ptr, s_ptr, a_rows, row_mask, e, pid_n, offs_n, n_mask, stride_asm, stride_ask,
                      stride_se, stride_sn, stride_sk, BLOCK_N: tl.constexpr, SWAPPED: tl.constexpr):
    """An fp8 K tile's product [rows, BLOCK_N] (SWAPPED: [BLOCK_N, rows]) times the scales of its
    128x128 weight blocks and 1x128 activation groups (BLOCK_K divides 128)."""
    kb = k0 // 128
    a_s = tl.load(a_scale_ptr + a_rows * stride_asm + kb * stride_ask, mask=row_mask, other=0.0)
    if 128 % BLOCK_N == 0:
        # The tile's columns lie in one weight block: its scale is one number per K tile, folded into
        # the activation scales (one multiply per output instead of two).
        w_s = tl.load(s_ptr + e * stride_se + (pid_n * BLOCK_N // 128) * stride_sn + kb * stride_sk)
        if SWAPPED:
            scaled = part * (a_s * w_s)[None, :]
        else:
            scaled = part * (a_s * w_s)[:, None]
    else:
        w_s = tl.load(s_ptr + e * stride_se + (offs_n // 128) * stride_sn + kb * stride_sk, mask=n_mask, other=0.0)
        if SWAPPED:
            scaled = part * w_s[:, None] * a_s[None, :]
        else:
            scaled = part * a_s[:, None] * w_s[None, :]
    return scaled


@triton.jit
def _finish_rows(acc, ids, row_mask, out_rows, a_rows, e, kt0, offs_n, n_mask, a_scale_ptr, s_ptr, bias_ptr, c_ptr,
                 topk_w_ptr, fin_ptr, arrivals_ptr, pid_n, N, expected, alpha, limit, stride_asm, stride_se, stride_sn,
                 stride_biase, stride_cm, stride_fm, A_SCALE: tl.constexpr, W_SCALE_PER_N: tl.constexpr,
                 HAS_BIAS: tl.constexpr, MUL_ROUTED: tl.constexpr, SINK: tl.constexpr, ACT: tl.constexpr,
                 GATE_UP_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, row0=0, ONE_ROW: tl.constexpr = False):
    """A [rows, BLOCK_N] product of pairs `ids` (row_mask: the valid ones; their output rows and
    activation rows): activation scale, bias (once per output, by the first K-split), router
    weight, then the sink. ONE_ROW: only the first row is valid (a direct launch's pair), its
    output row row0."""
    if A_SCALE == 1:
        a_s = tl.load(a_scale_ptr + a_rows * stride_asm, mask=row_mask, other=0.0)
        if W_SCALE_PER_N:
            w_s = tl.load(s_ptr + e * stride_se + offs_n * stride_sn, mask=n_mask, other=0.0)
            acc = acc * a_s[:, None] * w_s[None, :]
        else:
            acc = acc * (a_s * tl.load(s_ptr + e * stride_se))[:, None]
    if HAS_BIAS:  # noqa: SIM102 (HAS_BIAS is a compile-time switch, kt0 a run-time value)
        if kt0 == 0:  # once per output, not once per K-split
            acc += tl.load(bias_ptr + e * stride_biase + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if MUL_ROUTED:
        acc *= tl.load(topk_w_ptr + ids, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    if SINK == 0:
        _store_finished(c_ptr, acc, out_rows, row_mask, pid_n, N, stride_cm, alpha, limit, ACT, GATE_UP_CHUNK,
                        BLOCK_N)
    else:
        mask = row_mask[:, None] & n_mask[None, :]
        tl.atomic_add(c_ptr + out_rows[:, None] * stride_cm + offs_n[None, :], acc, mask=mask, sem="relaxed")
        if SINK == 2:
            _arrive(fin_ptr, c_ptr, arrivals_ptr, expected, out_rows, row_mask, offs_n, n_mask, pid_n, N, stride_cm,
                    stride_fm, alpha, limit, ACT, GATE_UP_CHUNK, BLOCK_N, row0, ONE_ROW)


@triton.jit
def _zero_kernel(ptr, numel, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # Waits like any dependent launch: the buffer may reuse memory the kernel ahead still uses.
    wait_then_release(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offs, tl.zeros((BLOCK,), tl.int32), mask=offs < numel)
