"""The bf16/fp16 grouped GEMM of `_kernel.moe_gemm_kernel` in Gluon for Hopper: warp-specialized
asynchronous wgmma with both operands in shared memory.

Same contract as `moe_gemm_kernel` over align-sorted rows (GEMM1: gathered token rows, canonical
w13 whose rows [0, N) are the gate and [N, 2N) the up projection, the activation in the epilogue;
GEMM2: bias, router weight, one stored row per (token, slot), zeros for other ranks' blocks); its
torch twin is `moe_triton.gemm.grouped_gemm_torch`.

The product is computed transposed, out^T = W . X^T: a tile of BLOCK_N weight rows is wgmma's A
operand (M side) and the block's gathered token rows its B operand (N side), both read from shared
memory. Two consumer warpgroups (`gl.warp_specialize`, 8 warps at 240 registers) each own half of
the weight rows; each loads its own weight rows (the copy engine, through a descriptor) and half
the block's token rows (cp.async: a gather the copy engine cannot do on Hopper) of every 64-wide
K tile, STAGES - 1 tiles ahead, into a ring the two share (a stage's `ready` mbarrier: both
warpgroups' weight bytes and all 256 threads' row copies landed; `empty`: both warpgroups' MMAs on
it retired), and runs its own epilogue. A block with at most BLOCK_M / 2 valid rows (an expert's
last) runs MMAs over half the tokens. GROUP_M orders the programs as `moe_gemm_kernel` does
(`_kernel.grouped_tile`).

`moe_gemm_wgmma_persistent_kernel` (`TileConfig.persistent`) runs the same tiles as one program
per SM: a loader warpgroup takes tiles from a counter in the launch order and fills the ring, so
a tile's epilogue overlaps the next tile's copies (a counter, not round-robin: programs that
share an expert's weight tile stay together).
With TAIL (16 or 32) a full block takes in its expert's last block when that holds at most TAIL
rows (a second accumulator on the same weight tiles; the loader copies those rows beside the
block's), so the expert's weights are read once less. Measurements: docs/design/triton-gemm-16bit.md.

Both kernels' epilogues compute in the accumulator's layout and move only the 16-bit results to
the store layout: the shared memory a 256 x 128 tile's four stages leave also holds a tail ring.

Gated GEMM1: a warpgroup's first half of ring rows are gate rows and its second half the matching
up rows, so one thread holds both sums of an output (split in `_store`).

NVIDIA Hopper (sm_90) only; the CPU interpreter cannot run Gluon: CI compiles it for sm_90 and the
GPU suite checks it against the fp32 reference.
"""

from __future__ import annotations

__all__ = ["BLOCK_K", "LOADER_REGS", "PERSISTENT_MAXNREG", "PERSISTENT_REGS", "REGS", "moe_gemm_wgmma_kernel",
           "moe_gemm_wgmma_persistent_kernel"]

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from moe_triton._common.activation import activate
from moe_triton._common.wgmma import EPILOGUE_LAYOUT, tail_role
from moe_triton.gemm_details._kernel import grouped_tile

# Renamed after Triton 3.6 (async_copy.async_load, tma.async_load).
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_warpgroup_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # renamed after Triton 3.6

BLOCK_K = gl.constexpr(64)  # one 128-byte swizzle line of 16-bit values per row
# Registers per thread of both partitions (8 warps: 64K registers): a 128 x 128 fp32 accumulator
# takes 128 of them, and the MMA loop stays asynchronous only with room to spare.
REGS = 240
# Stores: 8 neighbouring output columns (16 bytes) per thread, threads and warps across the tokens.
_STORE_LAYOUT = gl.constexpr(gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1]))


@gluon.jit
def _allocate_ring(a_ptr, w_desc, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   READY_COUNT: gl.constexpr):
    """The ring of STAGES K tiles (token rows of a_ptr's dtype, weight rows in w_desc's layout) and
    its barriers: `ready` completes on READY_COUNT arrivals, `empty` on one per consumer warpgroup.
    (Triton 3.6 cannot pass a layout to a jit function: it is read from the descriptor here.)"""
    CT: gl.constexpr = a_ptr.dtype.element_ty
    x_ring = gl.allocate_shared_memory(CT, [STAGES, BLOCK_M, BLOCK_K],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], CT))
    w_ring = gl.allocate_shared_memory(CT, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=READY_COUNT)
        mbarrier.init(empty.index(s), count=2)
    return x_ring, w_ring, ready, empty


@gluon.jit
def _copy_share(a_ptr, sorted_ids_ptr, pid_m, num_valid, stride_am, WG: gl.constexpr, A_ROW_DIV: gl.constexpr,
                BLOCK_M: gl.constexpr):
    """Pointers (K tile 0) and row mask of warpgroup WG's share of the block's gathered rows: rows
    [WG BLOCK_M / 2, (WG + 1) BLOCK_M / 2)."""
    cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    X_ROWS: gl.constexpr = BLOCK_M // 2
    k = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, cp))
    ids = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + WG * X_ROWS + gl.arange(0, X_ROWS, layout=gl.SliceLayout(1, cp)))
    # stride_am % 8 == 0 (checked at launch), written so that Triton sees 16-byte pieces where its
    # specialization (multiples of 16) cannot tell.
    x_ptrs = a_ptr + (ids // A_ROW_DIV).to(gl.int64)[:, None] * ((stride_am // 8) * 8) + k[None, :]
    return x_ptrs, (ids < num_valid)[:, None], k


@gluon.jit
def _issue_tile(x_ring, w_ring, ready, stage, kt, w_desc, w_row0, N, x_ptrs, x_ok, k, K, WG: gl.constexpr,
                GATED: gl.constexpr, WG_ROWS: gl.constexpr, BLOCK_M: gl.constexpr, K_TAIL: gl.constexpr):
    """Warpgroup WG's share of K tile kt into ring stage `stage`: its weight rows by the copy engine
    (gated: the gate rows from w_row0, the up rows from w_row0 + N), its token rows by cp.async
    (masked copies zero-fill); both arrive on the stage's `ready` barrier."""
    X_ROWS: gl.constexpr = BLOCK_M // 2
    k0 = kt * BLOCK_K
    bar = ready.index(stage)
    w_dst = w_ring.index(stage).slice(WG * WG_ROWS, WG_ROWS)
    mbarrier.expect(bar, WG_ROWS * BLOCK_K * 2)
    if GATED:
        HALF: gl.constexpr = WG_ROWS // 2
        _tma_load(w_desc, [w_row0, k0], bar, w_dst.slice(0, HALF))
        _tma_load(w_desc, [w_row0 + N, k0], bar, w_dst.slice(HALF, HALF))
    else:
        _tma_load(w_desc, [w_row0, k0], bar, w_dst)
    if K_TAIL:  # K % 8 == 0 (checked at launch): the mask stays whole over each 16-byte piece
        x_mask = x_ok & (k0 + k < (K // 8) * 8)[None, :]
    else:
        x_mask = x_ok
    _async_load(x_ring.index(stage).slice(WG * X_ROWS, X_ROWS), x_ptrs + k0, mask=x_mask)
    async_copy.mbarrier_arrive(bar, increment_count=False)


@gluon.jit
def _consume(WG: gl.constexpr, x_ring, w_ring, ready, empty, a_ptr, w_desc, bias_ptr, c_ptr, topk_weights_ptr,
             sorted_ids_ptr, e, pid_m, pid_n, narrow, N, K, num_valid, alpha, limit, stride_am, stride_bias_e,
             stride_cm, A_ROW_DIV: gl.constexpr, GATED: gl.constexpr, ACT: gl.constexpr, HAS_BIAS: gl.constexpr,
             MUL_WEIGHT: gl.constexpr, WG_ROWS: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
             K_TAIL: gl.constexpr):
    """Consumer warpgroup WG: its copies and MMAs over the K tiles, then its epilogue."""
    if GATED:  # the first gate row of the warpgroup's output columns in the [E * 2N, K] view
        w_row0 = (e * (2 * N) + pid_n * WG_ROWS + WG * (WG_ROWS // 2)).to(gl.int32)
    else:
        w_row0 = (e * N + pid_n * (2 * WG_ROWS) + WG * WG_ROWS).to(gl.int32)
    x_ptrs, x_ok, k = _copy_share(a_ptr, sorted_ids_ptr, pid_m, num_valid, stride_am, WG, A_ROW_DIV, BLOCK_M)
    copy = (w_desc, w_row0, N, x_ptrs, x_ok, k, K)
    k_tiles = gl.cdiv(K, BLOCK_K)
    for p in gl.static_range(STAGES - 1):  # fresh stages: no wait
        if p < k_tiles:
            _issue_tile(x_ring, w_ring, ready, p, p, *copy, WG, GATED, WG_ROWS, BLOCK_M, K_TAIL)
    if narrow:
        _store(WG, _mma_loop(WG, x_ring, w_ring, ready, empty, k_tiles, copy, GATED, WG_ROWS, BLOCK_M, BLOCK_M // 2,
                             STAGES, K_TAIL),
               bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, e, pid_m, pid_n, N, num_valid, alpha, limit,
               stride_bias_e, stride_cm, GATED, ACT, HAS_BIAS, MUL_WEIGHT, BLOCK_M)
    else:
        _store(WG, _mma_loop(WG, x_ring, w_ring, ready, empty, k_tiles, copy, GATED, WG_ROWS, BLOCK_M, BLOCK_M,
                             STAGES, K_TAIL),
               bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, e, pid_m, pid_n, N, num_valid, alpha, limit,
               stride_bias_e, stride_cm, GATED, ACT, HAS_BIAS, MUL_WEIGHT, BLOCK_M)


@gluon.jit
def _mma_loop(WG: gl.constexpr, x_ring, w_ring, ready, empty, k_tiles, copy, GATED: gl.constexpr,
              WG_ROWS: gl.constexpr, BLOCK_M: gl.constexpr, MMA_N: gl.constexpr, STAGES: gl.constexpr,
              K_TAIL: gl.constexpr):
    """The warpgroup's [WG_ROWS, MMA_N] fp32 product over every K tile: one tile's MMAs in flight
    while the next is awaited; tile i + STAGES - 1 refills the stage of tile i - 1 once both
    warpgroups handed it back."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, MMA_N, 16])
    acc = gl.zeros([WG_ROWS, MMA_N], gl.float32, layout=mma)
    r0: gl.constexpr = WG * WG_ROWS
    gl.assume(k_tiles > 0)  # a layer has K >= 1; a possibly empty loop makes ptxas serialize wgmma
    for i in range(k_tiles):
        stage = i % STAGES
        mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
        fence_async_shared()  # cp.async wrote the stage's token rows; wgmma reads them through the async proxy
        acc = warpgroup_mma(w_ring.index(stage).slice(r0, WG_ROWS), x_ring.index(stage).slice(0, MMA_N).permute((1, 0)),
                            acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # tile i - 1's MMAs retired
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=i > 0)
        ahead = i + STAGES - 1
        if ahead < k_tiles:
            refill = ahead % STAGES
            mbarrier.wait(empty.index(refill), ((ahead // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
            _issue_tile(x_ring, w_ring, ready, refill, ahead, *copy, WG, GATED, WG_ROWS, BLOCK_M, K_TAIL)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _columns(WG: gl.constexpr, rows, pid_n, N, GATED: gl.constexpr, WG_ROWS: gl.constexpr):
    """Weight rows (b0, b1) of a consumer's two halves of rows and their bounds; col0: the output
    columns of the first half (gated: of the activation's result)."""
    HALF: gl.constexpr = WG_ROWS // 2
    if GATED:  # halves: the gate and up sums of output columns col0
        col0 = pid_n * WG_ROWS + WG * HALF + rows
        return col0, col0 + N, col0 < N, col0 < N, col0
    col0 = pid_n * (2 * WG_ROWS) + WG * WG_ROWS + rows  # halves: output columns col0 and col0 + HALF
    return col0, col0 + HALF, col0 < N, col0 + HALF < N, col0


@gluon.jit
def _store(WG: gl.constexpr, acc, bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, e, pid_m, pid_n, N, num_valid,
           alpha, limit, stride_bias_e, stride_cm, GATED: gl.constexpr, ACT: gl.constexpr, HAS_BIAS: gl.constexpr,
           MUL_WEIGHT: gl.constexpr, BLOCK_M: gl.constexpr):
    """The warpgroup's epilogue, `moe_gemm_kernel`'s: router weight (GEMM1: before the bias), bias,
    activation or router weight (GEMM2: after the bias), stored at row = sorted id. The arithmetic
    runs in the accumulator's own layout; only the 16-bit results move to the store layout (moving
    the fp32 sums took 28 KB more shared memory: the persistent kernel's tail ring)."""
    out_l: gl.constexpr = _STORE_LAYOUT
    WG_ROWS: gl.constexpr = acc.shape[0]
    HALF: gl.constexpr = WG_ROWS // 2
    MMA_N: gl.constexpr = acc.shape[1]
    CT: gl.constexpr = c_ptr.dtype.element_ty
    if WG_ROWS == 128:  # rows r and r + 64 are already one thread's (wgmma's M repeats every 64 rows)
        res0, res1 = acc.reshape([2, HALF, MMA_N]).permute((1, 2, 0)).split()
    else:  # EPILOGUE_LAYOUT repeats every 32 rows: rows r and r + 32 become one thread's there
        res0, res1 = gl.convert_layout(acc, EPILOGUE_LAYOUT).reshape([2, HALF, MMA_N]).permute((1, 2, 0)).split()
    hl: gl.constexpr = res0.type.layout
    ids = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + gl.arange(0, MMA_N, layout=gl.SliceLayout(0, hl)))
    b0, b1, ok0, ok1, _ = _columns(WG, gl.arange(0, HALF, layout=gl.SliceLayout(1, hl)), pid_n, N, GATED, WG_ROWS)
    if MUL_WEIGHT:
        w = gl.load(topk_weights_ptr + ids, mask=ids < num_valid, other=0.0).to(gl.float32)[None, :]
    if MUL_WEIGHT and ACT != 0:  # weight on the input (Llama4): (w x) W = w (x W)
        res0 *= w
        res1 *= w
    if HAS_BIAS:
        bias_row = bias_ptr + e * stride_bias_e
        res0 += gl.load(bias_row + b0, mask=ok0, other=0.0).to(gl.float32)[:, None]
        res1 += gl.load(bias_row + b1, mask=ok1, other=0.0).to(gl.float32)[:, None]
    ids = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + gl.arange(0, MMA_N, layout=gl.SliceLayout(0, out_l)))
    ids_ok = ids < num_valid
    out_rows = c_ptr + ids.to(gl.int64)[None, :] * stride_cm
    o0, o1, ok0, ok1, col0 = _columns(WG, gl.arange(0, HALF, layout=gl.SliceLayout(1, out_l)), pid_n, N, GATED,
                                      WG_ROWS)
    if GATED:
        y = gl.convert_layout(activate(res0, res1, alpha, limit, ACT).to(CT), out_l)
        gl.store(out_rows + col0[:, None], y, mask=ok0[:, None] & ids_ok[None, :])
    else:
        if ACT != 0:
            res0 = activate(res0, res0, alpha, limit, ACT)
            res1 = activate(res1, res1, alpha, limit, ACT)
        elif MUL_WEIGHT:
            res0 *= w
            res1 *= w
        gl.store(out_rows + o0[:, None], gl.convert_layout(res0.to(CT), out_l), mask=ok0[:, None] & ids_ok[None, :])
        gl.store(out_rows + o1[:, None], gl.convert_layout(res1.to(CT), out_l), mask=ok1[:, None] & ids_ok[None, :])


@gluon.jit
def moe_gemm_wgmma_kernel(
    a_ptr, w_desc, bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, expert_ids_ptr, total_ptr,
    N, K, EM, num_valid, alpha, limit,
    stride_am, stride_bias_e, stride_cm,
    A_ROW_DIV: gl.constexpr,  # GEMM1: top_k (rows of A are tokens); GEMM2: 1 (rows are choices)
    GATED: gl.constexpr,  # w rows [0, N) are the gate, [N, 2N) the up projection
    ACT: gl.constexpr,  # `ActKind` code; NONE marks GEMM2
    HAS_BIAS: gl.constexpr,
    MUL_WEIGHT: gl.constexpr,
    ZERO_FOREIGN: gl.constexpr,  # write zeros for blocks of experts another rank owns
    BLOCK_M: gl.constexpr,  # sorted rows per block: 64 or 128 (wgmma's N side)
    BLOCK_N: gl.constexpr,  # weight rows per program (gated: BLOCK_N / 2 gate rows and their up rows): 128 or 256
    GROUP_M: gl.constexpr,  # row blocks that share weight tiles in the launch order; 1: N tiles first
    STAGES: gl.constexpr,  # ring depth, >= 2
    K_TAIL: gl.constexpr,  # K % BLOCK_K != 0: mask the last tile's columns
    CONSUMER_REGS: gl.constexpr,
):
    """w_desc: the weights viewed [E * rows per expert, K], blocks of the weight rows one copy
    moves (gated BLOCK_N / 4, else BLOCK_N / 2) by BLOCK_K, in the ring's shared layout."""
    gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warpgroup")
    gl.static_assert(BLOCK_N == 128 or BLOCK_N == 256, "two consumer warpgroups of 64 or 128 weight rows")
    gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128, "blocks of 64 or 128 sorted rows")
    WG_ROWS: gl.constexpr = BLOCK_N // 2
    OUT_N: gl.constexpr = BLOCK_N // 2 if GATED else BLOCK_N  # output columns per program
    pid_m, pid_n = grouped_tile(gl.program_id(0), gl.cdiv(EM, BLOCK_M), gl.cdiv(N, OUT_N), GROUP_M)
    if pid_m * BLOCK_M >= gl.load(total_ptr):
        return
    e = gl.load(expert_ids_ptr + pid_m)
    if e < 0:
        if ZERO_FOREIGN:
            zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
            ids = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, zl)))
            cols = pid_n * OUT_N + gl.arange(0, OUT_N, layout=gl.SliceLayout(0, zl))
            gl.store(c_ptr + ids.to(gl.int64)[:, None] * stride_cm + cols[None, :],
                     gl.zeros([BLOCK_M, OUT_N], c_ptr.dtype.element_ty, layout=zl),
                     mask=(ids < num_valid)[:, None] & (cols < N)[None, :])
        return
    # Valid rows are a prefix of the block (the alignment pads each expert's last block).
    narrow = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + BLOCK_M // 2) >= num_valid

    # Every cp.async thread of both warpgroups, and each warpgroup's expected weight bytes.
    x_ring, w_ring, ready, empty = _allocate_ring(a_ptr, w_desc, BLOCK_M, BLOCK_N, STAGES, 256 + 2)
    gl.warp_specialize([
        (_consume, (0, x_ring, w_ring, ready, empty, a_ptr, w_desc, bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr,
                    e, pid_m, pid_n, narrow, N, K, num_valid, alpha, limit, stride_am, stride_bias_e, stride_cm,
                    A_ROW_DIV, GATED, ACT, HAS_BIAS, MUL_WEIGHT, WG_ROWS, BLOCK_M, STAGES, K_TAIL)),
        (_consume, (1, x_ring, w_ring, ready, empty, a_ptr, w_desc, bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr,
                    e, pid_m, pid_n, narrow, N, K, num_valid, alpha, limit, stride_am, stride_bias_e, stride_cm,
                    A_ROW_DIV, GATED, ACT, HAS_BIAS, MUL_WEIGHT, WG_ROWS, BLOCK_M, STAGES, K_TAIL)),
    ], [4], [CONSUMER_REGS])


# The persistent kernel's register plan: 12 warps launched at 168 each (65536 / 384, a multiple of
# 8); the loader warpgroup drops to LOADER_REGS (it holds 8 gathered row pointers per thread; at 64
# ptxas spilled a word), the worker consumer rises to PERSISTENT_REGS, and Triton gives the default
# consumer what is left (208 in Triton 3.9's sm_90 build): no spills, no serialized wgmma (ptxas).
LOADER_REGS = 72
PERSISTENT_REGS = 224
PERSISTENT_MAXNREG = 168


@gluon.jit
def _publish(tile_ids, tile_ready, tile_free, taken, t):
    """The loader hands tile index t (its taken-th) to the consumers, in slot taken % 2."""
    slot = taken % 2
    mbarrier.wait(tile_free.index(slot), ((taken // 2) & 1) ^ 1)  # a fresh barrier passes phase 1
    tile_ids.index(slot).store(gl.full([1], t, gl.int32, gl.BlockedLayout([1], [32], [gl.num_warps()], [0])))
    mbarrier.arrive(tile_ready.index(slot), count=1)


@gluon.jit
def _receive(tile_ids, tile_ready, tile_free, taken):
    """A consumer's taken-th tile index from the loader; the slot is handed back once every warp read it."""
    slot = taken % 2
    mbarrier.wait(tile_ready.index(slot), (taken // 2) & 1)
    t = gl.max(tile_ids.index(slot).load(gl.BlockedLayout([1], [32], [gl.num_warps()], [0])), axis=0)
    _warpgroup_barrier()
    mbarrier.arrive(tile_free.index(slot), count=1)
    return t


@gluon.jit
def _tile_at(t, num_pid_m, num_pid_n, expert_ids_ptr, GROUP_M: gl.constexpr):
    """Row block, column tile and expert of the persistent loop's tile t (every partition derives
    the same sequence)."""
    pid_m, pid_n = grouped_tile(t, num_pid_m, num_pid_n, GROUP_M)
    return pid_m, pid_n, gl.load(expert_ids_ptr + pid_m)


@gluon.jit
def _load_tiles(x_ring, x_tail, w_ring, ready, empty, tile_ids, tile_ready, tile_free, tile_counter_ptr, a_ptr,
                w_desc, sorted_ids_ptr, expert_ids_ptr, num_pid_m, N, K, num_valid, stride_am,
                A_ROW_DIV: gl.constexpr, GATED: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                GROUP_M: gl.constexpr, STAGES: gl.constexpr, K_TAIL: gl.constexpr, TAIL: gl.constexpr):
    """The loader warpgroup: takes the program's next tile from the layer's counter (so the tiles in
    flight stay a window of the launch order, as a hardware-scheduled grid's would, and the
    programs that share an expert's weight tile read it together), hands its index to the
    consumers, and copies its K tiles into the ring as stages are handed back (the next tile's
    first stages land during the consumers' epilogue). Weight rows by the copy engine, the block's
    gathered token rows (and, for a block that absorbs, the next block's first TAIL rows into
    x_tail) by cp.async (each thread's completion arrives on the stage's `ready`)."""
    cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    WG_ROWS: gl.constexpr = BLOCK_N // 2
    OUT_N: gl.constexpr = BLOCK_N // 2 if GATED else BLOCK_N
    k = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, cp))
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, cp))
    if TAIL > 0:  # the rows a block takes in, in the same copy layout
        rows_t = gl.arange(0, TAIL, layout=gl.SliceLayout(1, cp))
    k_tiles = gl.cdiv(K, BLOCK_K)
    num_pid_n = gl.cdiv(N, OUT_N)
    used = 0  # ring stages filled so far: stage used % STAGES, its round used // STAGES
    taken = 0  # tiles taken so far
    t = gl.atomic_add(tile_counter_ptr, 1)
    while t < num_pid_m * num_pid_n:
        _publish(tile_ids, tile_ready, tile_free, taken, t)
        pid_m, pid_n, e = _tile_at(t, num_pid_m, num_pid_n, expert_ids_ptr, GROUP_M)
        taken_in, absorbs = tail_role(pid_m, e, num_pid_m, sorted_ids_ptr, expert_ids_ptr, num_valid, BLOCK_M, TAIL)
        if (e >= 0) & (not taken_in):
            ids = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + rows)
            # stride_am % 8 == 0 (checked at launch), written so that Triton sees 16-byte pieces.
            x_ptrs = a_ptr + (ids // A_ROW_DIV).to(gl.int64)[:, None] * ((stride_am // 8) * 8) + k[None, :]
            x_ok = (ids < num_valid)[:, None]
            if TAIL > 0:
                t_ids = gl.load(sorted_ids_ptr + (pid_m + 1) * BLOCK_M + rows_t, mask=absorbs, other=num_valid)
                t_ptrs = a_ptr + (t_ids // A_ROW_DIV).to(gl.int64)[:, None] * ((stride_am // 8) * 8) + k[None, :]
                t_ok = (t_ids < num_valid)[:, None]
            if GATED:  # consumer j's gate rows from w_row0 + j WG_ROWS / 2, its up rows N further
                w_row0 = (e * (2 * N) + pid_n * WG_ROWS).to(gl.int32)
            else:
                w_row0 = (e * N + pid_n * BLOCK_N).to(gl.int32)
            for kt in range(k_tiles):
                stage = used % STAGES
                mbarrier.wait(empty.index(stage), ((used // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
                k0 = kt * BLOCK_K
                bar = ready.index(stage)
                w_dst = w_ring.index(stage)
                mbarrier.expect(bar, BLOCK_N * BLOCK_K * 2)
                if GATED:
                    Q: gl.constexpr = WG_ROWS // 2
                    _tma_load(w_desc, [w_row0, k0], bar, w_dst.slice(0, Q))
                    _tma_load(w_desc, [w_row0 + N, k0], bar, w_dst.slice(Q, Q))
                    _tma_load(w_desc, [w_row0 + Q, k0], bar, w_dst.slice(WG_ROWS, Q))
                    _tma_load(w_desc, [w_row0 + Q + N, k0], bar, w_dst.slice(WG_ROWS + Q, Q))
                else:
                    _tma_load(w_desc, [w_row0, k0], bar, w_dst.slice(0, WG_ROWS))
                    _tma_load(w_desc, [w_row0 + WG_ROWS, k0], bar, w_dst.slice(WG_ROWS, WG_ROWS))
                if K_TAIL:  # K % 8 == 0 (checked at launch): the mask stays whole over each 16-byte piece
                    x_mask = x_ok & (k0 + k < (K // 8) * 8)[None, :]
                else:
                    x_mask = x_ok
                _async_load(x_ring.index(stage), x_ptrs + k0, mask=x_mask)
                if TAIL > 0:  # noqa: SIM102 (TAIL is a compile-time switch, absorbs a run-time value)
                    if absorbs:
                        if K_TAIL:
                            t_mask = t_ok & (k0 + k < (K // 8) * 8)[None, :]
                        else:
                            t_mask = t_ok
                        _async_load(x_tail.index(stage), t_ptrs + k0, mask=t_mask)
                async_copy.mbarrier_arrive(bar, increment_count=False)
                used += 1
        taken += 1
        t = gl.atomic_add(tile_counter_ptr, 1)
    _publish(tile_ids, tile_ready, tile_free, taken, t)  # past the last tile: the consumers stop


@gluon.jit
def _mma_ring(WG: gl.constexpr, x_ring, x_tail, w_ring, ready, empty, k_tiles, used, WG_ROWS: gl.constexpr,
              MMA_N: gl.constexpr, TAIL_N: gl.constexpr, STAGES: gl.constexpr):
    """The warpgroup's [WG_ROWS, MMA_N] fp32 product over a tile's K tiles, ring stages from `used`
    on, and with TAIL_N the [WG_ROWS, TAIL_N] product of the same weights with x_tail's rows
    (else the first product again): one K tile's MMAs in flight while the next is awaited; each
    stage handed back (`empty`) once both warpgroups' MMAs on it retired."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, MMA_N, 16])
    acc = gl.zeros([WG_ROWS, MMA_N], gl.float32, layout=mma)
    if TAIL_N > 0:
        mma_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, TAIL_N, 16])
        acc_t = gl.zeros([WG_ROWS, TAIL_N], gl.float32, layout=mma_t)
    r0: gl.constexpr = WG * WG_ROWS
    gl.assume(k_tiles > 0)  # a possibly empty loop makes ptxas serialize wgmma
    for i in range(k_tiles):
        stage = (used + i) % STAGES
        mbarrier.wait(ready.index(stage), ((used + i) // STAGES) & 1)
        fence_async_shared()  # cp.async wrote the stage's token rows; wgmma reads them through the async proxy
        w_tile = w_ring.index(stage).slice(r0, WG_ROWS)
        acc = warpgroup_mma(w_tile, x_ring.index(stage).slice(0, MMA_N).permute((1, 0)), acc, is_async=True)
        if TAIL_N > 0:
            acc_t = warpgroup_mma(w_tile, x_tail.index(stage).permute((1, 0)), acc_t, is_async=True)
            acc, acc_t = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_t))  # K tile i - 1's MMAs retired
        else:
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # K tile i - 1's MMAs retired
        mbarrier.arrive(empty.index((used + i + STAGES - 1) % STAGES), count=1, pred=i > 0)
    if TAIL_N > 0:
        acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_t))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        acc_t = acc
    mbarrier.arrive(empty.index((used + k_tiles - 1) % STAGES), count=1)
    return acc, acc_t


@gluon.jit
def _consume_tiles(WG: gl.constexpr, x_ring, x_tail, w_ring, ready, empty, tile_ids, tile_ready, tile_free, bias_ptr, c_ptr,
                   topk_weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_pid_m, N, K, num_valid, alpha, limit,
                   stride_bias_e, stride_cm, GATED: gl.constexpr, ACT: gl.constexpr, HAS_BIAS: gl.constexpr,
                   MUL_WEIGHT: gl.constexpr, ZERO_FOREIGN: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, TAIL: gl.constexpr):
    """Consumer warpgroup WG over the tiles the loader hands it: its MMAs from the ring, then its
    epilogue (`_store`) while the loader fills the ring for the next tile."""
    WG_ROWS: gl.constexpr = BLOCK_N // 2
    OUT_N: gl.constexpr = BLOCK_N // 2 if GATED else BLOCK_N
    k_tiles = gl.cdiv(K, BLOCK_K)
    num_pid_n = gl.cdiv(N, OUT_N)
    used = 0
    taken = 0
    t = _receive(tile_ids, tile_ready, tile_free, taken)
    while t < num_pid_m * num_pid_n:
        pid_m, pid_n, e = _tile_at(t, num_pid_m, num_pid_n, expert_ids_ptr, GROUP_M)
        taken_in, absorbs = tail_role(pid_m, e, num_pid_m, sorted_ids_ptr, expert_ids_ptr, num_valid, BLOCK_M, TAIL)
        if e < 0:
            if ZERO_FOREIGN:
                _zero_columns(WG, c_ptr, sorted_ids_ptr, pid_m, pid_n, N, num_valid, stride_cm, BLOCK_M, OUT_N)
        elif not taken_in:
            # (Constexpr arguments stay literal: packed in a tuple they would turn into run-time values.)
            if absorbs:  # a full block: its rows, then the next block's first TAIL rows
                acc, acc_t = _mma_ring(WG, x_ring, x_tail, w_ring, ready, empty, k_tiles, used, WG_ROWS, BLOCK_M,
                                       TAIL, STAGES)
                _store(WG, acc, bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, e, pid_m, pid_n, N, num_valid,
                       alpha, limit, stride_bias_e, stride_cm, GATED, ACT, HAS_BIAS, MUL_WEIGHT, BLOCK_M)
                _store(WG, acc_t, bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, e, pid_m + 1, pid_n, N,
                       num_valid, alpha, limit, stride_bias_e, stride_cm, GATED, ACT, HAS_BIAS, MUL_WEIGHT, BLOCK_M)
            # Valid rows are a prefix of the block (the alignment pads each expert's last block).
            elif gl.load(sorted_ids_ptr + pid_m * BLOCK_M + BLOCK_M // 2) >= num_valid:
                _store(WG, _mma_ring(WG, x_ring, x_tail, w_ring, ready, empty, k_tiles, used, WG_ROWS, BLOCK_M // 2,
                                     0, STAGES)[0], bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, e, pid_m, pid_n, N, num_valid,
                       alpha, limit, stride_bias_e, stride_cm, GATED, ACT, HAS_BIAS, MUL_WEIGHT, BLOCK_M)
            else:
                _store(WG, _mma_ring(WG, x_ring, x_tail, w_ring, ready, empty, k_tiles, used, WG_ROWS, BLOCK_M, 0,
                                     STAGES)[0], bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, e, pid_m, pid_n, N, num_valid,
                       alpha, limit, stride_bias_e, stride_cm, GATED, ACT, HAS_BIAS, MUL_WEIGHT, BLOCK_M)
            used += k_tiles
        taken += 1
        t = _receive(tile_ids, tile_ready, tile_free, taken)


@gluon.jit
def _zero_columns(WG: gl.constexpr, c_ptr, sorted_ids_ptr, pid_m, pid_n, N, num_valid, stride_cm, BLOCK_M: gl.constexpr,
                  OUT_N: gl.constexpr):
    """Zeros in warpgroup WG's half of a foreign block's output columns, 64 at a time."""
    zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    HALF: gl.constexpr = OUT_N // 2
    ids = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, zl)))
    rows = c_ptr + ids.to(gl.int64)[:, None] * stride_cm
    for c0 in gl.static_range(0, HALF, 64):
        cols = pid_n * OUT_N + WG * HALF + c0 + gl.arange(0, 64, layout=gl.SliceLayout(0, zl))
        gl.store(rows + cols[None, :], gl.zeros([BLOCK_M, 64], c_ptr.dtype.element_ty, layout=zl),
                 mask=(ids < num_valid)[:, None] & (cols < N)[None, :])


@gluon.jit
def moe_gemm_wgmma_persistent_kernel(
    a_ptr, w_desc, bias_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, expert_ids_ptr, total_ptr, tile_counter_ptr,
    N, K, num_valid, alpha, limit,
    stride_am, stride_bias_e, stride_cm,
    A_ROW_DIV: gl.constexpr, GATED: gl.constexpr, ACT: gl.constexpr, HAS_BIAS: gl.constexpr,
    MUL_WEIGHT: gl.constexpr, ZERO_FOREIGN: gl.constexpr,
    BLOCK_M: gl.constexpr,  # sorted rows per block: 64 or 128 (wgmma's N side)
    BLOCK_N: gl.constexpr,  # weight rows per tile (gated: BLOCK_N / 2 gate rows and their up rows): 128 or 256
    GROUP_M: gl.constexpr, STAGES: gl.constexpr, K_TAIL: gl.constexpr,
    TAIL: gl.constexpr,  # 0, 16 or 32 (< BLOCK_M): a full block takes in its expert's last block of <= TAIL rows
    CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
):
    """`moe_gemm_wgmma_kernel` as a persistent program per SM over the layer's tiles (launch order
    `grouped_tile`, taken one at a time from tile_counter_ptr: an int32 zero on entry): a loader
    warpgroup fills the ring, two consumer warpgroups multiply and run the epilogue, so a tile's
    epilogue overlaps the next tile's first copies; blocks taken in (TAIL) are skipped. Same arguments, less EM (the tile count comes
    from `total_ptr`); w_desc's blocks: gated BLOCK_N / 4, else BLOCK_N / 2 weight rows by BLOCK_K."""
    gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warpgroup")
    gl.static_assert(BLOCK_N == 128 or BLOCK_N == 256, "two consumer warpgroups of 64 or 128 weight rows")
    gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128, "blocks of 64 or 128 sorted rows")
    gl.static_assert(TAIL == 0 or ((TAIL == 16 or TAIL == 32) and TAIL < BLOCK_M), "tails of 16 or 32 rows")
    num_pid_m = gl.cdiv(gl.load(total_ptr), BLOCK_M)
    # The loader's cp.async threads and its expected weight bytes.
    x_ring, w_ring, ready, empty = _allocate_ring(a_ptr, w_desc, BLOCK_M, BLOCK_N, STAGES, 128 + 1)
    if TAIL > 0:  # the rows a block takes in, per ring stage (arriving on the stage's `ready`)
        x_tail = gl.allocate_shared_memory(a_ptr.dtype.element_ty, [STAGES, TAIL, BLOCK_K],
                                           gl.NVMMASharedLayout.get_default_for([TAIL, BLOCK_K], a_ptr.dtype.element_ty))
    else:
        x_tail = x_ring  # never read
    # The loader's tile indices for the consumers, two in flight.
    tile_ids = gl.allocate_shared_memory(gl.int32, [2, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    tile_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    tile_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(tile_ready.index(s), count=1)
        mbarrier.init(tile_free.index(s), count=2)
    gl.warp_specialize([
        (_consume_tiles, (0, x_ring, x_tail, w_ring, ready, empty, tile_ids, tile_ready, tile_free, bias_ptr, c_ptr,
                          topk_weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_pid_m, N, K, num_valid, alpha, limit,
                          stride_bias_e, stride_cm, GATED, ACT, HAS_BIAS, MUL_WEIGHT, ZERO_FOREIGN, BLOCK_M, BLOCK_N,
                          GROUP_M, STAGES, TAIL)),
        (_consume_tiles, (1, x_ring, x_tail, w_ring, ready, empty, tile_ids, tile_ready, tile_free, bias_ptr, c_ptr,
                          topk_weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_pid_m, N, K, num_valid, alpha, limit,
                          stride_bias_e, stride_cm, GATED, ACT, HAS_BIAS, MUL_WEIGHT, ZERO_FOREIGN, BLOCK_M, BLOCK_N,
                          GROUP_M, STAGES, TAIL)),
        (_load_tiles, (x_ring, x_tail, w_ring, ready, empty, tile_ids, tile_ready, tile_free, tile_counter_ptr, a_ptr,
                       w_desc, sorted_ids_ptr, expert_ids_ptr, num_pid_m, N, K, num_valid, stride_am, A_ROW_DIV,
                       GATED, BLOCK_M, BLOCK_N, GROUP_M, STAGES, K_TAIL, TAIL)),
    ], [4, 4], [CONSUMER_REGS, LOADER_REGS])
