"""The quads GEMM of `_kernel` written in Gluon for Hopper: warp-specialized, asynchronous wgmma.

Same contract as `_kernel._moe_wgemm_kernel` for quads weights over align-sorted pairs (STORE and
ATOMIC sinks, split-K, GEMM1's activation over interleaved gate/up chunks, bias, router weight,
zeroing the next GEMM's sums on the side); its torch twin is `moe_triton.quant_gemm.quant_gemm_torch`.
WTYPE picks the weights, a compile-time branch of the unpack only: int4 (nibble minus zero point,
times the group's scale), int8 (int32 words of `_layouts.ByteQuadsLayout`: byte minus 128, minus
any zero point's offset from 128, times the group's scale) or MXFP4 (e2m1 codes times their
quarter's e8m0 factors, `_dequant`).

Why a second kernel: with `tl.dot`, Triton 3.6 waits for every dot whose operand was dequantized in
registers (`wgmma.wait_group 0`), so unpacking never overlaps the tensor cores, and the warps that
unpack also issue the copies and meet at a CTA barrier every K tile. Here each CTA's warps split
the work (`gl.warp_specialize`):
- two consumer warpgroups each own WG_ROWS of the tile's BLOCK_N weight rows (64 or 128): they
  wait for the K tile's ring stage (its `ready` mbarrier), unpack a quarter of the tile into
  wgmma's register operand while the previous quarter's MMA runs, hand the stage back on its
  `empty` mbarrier once its MMAs retired, and finish their own rows (epilogue) without waiting
  for each other;
- the copies (gathered activation rows, int16 words, scale rows, by cp.async, each copy thread's
  completion arriving on `ready`) are issued, for blocks of up to 64 pairs, by a producer
  warpgroup; for 128-pair blocks by the consumers themselves (FOLDED: each its own weight and
  scale rows and half the activation rows, STAGES - 1 tiles ahead).
Nothing is shared between the consumers but the ring, so one unpacks while the other's MMAs run.

Registers (`_heuristics.ws_regs`): ptxas keeps wgmma asynchronous only when every partition holds
the registers the MMA loop needs. With a producer, 12 warps at 168 each: the consumers raise
theirs to 192, the producer drops to 120, enough for 64-pair blocks only (with 128 pairs ptxas
serializes each consumer's MMAs). Folded, 8 warps at 255 each (the whole register file), no
partition below the MMA loop's need.
A folded block with at most 64 valid pairs (an expert's last) runs a second copy of the loop
whose MMAs cover its first 64 rows: half the padding's tensor-core work. With TAIL (8 or 16), a
full block whose expert's next block holds at most TAIL valid pairs (that expert's last) takes
those pairs into its own K loop, as a second accumulator of TAIL columns fed by the same
dequantized weights, and the next block's program exits: the expert's weights are dequantized
once less (an aligned block pays the whole dequantization for any number of valid pairs).

Not persistent (one program per tile): a persistent form measured slower, see
docs/design/triton-gemm-quantized.md.

Gated tiles are regrouped (`_ring_row`) as they are copied: each consumer's first half of rows
are gates and its second half the matching ups, so one thread ends with both sums of an output.

NVIDIA Hopper (sm_90) only: wgmma does not exist elsewhere. Not run by the CPU interpreter; CI
compiles it for sm_90 and the GPU suite checks it against the fp32 reference.
"""

from __future__ import annotations

__all__ = ["QUARTER", "moe_w4a16_wgmma_kernel", "row_halves", "zero_side_slice"]

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from moe_triton._common.activation import activate
from moe_triton._common.wgmma import EPILOGUE_LAYOUT, tail_role
from moe_triton.quant_gemm_details._dequant import (
    byte_quarter_ptx,
    e2m1_quarter_ptx,
    e2m1_weights,
    quarter_e8m0_factors,
)
from moe_triton.quant_gemm_details._kernel import ZERO_BLOCK  # the launcher sizes zero_chunk in these

# Renamed after Triton 3.6 (async_copy.async_load).
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

QUARTER = gl.constexpr(32)  # K per quarter of a 128-wide quads tile: one word per row and k


@gluon.constexpr_function
def _nibble_asm(j, fp16):
    """PTX: nibble j of two int16 quads words (one 32-bit register) as the 16-bit float pair
    (P + code_lo, P + code_hi), P = 128 (bf16) or 1024 (fp16); `_dequant._QUAD_ASM` one output at a time."""
    magic = "0x64006400" if fp16 else "0x43004300"
    if j == 0:
        return f"lop3.b32 $0, $1, 0x000F000F, {magic}, 0xEA;"
    return f"{{.reg .b32 t; shr.u32 t, $1, {4 * j}; lop3.b32 $0, t, 0x000F000F, {magic}, 0xEA;}}"


@gluon.jit
def _nibble(words, j: gl.constexpr, CT: gl.constexpr):
    """P + code of nibble j of each int16 word, exact, in CT (bf16 or fp16), in the words' layout."""
    if CT == gl.float16:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
        v = gl.inline_asm_elementwise(_nibble_asm(j, True), "=r,r", [words], is_pure=True, pack=2, dtype=gl.float16)
    else:
        v = gl.inline_asm_elementwise(_nibble_asm(j, False), "=r,r", [words], is_pure=True, pack=2,
                                      dtype=gl.bfloat16)
    return v


@gluon.jit
def _byte_quarter(words, j: gl.constexpr, CT: gl.constexpr):
    """Byte j of each int32 word of int8 quads minus 128, exact, in CT (bf16 or fp16), in the
    words' layout (`_dequant.byte_quarter_ptx` on each pair of neighbouring words)."""
    if CT == gl.float16:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
        v = gl.inline_asm_elementwise(byte_quarter_ptx(j, "$0", "$1", "$2", True), "=r,r,r", [words], is_pure=True,
                                      pack=2, dtype=gl.float16)
    else:
        v = gl.inline_asm_elementwise(byte_quarter_ptx(j, "$0", "$1", "$2", False), "=r,r,r", [words], is_pure=True,
                                      pack=2, dtype=gl.bfloat16)
    return v


@gluon.jit
def _scaled_byte_quarter(words, s, j: gl.constexpr, CT: gl.constexpr):
    """`_byte_quarter` times the rows' scales s ([ROWS, 1] in CT), rounded once, in the asm
    (`_dequant.byte_quarter_ptx`'s scale)."""
    if CT == gl.float16:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
        v = gl.inline_asm_elementwise(byte_quarter_ptx(j, "$0", "$1", "$2", True, "$3"), "=r,r,r,r", [words, s],
                                      is_pure=True, pack=2, dtype=gl.float16)
    else:
        v = gl.inline_asm_elementwise(byte_quarter_ptx(j, "$0", "$1", "$2", False, "$3"), "=r,r,r,r", [words, s],
                                      is_pure=True, pack=2, dtype=gl.bfloat16)
    return v


@gluon.jit
def _e2m1_quarter(words, j: gl.constexpr):
    """Quarter j's e2m1 values times 2^-126 of MXFP4 quads words, exact, in bf16, in the words' layout
    (`_dequant.e2m1_quarter_ptx` on each 32-bit register)."""
    return gl.inline_asm_elementwise(e2m1_quarter_ptx(j, "$0", "$1"), "=r,r", [words], is_pure=True, pack=2,
                                     dtype=gl.bfloat16)


@gluon.jit
def zero_side_slice(zero_ptr, zero_numel, zero_chunk):
    """A side job of a Gluon GEMM: clear this program's slice of the next GEMM's int32/fp32 sums (zero
    bits), zero_chunk elements (a multiple of ZERO_BLOCK, the launcher's) from the program's linear
    index over the whole grid, which saves that GEMM a fill launch."""
    zl: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    pid = (gl.program_id(0) * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(2) + gl.program_id(2)
    z_end = gl.minimum(pid * zero_chunk + zero_chunk, zero_numel)
    for zero_start in range(pid * zero_chunk, z_end, ZERO_BLOCK):
        z_offs = zero_start + gl.arange(0, ZERO_BLOCK, layout=zl)
        gl.store(zero_ptr + z_offs, gl.zeros([ZERO_BLOCK], gl.int32, layout=zl), mask=z_offs < z_end)


@gluon.constexpr_function
def _row_copy_layout(dtype, num_warps):
    """1-D layout copying elements of `dtype` in 16-byte pieces (cp.async takes 4 bytes or more;
    threads past the row repeat a piece)."""
    return gl.BlockedLayout([128 // dtype.primitive_bitwidth], [32], [num_warps], [0])


@gluon.jit
def _copy_share(a_ptr, b_ptr, s_ptr, z_ptr, sorted_ids_ptr, e, n0, pid_m, N, num_valid, stride_am, stride_be,
                stride_bn, stride_se, A_ROWS_DIV: gl.constexpr, CHUNK: gl.constexpr, WG_ROWS: gl.constexpr,
                BLOCK_M: gl.constexpr, X_R0: gl.constexpr, X_ROWS: gl.constexpr, R0: gl.constexpr,
                ROWS: gl.constexpr):
    """Source pointers and masks of one copier's share of every K tile (K tile 0; `_issue_tile`
    adds the tile's offset): activation rows [X_R0, X_R0 + X_ROWS) of the block and ring rows
    [R0, R0 + ROWS) of the words and scale rows."""
    PW: gl.constexpr = gl.num_warps()
    cp: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [PW, 1], [1, 0])
    k_in_q = gl.arange(0, QUARTER, layout=gl.SliceLayout(0, cp))
    ids = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + X_R0 + gl.arange(0, X_ROWS, layout=gl.SliceLayout(1, cp)))
    x_ptrs = a_ptr + (ids // A_ROWS_DIV).to(gl.int64)[:, None] * stride_am + k_in_q[None, :]
    x_mask = (ids < num_valid)[:, None]
    n_cp = n0 + _ring_row(R0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, cp)), CHUNK, WG_ROWS)
    w_ptrs = b_ptr + e * stride_be + n_cp[:, None] * stride_bn + k_in_q[None, :]
    w_mask = (n_cp < N)[:, None]
    # Regrouped rows stay in runs of CHUNK (a multiple of 16): whole 16-byte pieces for cp.async.
    s_l: gl.constexpr = _row_copy_layout(s_ptr.dtype.element_ty, PW)
    n_s = gl.max_contiguous(gl.multiple_of(n0 + _ring_row(R0 + gl.arange(0, ROWS, layout=s_l), CHUNK, WG_ROWS), 16),
                            16)
    z_l: gl.constexpr = _row_copy_layout(z_ptr.dtype.element_ty, PW)
    n_z = gl.max_contiguous(gl.multiple_of(n0 + _ring_row(R0 + gl.arange(0, ROWS, layout=z_l), CHUNK, WG_ROWS), 16),
                            16)
    return (x_ptrs, x_mask, w_ptrs, w_mask, s_ptr + e * stride_se + n_s, n_s < N, z_ptr + e * stride_se + n_z,
            n_z < N, k_in_q)


@gluon.jit
def _issue_tile(x_rings, w_ring, s_ring, z_ring, stage, kt, x_ptrs, x_mask, w_ptrs, w_mask, s_ptrs, s_mask, z_ptrs,
                z_mask, k_in_q, K, stride_bt, stride_sk, GROUP: gl.constexpr, GROUPS: gl.constexpr,
                HAS_ZP: gl.constexpr, K_TAIL: gl.constexpr, X_R0: gl.constexpr, X_ROWS: gl.constexpr,
                R0: gl.constexpr, ROWS: gl.constexpr):
    """cp.async of a copier's share (`_copy_share`) of K tile kt into ring stage `stage`: rows of
    the four [BLOCK_M, 32] activation quarters (one ring each, each a wgmma B operand), of the
    [BLOCK_N, 32] words (int16, or int32 for int8) and of the tile's GROUPS scale (and zero point) rows."""
    k0 = kt * (4 * QUARTER)
    _async_load(w_ring.index(stage).slice(R0, ROWS), w_ptrs + kt * stride_bt, mask=w_mask)
    _issue_rows(x_rings, stage, kt, x_ptrs, x_mask, k_in_q, K, K_TAIL, X_R0, X_ROWS)
    for g in gl.static_range(GROUPS):
        row = ((k0 + g * GROUP) // GROUP) * stride_sk
        _async_load(s_ring.index(stage * GROUPS + g).slice(R0, ROWS), s_ptrs + row, mask=s_mask)
        if HAS_ZP:
            _async_load(z_ring.index(stage * GROUPS + g).slice(R0, ROWS), z_ptrs + row, mask=z_mask)


@gluon.constexpr_function
def _tail_copy_layout(tail, num_warps):
    """[tail, QUARTER] 16-bit elements over num_warps warps, each element once: pieces of 4 bytes
    (8 rows) or 8 (16 rows); 16-byte pieces would cover the tile several times over."""
    per_thread = tail * QUARTER.value // (32 * num_warps)
    cols = QUARTER.value // per_thread  # threads along a row
    return gl.BlockedLayout([1, per_thread], [32 // cols, cols], [num_warps, 1], [1, 0])


@gluon.jit
def _tail_share(a_ptr, sorted_ids_ptr, pid_m, absorbs, num_valid, stride_am, A_ROWS_DIV: gl.constexpr,
                BLOCK_M: gl.constexpr, TAIL: gl.constexpr):
    """Source pointers and mask (K tile 0) of the TAIL activation rows after the block: the first
    rows of the expert's next block, which this block takes in (`_issue_rows`); none unless it absorbs."""
    tl_: gl.constexpr = _tail_copy_layout(TAIL, gl.num_warps())
    ids = gl.load(sorted_ids_ptr + (pid_m + 1) * BLOCK_M + gl.arange(0, TAIL, layout=gl.SliceLayout(1, tl_)),
                  mask=absorbs, other=num_valid)
    k_in_q = gl.arange(0, QUARTER, layout=gl.SliceLayout(0, tl_))
    ptrs = a_ptr + (ids // A_ROWS_DIV).to(gl.int64)[:, None] * stride_am + k_in_q[None, :]
    return ptrs, (ids < num_valid)[:, None], k_in_q


@gluon.jit
def _issue_rows(x_rings, stage, kt, x_ptrs, x_mask, k_in_q, K, K_TAIL: gl.constexpr, X_R0: gl.constexpr,
                X_ROWS: gl.constexpr):
    """cp.async of activation rows [X_R0, X_R0 + X_ROWS) of K tile kt (pointers and mask of K tile 0)
    into ring stage `stage` of the four quarter rings (a block's, or a taken-in tail's)."""
    k0 = kt * (4 * QUARTER)
    for j in gl.static_range(4):
        if K_TAIL:
            mask = x_mask & (k0 + j * QUARTER + k_in_q < K)[None, :]
        else:
            mask = x_mask
        _async_load(x_rings[j].index(stage).slice(X_R0, X_ROWS), x_ptrs + (k0 + j * QUARTER), mask=mask)


@gluon.jit
def _ring_row(p, CHUNK: gl.constexpr, WG_ROWS: gl.constexpr):
    """Weight-tile row that ring row p holds. Gated tiles (CHUNK > 0: rows interleaved by gate/up
    chunks of CHUNK) are regrouped so that each consumer warpgroup's first WG_ROWS / 2 ring rows are
    gates and its last WG_ROWS / 2 the matching ups."""
    if CHUNK == 0:
        row = p
    else:
        HALF: gl.constexpr = WG_ROWS // 2
        q = p % HALF
        row = ((p // WG_ROWS) * (HALF // CHUNK) + q // CHUNK) * (2 * CHUNK) + ((p // HALF) % 2) * CHUNK + q % CHUNK
    return row


@gluon.jit
def _produce(x_rings, w_ring, s_ring, z_ring, ready, empty, a_ptr, b_ptr, s_ptr, z_ptr, sorted_ids_ptr, e, n0,
                pid_m, kt0, kt1, N, K, num_valid, stride_am, stride_be, stride_bn, stride_bt, stride_se, stride_sk,
                GROUP: gl.constexpr, GROUPS: gl.constexpr, HAS_ZP: gl.constexpr, K_TAIL: gl.constexpr,
                A_ROWS_DIV: gl.constexpr, CHUNK: gl.constexpr, WG_ROWS: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """The copy warps: each K tile's activations (gathered rows), words and scale rows into a free
    ring stage by cp.async; each thread's copies arrive on the stage's `ready` barrier."""
    x_ptrs, x_mask, w_ptrs, w_mask, s_ptrs, s_mask, z_ptrs, z_mask, k_in_q = _copy_share(
        a_ptr, b_ptr, s_ptr, z_ptr, sorted_ids_ptr, e, n0, pid_m, N, num_valid, stride_am, stride_be, stride_bn,
        stride_se, A_ROWS_DIV, CHUNK, WG_ROWS, BLOCK_M, 0, BLOCK_M, 0, BLOCK_N)
    for kt in range(kt0, kt1):
        i = kt - kt0
        stage = i % STAGES
        mbarrier.wait(empty.index(stage), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
        _issue_tile(x_rings, w_ring, s_ring, z_ring, stage, kt, x_ptrs, x_mask, w_ptrs, w_mask, s_ptrs, s_mask,
                    z_ptrs, z_mask, k_in_q, K, stride_bt, stride_sk, GROUP, GROUPS, HAS_ZP, K_TAIL, 0, BLOCK_M, 0,
                    BLOCK_N)
        async_copy.mbarrier_arrive(ready.index(stage), increment_count=False)


@gluon.jit
def _group_scales(s_ring, z_ring, stage, j: gl.constexpr, r0: gl.constexpr, ROWS: gl.constexpr, GROUP: gl.constexpr,
                  GROUPS: gl.constexpr, WTYPE: gl.constexpr, HAS_ZP: gl.constexpr, CODE_OFFSET: gl.constexpr,
                  CT: gl.constexpr, layout: gl.constexpr):
    """(scale, zero) of ring rows [r0, r0 + ROWS) in quarter j's scale group, [ROWS, 1] in CT and
    `layout`: quarter j's weights are (`_nibble` - z) * s for int4 (z = P + zero point) and, for
    int8, (`_byte_quarter` - z) * s with zero points (z = zero point - 128), else
    `_scaled_byte_quarter` (z unused)."""
    if WTYPE == 1:  # int8: codes come centered on 128
        P: gl.constexpr = -128.0
    elif CT == gl.float16:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
        P: gl.constexpr = 1024.0
    else:
        P: gl.constexpr = 128.0
    row = stage * GROUPS + (j * QUARTER) // GROUP if GROUPS > 1 else stage
    rows_l: gl.constexpr = gl.SliceLayout(1, layout)
    s = gl.expand_dims(s_ring.index(row).slice(r0, ROWS).load(rows_l).to(gl.float32).to(CT), 1)
    if HAS_ZP:
        z = gl.expand_dims(z_ring.index(row).slice(r0, ROWS).load(rows_l).to(CT) + P, 1)
    elif WTYPE == 1:
        z = s  # unused: no zero point
    else:
        z = gl.full(s.shape, P + CODE_OFFSET, CT, layout=s.type.layout)
    return s, z


@gluon.jit
def _consume(WG: gl.constexpr, x_rings, x_tails, w_ring, s_ring, z_ring, ready, empty, a_ptr, b_ptr, s_ptr, z_ptr,
             bias_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, e, n0, pid_m, kt0, kt1, narrow, absorbs, N, K, num_valid,
             alpha, limit, stride_am, stride_be, stride_bn, stride_bt, stride_se, stride_sk, stride_biase, stride_cm,
             GROUP: gl.constexpr, GROUPS: gl.constexpr, WTYPE: gl.constexpr, FOLDED_SCALE: gl.constexpr,
             HAS_ZP: gl.constexpr, CODE_OFFSET: gl.constexpr, HAS_BIAS: gl.constexpr, MUL_ROUTED: gl.constexpr,
             REDUCE_TOPK: gl.constexpr, ATOMIC: gl.constexpr, ACT: gl.constexpr, CHUNK: gl.constexpr,
             K_TAIL: gl.constexpr, A_ROWS_DIV: gl.constexpr,
             WG_ROWS: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, FOLDED: gl.constexpr,
             TAIL: gl.constexpr, ROW_SCALE: gl.constexpr):
    """Consumer warpgroup WG: ring rows [WG_ROWS WG, WG_ROWS (WG + 1)), then its own epilogue. It
    waits on no other warpgroup: stages are handed back through `empty`. FOLDED: it also copies
    its share of each K tile (half the activation rows, its own weight and scale rows; warpgroup 0
    also a taken-in tail's rows), STAGES - 1 tiles ahead, into a stage both consumers handed back.
    A `narrow` block (at most BLOCK_M / 2 valid rows, the last of an expert's) runs MMAs over its
    first half of rows only; a block that `absorbs` (TAIL) also multiplies the next block's first TAIL rows."""
    X_ROWS: gl.constexpr = BLOCK_M // 2
    x_r0: gl.constexpr = WG * X_ROWS
    r0: gl.constexpr = WG * WG_ROWS
    # Unused (and dropped by the compiler) unless FOLDED.
    copy = _copy_share(a_ptr, b_ptr, s_ptr, z_ptr, sorted_ids_ptr, e, n0, pid_m, N, num_valid, stride_am, stride_be,
                       stride_bn, stride_se, A_ROWS_DIV, CHUNK, WG_ROWS, BLOCK_M, x_r0, X_ROWS, r0, WG_ROWS)
    COPIES_TAIL: gl.constexpr = TAIL > 0 and WG == 0
    if COPIES_TAIL:
        tail_copy = _tail_share(a_ptr, sorted_ids_ptr, pid_m, absorbs, num_valid, stride_am, A_ROWS_DIV, BLOCK_M, TAIL)
    else:
        tail_copy = copy  # unused
    if FOLDED:
        for p in gl.static_range(STAGES - 1):  # fresh stages: no wait
            if kt0 + p < kt1:
                _issue_tile(x_rings, w_ring, s_ring, z_ring, p, kt0 + p, *copy, K, stride_bt, stride_sk, GROUP, GROUPS,
                            HAS_ZP, K_TAIL, x_r0, X_ROWS, r0, WG_ROWS)
                if COPIES_TAIL and absorbs:
                    _issue_rows(x_tails, p, kt0 + p, *tail_copy, K, K_TAIL, 0, TAIL)
                async_copy.mbarrier_arrive(ready.index(p), increment_count=False)
    if TAIL > 0 and absorbs:
        _mma_then_store(WG, x_rings, x_tails, w_ring, s_ring, z_ring, ready, empty, bias_ptr, c_ptr, topk_w_ptr,
                        sorted_ids_ptr, e, n0, pid_m, kt0, kt1, N, K, num_valid, alpha, limit, stride_bt,
                        stride_sk, stride_biase, stride_cm, copy, tail_copy, GROUP, GROUPS, WTYPE, FOLDED_SCALE, HAS_ZP,
                        CODE_OFFSET, HAS_BIAS, MUL_ROUTED, REDUCE_TOPK, ATOMIC, ACT, CHUNK, K_TAIL, WG_ROWS, BLOCK_M,
                        BLOCK_M, TAIL, STAGES, FOLDED, s_ptr, stride_se, ROW_SCALE)
    elif FOLDED and narrow:
        _mma_then_store(WG, x_rings, x_tails, w_ring, s_ring, z_ring, ready, empty, bias_ptr, c_ptr, topk_w_ptr,
                        sorted_ids_ptr, e, n0, pid_m, kt0, kt1, N, K, num_valid, alpha, limit, stride_bt,
                        stride_sk, stride_biase, stride_cm, copy, tail_copy, GROUP, GROUPS, WTYPE, FOLDED_SCALE, HAS_ZP,
                        CODE_OFFSET, HAS_BIAS, MUL_ROUTED, REDUCE_TOPK, ATOMIC, ACT, CHUNK, K_TAIL, WG_ROWS, BLOCK_M,
                        BLOCK_M // 2, 0, STAGES, FOLDED, s_ptr, stride_se, ROW_SCALE)
    else:
        _mma_then_store(WG, x_rings, x_tails, w_ring, s_ring, z_ring, ready, empty, bias_ptr, c_ptr, topk_w_ptr,
                        sorted_ids_ptr, e, n0, pid_m, kt0, kt1, N, K, num_valid, alpha, limit, stride_bt,
                        stride_sk, stride_biase, stride_cm, copy, tail_copy, GROUP, GROUPS, WTYPE, FOLDED_SCALE, HAS_ZP,
                        CODE_OFFSET, HAS_BIAS, MUL_ROUTED, REDUCE_TOPK, ATOMIC, ACT, CHUNK, K_TAIL, WG_ROWS, BLOCK_M,
                        BLOCK_M, 0, STAGES, FOLDED, s_ptr, stride_se, ROW_SCALE)


@gluon.jit
def row_halves(acc):
    """A consumer's [WG_ROWS, MMA_N] accumulator as its two halves of rows, [WG_ROWS / 2, MMA_N] each,
    ring rows r and r + WG_ROWS / 2 (a gate and its up when gated) in the same thread: 128 rows in the
    accumulator's own registers (wgmma's M repeats every 64 rows), 64 rows through EPILOGUE_LAYOUT
    (which repeats every 32 rows)."""
    HALF: gl.constexpr = acc.shape[0] // 2
    MMA_N: gl.constexpr = acc.shape[1]
    if acc.shape[0] != 128:
        acc = gl.convert_layout(acc, EPILOGUE_LAYOUT)
    return acc.reshape([2, HALF, MMA_N]).permute((1, 2, 0)).split()


@gluon.jit
def _mma_then_store(WG: gl.constexpr, x_rings, x_tails, w_ring, s_ring, z_ring, ready, empty, bias_ptr, c_ptr,
                    topk_w_ptr, sorted_ids_ptr, e, n0, pid_m, kt0, kt1, N, K, num_valid, alpha, limit, stride_bt,
                    stride_sk, stride_biase, stride_cm, copy, tail_copy, GROUP: gl.constexpr, GROUPS: gl.constexpr,
                    WTYPE: gl.constexpr, FOLDED_SCALE: gl.constexpr, HAS_ZP: gl.constexpr, CODE_OFFSET: gl.constexpr,
                    HAS_BIAS: gl.constexpr, MUL_ROUTED: gl.constexpr, REDUCE_TOPK: gl.constexpr, ATOMIC: gl.constexpr,
                    ACT: gl.constexpr,
                    CHUNK: gl.constexpr, K_TAIL: gl.constexpr, WG_ROWS: gl.constexpr, BLOCK_M: gl.constexpr,
                    MMA_N: gl.constexpr, TAIL_N: gl.constexpr, STAGES: gl.constexpr, FOLDED: gl.constexpr, s_ptr,
                    stride_se, ROW_SCALE: gl.constexpr):
    """The consumer's K loop over the block's first MMA_N rows (its MMA's N) and, with TAIL_N, the
    TAIL_N rows after the block (a second accumulator on the same dequantized weights), then its
    epilogue for each. ROW_SCALE (integer weights with one scale per row): the weights go unscaled into the
    MMAs, and the epilogue scales each output row once (`_store_tile`)."""
    CT: gl.constexpr = x_rings[0].dtype
    FT: gl.constexpr = gl.bfloat16 if CT == gl.bfloat16 else gl.float32  # noqa: SIM300 (MXFP4: `e8m0_factors`)
    X_ROWS: gl.constexpr = BLOCK_M // 2
    x_r0: gl.constexpr = WG * X_ROWS
    r0: gl.constexpr = WG * WG_ROWS
    COPIES_TAIL: gl.constexpr = TAIL_N > 0 and WG == 0
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, MMA_N, 16])
    w_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    acc = gl.zeros([WG_ROWS, MMA_N], gl.float32, layout=mma)
    if TAIL_N > 0:
        # Same A operand layout as the main MMA's (instr_shape's N does not enter it).
        mma_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, TAIL_N, 16])
        acc_t = gl.zeros([WG_ROWS, TAIL_N], gl.float32, layout=mma_t)
        # Each quarter's MMAs retire before the next quarter is dequantized: keeping them in flight
        # takes registers the consumers lack (ptxas then serializes every wgmma of the kernel). The
        # other consumer's MMAs still overlap this one's dequantization.
        IN_FLIGHT: gl.constexpr = 0
    else:
        acc_t = acc  # unused
        IN_FLIGHT: gl.constexpr = 1
    gl.assume(kt1 > kt0)  # checked before the partitions fork; a possibly empty loop makes ptxas serialize wgmma
    for kt in range(kt0, kt1):
        i = kt - kt0
        stage = i % STAGES
        mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
        fence_async_shared()  # cp.async wrote the stage; wgmma reads it through the async proxy
        words = w_ring.index(stage).slice(r0, WG_ROWS).load(w_op)
        w_prev = words  # the quarter before j's operand (static_range unrolls: unused at j == 0)
        for j in gl.static_range(4):
            # Scale rows are read once per group (at the quarter that starts one), not once per quarter.
            if (j * QUARTER) % GROUP == 0:
                if WTYPE == 3:  # the tile's exponent words: one ring row (GROUP is the whole tile)
                    exp_words = s_ring.index(stage).slice(r0, WG_ROWS).load(gl.SliceLayout(1, w_op))
                else:
                    s, z = _group_scales(s_ring, z_ring, stage, j, r0, WG_ROWS, GROUP, GROUPS, WTYPE, HAS_ZP,
                                         CODE_OFFSET, CT, w_op)
            if WTYPE == 3:
                lo, hi = quarter_e8m0_factors(exp_words, j, FT, FOLDED_SCALE)
                w = e2m1_weights(_e2m1_quarter(words, j), lo, hi, FOLDED_SCALE, CT)
            elif WTYPE == 1:
                if HAS_ZP:
                    w = _byte_quarter(words, j, CT) - z
                    if not ROW_SCALE:
                        w = w * s
                elif ROW_SCALE:
                    w = _byte_quarter(words, j, CT)
                else:
                    w = _scaled_byte_quarter(words, s, j, CT)
            else:
                w = _nibble(words, j, CT) - z
                if not ROW_SCALE:
                    w = w * s
            acc = warpgroup_mma(w, x_rings[j].index(stage).slice(0, MMA_N).permute((1, 0)), acc, is_async=True)
            if TAIL_N > 0:
                acc_t = warpgroup_mma(w, x_tails[j].index(stage).permute((1, 0)), acc_t, is_async=True)
            # The newest quarter's MMA stays in flight (IN_FLIGHT 1); past this wait the quarter before
            # it is done (after quarter 0: the previous K tile, whose stage goes back).
            if j == 0:
                if TAIL_N > 0:
                    acc, acc_t = warpgroup_mma_wait(num_outstanding=IN_FLIGHT, deps=(acc, acc_t))
                else:
                    acc = warpgroup_mma_wait(num_outstanding=IN_FLIGHT, deps=(acc,))
                mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=i > 0)
            else:
                if TAIL_N > 0:
                    acc, acc_t, w_prev = warpgroup_mma_wait(num_outstanding=IN_FLIGHT, deps=(acc, acc_t, w_prev))
                else:
                    acc, w_prev = warpgroup_mma_wait(num_outstanding=IN_FLIGHT, deps=(acc, w_prev))
            w_prev = w
        if FOLDED:
            # Tile i + STAGES - 1 refills the stage of tile i - 1 once both consumers handed it back.
            ahead = i + STAGES - 1
            if kt0 + ahead < kt1:
                refill = ahead % STAGES
                mbarrier.wait(empty.index(refill), ((ahead // STAGES) & 1) ^ 1)
                _issue_tile(x_rings, w_ring, s_ring, z_ring, refill, kt0 + ahead, *copy, K, stride_bt, stride_sk,
                            GROUP, GROUPS, HAS_ZP, K_TAIL, x_r0, X_ROWS, r0, WG_ROWS)
                if COPIES_TAIL:
                    _issue_rows(x_tails, refill, kt0 + ahead, *tail_copy, K, K_TAIL, 0, TAIL_N)
                async_copy.mbarrier_arrive(ready.index(refill), increment_count=False)
    if TAIL_N > 0:
        acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_t))
        _store_tile(WG, acc_t, BLOCK_M, bias_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, e, n0, pid_m, kt0, N, num_valid,
                    alpha, limit, stride_biase, stride_cm, HAS_BIAS, MUL_ROUTED, REDUCE_TOPK, ATOMIC, ACT, CHUNK,
                    WG_ROWS, BLOCK_M, s_ptr, stride_se, ROW_SCALE)
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _store_tile(WG, acc, 0, bias_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, e, n0, pid_m, kt0, N, num_valid, alpha,
                limit, stride_biase, stride_cm, HAS_BIAS, MUL_ROUTED, REDUCE_TOPK, ATOMIC, ACT, CHUNK, WG_ROWS,
                BLOCK_M, s_ptr, stride_se, ROW_SCALE)


@gluon.constexpr_function
def _store_layout(half):
    """Layout of a consumer's [half, n] outputs as they are stored: eight consecutive weight rows per
    thread (the outputs' contiguous dimension: one 16-byte store), tokens across the warp's other
    lanes and across the warps."""
    return gl.BlockedLayout([8, 1], [half // 8, 32 // (half // 8)], [1, 4], [0, 1])


@gluon.jit
def _store_targets(ids_ptr, num_valid, HALF: gl.constexpr, MMA_N: gl.constexpr, REDUCE_TOPK: gl.constexpr):
    """The output rows (pair // REDUCE_TOPK) of the MMA_N pairs at ids_ptr and which are valid, along
    the tokens of `_store_layout(HALF)`: loaded once for every `_store_rows` of the tile."""
    st_l: gl.constexpr = _store_layout(HALF)
    ids = gl.load(ids_ptr + gl.arange(0, MMA_N, layout=gl.SliceLayout(0, st_l)))
    return (ids // REDUCE_TOPK).to(gl.int64), ids < num_valid


@gluon.jit
def _store_rows(c_ptr, y, col0, num_cols, out_rows, pairs_ok, stride_cm):
    """y [half, n] (fp32, any layout) into c[out_rows, col0 + r] for the pairs_ok pairs (`_store_targets`):
    cast to c's dtype, then moved to `_store_layout` (half the bytes through shared memory that fp32
    would take)."""
    st_l: gl.constexpr = _store_layout(y.shape[0])
    y = gl.convert_layout(y.to(c_ptr.dtype.element_ty), st_l)
    cols = col0 + gl.arange(0, y.shape[0], layout=gl.SliceLayout(1, st_l))
    gl.store(c_ptr + out_rows[None, :] * stride_cm + cols[:, None], y,
             mask=(cols < num_cols)[:, None] & pairs_ok[None, :])


@gluon.jit
def _store_tile(WG: gl.constexpr, acc, row_off: gl.constexpr, bias_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, e, n0,
                pid_m, kt0, N, num_valid, alpha, limit, stride_biase, stride_cm, HAS_BIAS: gl.constexpr,
                MUL_ROUTED: gl.constexpr, REDUCE_TOPK: gl.constexpr, ATOMIC: gl.constexpr, ACT: gl.constexpr,
                CHUNK: gl.constexpr, WG_ROWS: gl.constexpr, BLOCK_M: gl.constexpr, s_ptr, stride_se,
                ROW_SCALE: gl.constexpr):
    """Epilogue of a consumer's accumulator [WG_ROWS, n] for the block's rows row_off .. row_off + n
    (row_off BLOCK_M: the taken-in tail): with ROW_SCALE each row's scale (row 0 of the scales
    [E, 1, N]), then bias, router weight, activation, in the registers `row_halves` leaves them in;
    then the sink (stores: `_store_rows`)."""
    HALF: gl.constexpr = WG_ROWS // 2
    MMA_N: gl.constexpr = acc.shape[1]
    res0, res1 = row_halves(acc)
    if ATOMIC:  # fp32 atomics, one per output: threads along the outputs' contiguous rows
        res0 = gl.convert_layout(res0, EPILOGUE_LAYOUT)
        res1 = gl.convert_layout(res1, EPILOGUE_LAYOUT)
    out_l: gl.constexpr = res0.type.layout
    rows = gl.arange(0, HALF, layout=gl.SliceLayout(1, out_l))
    ids_ptr = sorted_ids_ptr + pid_m * BLOCK_M + row_off
    ids = gl.load(ids_ptr + gl.arange(0, MMA_N, layout=gl.SliceLayout(0, out_l)))
    rows_ok = ids < num_valid
    n_0 = n0 + _ring_row(WG * WG_ROWS + rows, CHUNK, WG_ROWS)
    n_1 = n0 + _ring_row(WG * WG_ROWS + HALF + rows, CHUNK, WG_ROWS)
    if ROW_SCALE:
        res0 *= gl.load(s_ptr + e * stride_se + n_0, mask=n_0 < N, other=0.0).to(gl.float32)[:, None]
        res1 *= gl.load(s_ptr + e * stride_se + n_1, mask=n_1 < N, other=0.0).to(gl.float32)[:, None]
    if HAS_BIAS:  # noqa: SIM102 (HAS_BIAS is a compile-time switch, kt0 a run-time value)
        if kt0 == 0:  # once per output, not once per K-split
            res0 += gl.load(bias_ptr + e * stride_biase + n_0, mask=n_0 < N, other=0.0).to(gl.float32)[:, None]
            res1 += gl.load(bias_ptr + e * stride_biase + n_1, mask=n_1 < N, other=0.0).to(gl.float32)[:, None]
    if MUL_ROUTED:
        w_routed = gl.load(topk_w_ptr + ids, mask=rows_ok, other=0.0).to(gl.float32)[None, :]
        res0 *= w_routed
        res1 *= w_routed
    if CHUNK > 0:
        y = activate(res0, res1, alpha, limit, ACT, FAST_SIGMOID=True)
        out_rows, pairs_ok = _store_targets(ids_ptr, num_valid, HALF, MMA_N, REDUCE_TOPK)
        _store_rows(c_ptr, y, n0 // 2 + WG * HALF, N // 2, out_rows, pairs_ok, stride_cm)
    elif ATOMIC:
        out_rows = (ids // REDUCE_TOPK).to(gl.int64)
        gl.atomic_add(c_ptr + out_rows[None, :] * stride_cm + n_0[:, None], res0,
                      mask=(n_0 < N)[:, None] & rows_ok[None, :], sem="relaxed")
        gl.atomic_add(c_ptr + out_rows[None, :] * stride_cm + n_1[:, None], res1,
                      mask=(n_1 < N)[:, None] & rows_ok[None, :], sem="relaxed")
    else:  # not gated: the halves are runs of HALF consecutive rows
        y0 = activate(res0, res0, alpha, limit, ACT, FAST_SIGMOID=True)
        y1 = activate(res1, res1, alpha, limit, ACT, FAST_SIGMOID=True)
        out_rows, pairs_ok = _store_targets(ids_ptr, num_valid, HALF, MMA_N, REDUCE_TOPK)
        _store_rows(c_ptr, y0, n0 + WG * WG_ROWS, N, out_rows, pairs_ok, stride_cm)
        _store_rows(c_ptr, y1, n0 + WG * WG_ROWS + HALF, N, out_rows, pairs_ok, stride_cm)


@gluon.jit
def moe_w4a16_wgmma_kernel(
    a_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    zero_ptr, N, K, num_valid, zero_numel, zero_chunk, alpha, limit,
    stride_am, stride_be, stride_bn, stride_bt, stride_se, stride_sk, stride_biase, stride_cm,
    GROUP: gl.constexpr, WTYPE: gl.constexpr, FOLDED_SCALE: gl.constexpr, HAS_ZP: gl.constexpr,
    CODE_OFFSET: gl.constexpr, HAS_BIAS: gl.constexpr, A_ROWS_DIV: gl.constexpr, MUL_ROUTED: gl.constexpr,
    REDUCE_TOPK: gl.constexpr, ATOMIC: gl.constexpr, ACT: gl.constexpr, GATE_UP_CHUNK: gl.constexpr,
    ZERO_SIDE: gl.constexpr, SPLIT_K: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, K_TAIL: gl.constexpr, PRODUCER_WARPS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    TAIL: gl.constexpr,  # 0, or 8 / 16 with FOLDED: a full block takes in its expert's last <= TAIL pairs
    ROW_SCALE: gl.constexpr,  # int4 or int8 with one scale per row (per channel): scaled once per output, in the epilogue
):
    NW: gl.constexpr = gl.num_warps()
    CT: gl.constexpr = a_ptr.dtype.element_ty
    TILE_K: gl.constexpr = 4 * QUARTER
    # K per scale ring row: MXFP4's exponent words hold a whole tile (`_layouts.pack_e8m0_tiles`).
    RING_GROUP: gl.constexpr = TILE_K if WTYPE == 3 else GROUP
    GROUPS: gl.constexpr = TILE_K // RING_GROUP if RING_GROUP < TILE_K else 1
    WG_ROWS: gl.constexpr = BLOCK_N // 2  # weight rows per consumer warpgroup
    FOLDED: gl.constexpr = PRODUCER_WARPS == 0  # the consumers copy their own share of each tile
    gl.static_assert(NW == 4, "the default partition is one consumer warpgroup")
    gl.static_assert(WG_ROWS == 64 or WG_ROWS == 128, "two consumer warpgroups of 64 or 128 weight rows")
    gl.static_assert(GROUP % QUARTER == 0, "each quarter lies in one scale group")
    gl.static_assert(WTYPE != 3 or GROUP == QUARTER, "MXFP4: one scale group per quarter")
    gl.static_assert(TAIL == 0 or (FOLDED and (TAIL == 8 or TAIL == 16)),
                     "a taken-in tail of 8 or 16 pairs, with the copies folded into the consumers")
    gl.static_assert(GATE_UP_CHUNK == 0 or ((WG_ROWS // 2) % GATE_UP_CHUNK == 0 and GATE_UP_CHUNK % 16 == 0),
                     "gate/up chunks of 16 rows or more tile half a warpgroup's rows")
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    if ZERO_SIDE:
        zero_side_slice(zero_ptr, zero_numel, zero_chunk)
    k_tiles = gl.cdiv(K, TILE_K)
    per_split = gl.cdiv(k_tiles, SPLIT_K)
    kt0 = gl.program_id(2) * per_split
    kt1 = gl.minimum(kt0 + per_split, k_tiles)
    if kt0 >= kt1:
        return
    if pid_m * BLOCK_M >= gl.load(num_post_ptr):
        return
    e = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
    if e < 0:
        return
    n0 = pid_n * BLOCK_N
    # Valid rows are a prefix of the block (the alignment pads each expert's last block): at most
    # half of them when the middle row is padding.
    narrow = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + BLOCK_M // 2) >= num_valid
    taken_in, absorbs = tail_role(pid_m, e, gl.cdiv(gl.load(num_post_ptr), BLOCK_M), sorted_ids_ptr, expert_ids_ptr,
                                  num_valid, BLOCK_M, TAIL)
    if taken_in:
        return

    x_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, QUARTER], CT)
    x_rings = (gl.allocate_shared_memory(CT, [STAGES, BLOCK_M, QUARTER], x_sl),
               gl.allocate_shared_memory(CT, [STAGES, BLOCK_M, QUARTER], x_sl),
               gl.allocate_shared_memory(CT, [STAGES, BLOCK_M, QUARTER], x_sl),
               gl.allocate_shared_memory(CT, [STAGES, BLOCK_M, QUARTER], x_sl))
    if TAIL > 0:
        t_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TAIL, QUARTER], CT)
        x_tails = (gl.allocate_shared_memory(CT, [STAGES, TAIL, QUARTER], t_sl),
                   gl.allocate_shared_memory(CT, [STAGES, TAIL, QUARTER], t_sl),
                   gl.allocate_shared_memory(CT, [STAGES, TAIL, QUARTER], t_sl),
                   gl.allocate_shared_memory(CT, [STAGES, TAIL, QUARTER], t_sl))
    else:
        x_tails = x_rings  # unused
    # Words rows are 64 bytes (int16; int8 quads' int32 words: 128): unswizzled, the ldmatrix of 8 rows
    # hit 4x its ideal wavefronts (16-way bank conflicts, Nsight Compute); wgmma's swizzle spreads them.
    WORD: gl.constexpr = b_ptr.dtype.element_ty
    w_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, QUARTER], WORD)
    w_ring = gl.allocate_shared_memory(WORD, [STAGES, BLOCK_N, QUARTER], w_sl)
    rows: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    s_ring = gl.allocate_shared_memory(s_ptr.dtype.element_ty, [STAGES * GROUPS, BLOCK_N], rows)
    z_ring = gl.allocate_shared_memory(z_ptr.dtype.element_ty, [STAGES * GROUPS if HAS_ZP else 1, BLOCK_N], rows)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        # Every copy thread arrives: the producer's, or (FOLDED) both consumers'.
        mbarrier.init(ready.index(s), count=32 * (8 if FOLDED else PRODUCER_WARPS))
        mbarrier.init(empty.index(s), count=2)  # one arrival per consumer warpgroup
    # Partitions take flat argument tuples, spelled out per consumer and per plan (Gluon builds them at
    # compile time; a list of them cannot be assembled in a JIT variable).
    if FOLDED:
        gl.warp_specialize([
            (_consume, (0, x_rings, x_tails, w_ring, s_ring, z_ring, ready, empty, a_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr,
                        topk_w_ptr, sorted_ids_ptr, e, n0, pid_m, kt0, kt1, narrow, absorbs, N, K, num_valid, alpha, limit,
                        stride_am, stride_be, stride_bn, stride_bt, stride_se, stride_sk, stride_biase, stride_cm,
                        RING_GROUP, GROUPS, WTYPE, FOLDED_SCALE, HAS_ZP, CODE_OFFSET, HAS_BIAS, MUL_ROUTED, REDUCE_TOPK,
                        ATOMIC, ACT, GATE_UP_CHUNK, K_TAIL, A_ROWS_DIV, WG_ROWS, BLOCK_M, STAGES, FOLDED, TAIL, ROW_SCALE)),
            (_consume, (1, x_rings, x_tails, w_ring, s_ring, z_ring, ready, empty, a_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr,
                        topk_w_ptr, sorted_ids_ptr, e, n0, pid_m, kt0, kt1, narrow, absorbs, N, K, num_valid, alpha, limit,
                        stride_am, stride_be, stride_bn, stride_bt, stride_se, stride_sk, stride_biase, stride_cm,
                        RING_GROUP, GROUPS, WTYPE, FOLDED_SCALE, HAS_ZP, CODE_OFFSET, HAS_BIAS, MUL_ROUTED, REDUCE_TOPK,
                        ATOMIC, ACT, GATE_UP_CHUNK, K_TAIL, A_ROWS_DIV, WG_ROWS, BLOCK_M, STAGES, FOLDED, TAIL, ROW_SCALE)),
        ], [4], [CONSUMER_REGS])
    else:
        gl.warp_specialize([
            (_consume, (0, x_rings, x_tails, w_ring, s_ring, z_ring, ready, empty, a_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr,
                        topk_w_ptr, sorted_ids_ptr, e, n0, pid_m, kt0, kt1, narrow, absorbs, N, K, num_valid, alpha, limit,
                        stride_am, stride_be, stride_bn, stride_bt, stride_se, stride_sk, stride_biase, stride_cm,
                        RING_GROUP, GROUPS, WTYPE, FOLDED_SCALE, HAS_ZP, CODE_OFFSET, HAS_BIAS, MUL_ROUTED, REDUCE_TOPK,
                        ATOMIC, ACT, GATE_UP_CHUNK, K_TAIL, A_ROWS_DIV, WG_ROWS, BLOCK_M, STAGES, FOLDED, TAIL, ROW_SCALE)),
            (_consume, (1, x_rings, x_tails, w_ring, s_ring, z_ring, ready, empty, a_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr,
                        topk_w_ptr, sorted_ids_ptr, e, n0, pid_m, kt0, kt1, narrow, absorbs, N, K, num_valid, alpha, limit,
                        stride_am, stride_be, stride_bn, stride_bt, stride_se, stride_sk, stride_biase, stride_cm,
                        RING_GROUP, GROUPS, WTYPE, FOLDED_SCALE, HAS_ZP, CODE_OFFSET, HAS_BIAS, MUL_ROUTED, REDUCE_TOPK,
                        ATOMIC, ACT, GATE_UP_CHUNK, K_TAIL, A_ROWS_DIV, WG_ROWS, BLOCK_M, STAGES, FOLDED, TAIL, ROW_SCALE)),
            (_produce, (x_rings, w_ring, s_ring, z_ring, ready, empty, a_ptr, b_ptr, s_ptr, z_ptr, sorted_ids_ptr, e,
                        n0, pid_m, kt0, kt1, N, K, num_valid, stride_am, stride_be, stride_bn, stride_bt, stride_se,
                        stride_sk, RING_GROUP, GROUPS, HAS_ZP, K_TAIL, A_ROWS_DIV, GATE_UP_CHUNK, WG_ROWS, BLOCK_M,
                        BLOCK_N, STAGES)),
        ], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
