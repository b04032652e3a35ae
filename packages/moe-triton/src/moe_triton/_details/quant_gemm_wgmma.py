"""The int4 quads GEMM of `quant_gemm` written in Gluon for Hopper: asynchronous wgmma.

Same contract as `quant_gemm._moe_wgemm_kernel` for int4 quads weights over align-sorted pairs
(STORE and ATOMIC sinks, split-K, GEMM1's activation over interleaved gate/up chunks, bias,
router weight, zeroing the next GEMM's sums on the side); its torch twin is `quant_gemm.moe_gemm_torch`.

Why a second kernel: with `tl.dot`, Triton 3.6 waits for every dot whose operand was dequantized in
registers (`wgmma.wait_group 0`), so the unpacking of the next quarter never overlaps the tensor
cores (benchmarks/results/int4_large_m_experiments_2026-11-21.md). Here each quarter's MMA is
issued asynchronously and waited for only after the next quarter has been unpacked and issued
(`warpgroup_mma_wait(1)`), and activations, weight words and scale rows stream through a ring of
shared-memory stages filled by cp.async (activation rows are gathered, so no TMA). Measured on the
H100 (benchmarks/results/int4_wgmma_n_first_2026-11-21.md): faster than the `tl.dot` kernel only
at 8192 tokens for mixtral and gpt-oss (0.7% and 3.5%); slower from 512 to 2048 tokens and for
the other presets. Its best tiles (128 x 256) leave one CTA of 8 warps per SM, with a CTA barrier
per K tile, so its two warpgroups cannot take turns on the tensor cores; a producer warp and per-stage mbarriers are the
next step.

Ring discipline (STAGES >= 3, one commit group per K tile): at K tile t every thread waits for its
copies of tile t, fences them for the async proxy and meets the others at a CTA barrier; past the
barrier every warpgroup has retired the MMAs of tile t - 2 (it waited with one MMA, tile t - 1's
last quarter, in flight), so tile t + STAGES - 2 is copied into that tile's stage.

NVIDIA Hopper (sm_90) only: wgmma does not exist elsewhere. Not run by the CPU interpreter; CI
compiles it for sm_90 and the GPU suite checks it against the fp32 reference.
"""

from __future__ import annotations

__all__ = ["QUARTER", "moe_w4a16_wgmma_kernel"]

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from moe_triton._details.gemm_kernels import activate

# Renamed after Triton 3.6 (gl.barrier, async_copy.async_load).
_cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

QUARTER = gl.constexpr(32)  # K per quarter of a 128-wide quads tile: one word per row and k
_ZERO_BLOCK = gl.constexpr(512)


@gluon.constexpr_function
def _nibble_asm(j, fp16):
    """PTX: nibble j of two int16 quads words (one 32-bit register) as the 16-bit float pair
    (P + code_lo, P + code_hi), P = 128 (bf16) or 1024 (fp16); `quant_gemm._QUAD_ASM` one output at a time."""
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


@gluon.constexpr_function
def _row_copy_layout(dtype, num_warps):
    """1-D layout copying elements of `dtype` in 16-byte pieces (cp.async takes 4 bytes or more;
    threads past the row repeat a piece)."""
    return gl.BlockedLayout([128 // dtype.primitive_bitwidth], [32], [num_warps], [0])


@gluon.jit
def _issue_tile(x_rings, w_ring, s_ring, z_ring, stage, kt, x_ptrs, x_mask, w_ptrs, w_mask, s_ptrs, z_ptrs, s_mask,
                z_mask, k_in_q, K, stride_bt, stride_sk, GROUP: gl.constexpr, GROUPS: gl.constexpr,
                HAS_ZP: gl.constexpr, K_TAIL: gl.constexpr):
    """cp.async of K tile kt into ring stage `stage` (not committed): four [BLOCK_M, 32] activation
    quarters (one ring each: copies into one allocation get a CTA barrier between them from
    Triton's hazard analysis), the [BLOCK_N, 32] int16 words and the tile's GROUPS scale (and zero
    point) rows."""
    k0 = kt * (4 * QUARTER)
    _async_load(w_ring.index(stage), w_ptrs + kt * stride_bt, mask=w_mask)
    for j in gl.static_range(4):
        if K_TAIL:
            mask = x_mask & (k0 + j * QUARTER + k_in_q < K)[None, :]
        else:
            mask = x_mask
        _async_load(x_rings[j].index(stage), x_ptrs + (k0 + j * QUARTER), mask=mask)
    for g in gl.static_range(GROUPS):
        row = ((k0 + g * GROUP) // GROUP) * stride_sk
        _async_load(s_ring.index(stage * GROUPS + g), s_ptrs + row, mask=s_mask)
        if HAS_ZP:
            _async_load(z_ring.index(stage * GROUPS + g), z_ptrs + row, mask=z_mask)


@gluon.jit
def _quarter(words, s_ring, z_ring, stage, j: gl.constexpr, GROUP: gl.constexpr, GROUPS: gl.constexpr,
             HAS_ZP: gl.constexpr, CODE_OFFSET: gl.constexpr, CT: gl.constexpr, layout: gl.constexpr):
    """Dequantized weights of quarter j of the tile in `words`: wgmma's register operand."""
    if CT == gl.float16:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
        P: gl.constexpr = 1024.0
    else:
        P: gl.constexpr = 128.0
    row = stage * GROUPS + (j * QUARTER) // GROUP if GROUPS > 1 else stage
    rows_l: gl.constexpr = gl.SliceLayout(1, layout)
    s = gl.expand_dims(s_ring.index(row).load(rows_l).to(gl.float32).to(CT), 1)
    if HAS_ZP:
        z = gl.expand_dims(z_ring.index(row).load(rows_l).to(CT) + P, 1)
    else:
        z = gl.full(s.shape, P + CODE_OFFSET, CT, layout=s.type.layout)  # a float constant would promote to fp32
    # Codes and zeros are below 16: the subtraction is exact in CT, so the only rounding is the
    # scale's multiply, as in the reference.
    return (_nibble(words, j, CT) - z) * s


@gluon.jit
def moe_w4a16_wgmma_kernel(
    a_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    zero_ptr, N, K, num_valid, zero_numel, zero_chunk, alpha, limit,
    stride_am, stride_be, stride_bn, stride_bt, stride_se, stride_sk, stride_biase, stride_cm,
    GROUP: gl.constexpr, HAS_ZP: gl.constexpr, CODE_OFFSET: gl.constexpr, HAS_BIAS: gl.constexpr,
    A_ROWS_DIV: gl.constexpr, MUL_ROUTED: gl.constexpr, REDUCE_TOPK: gl.constexpr, ATOMIC: gl.constexpr,
    ACT: gl.constexpr, GATE_UP_CHUNK: gl.constexpr, ZERO_SIDE: gl.constexpr, SPLIT_K: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, K_TAIL: gl.constexpr,
):
    NW: gl.constexpr = gl.num_warps()
    CT: gl.constexpr = a_ptr.dtype.element_ty
    TILE_K: gl.constexpr = 4 * QUARTER
    GROUPS: gl.constexpr = TILE_K // GROUP if GROUP < TILE_K else 1  # scale rows per K tile
    gl.static_assert(STAGES >= 3, "the ring needs three stages (module docstring)")
    gl.static_assert(BLOCK_N % (16 * NW) == 0, "each warp owns 16-row slices of BLOCK_N (wgmma)")
    gl.static_assert(GROUP % QUARTER == 0, "each quarter lies in one scale group")
    # N tiles vary fastest in the launch order: the programs running together share one block of
    # gathered activation rows (read from DRAM once, then from L2) and a few experts' weights.
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    if ZERO_SIDE:
        # A side job: clear the next GEMM's fp32 sums (zero bits), a slice per program.
        zl: gl.constexpr = gl.BlockedLayout([4], [32], [NW], [0])
        pid = (pid_m * gl.num_programs(0) + pid_n) * gl.num_programs(2) + gl.program_id(2)
        z_end = gl.minimum(pid * zero_chunk + zero_chunk, zero_numel)
        for zero_start in range(pid * zero_chunk, z_end, _ZERO_BLOCK):
            z_offs = zero_start + gl.arange(0, _ZERO_BLOCK, layout=zl)
            gl.store(zero_ptr + z_offs, gl.zeros([_ZERO_BLOCK], gl.int32, layout=zl), mask=z_offs < z_end)
    k_tiles = gl.cdiv(K, TILE_K)
    per_split = gl.cdiv(k_tiles, SPLIT_K)
    kt0 = gl.program_id(2) * per_split
    kt1 = gl.minimum(kt0 + per_split, k_tiles)
    if kt0 >= kt1:
        return
    if pid_m * BLOCK_M >= gl.load(num_post_ptr):
        return
    e = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
    if e < 0:  # another rank's expert: its pairs add nothing and their rows are never read
        return
    n0 = pid_n * BLOCK_N

    # Copy-side addressing, computed once: rows of activations (gathered), words, scale rows.
    cp: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [NW, 1], [1, 0])  # 16 bytes per thread and copy
    k_in_q = gl.arange(0, QUARTER, layout=gl.SliceLayout(0, cp))
    ids_cp = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, cp)))
    x_ptrs = a_ptr + (ids_cp // A_ROWS_DIV).to(gl.int64)[:, None] * stride_am + k_in_q[None, :]
    x_mask = (ids_cp < num_valid)[:, None]
    n_cp = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cp))
    w_ptrs = b_ptr + e * stride_be + n_cp[:, None] * stride_bn + k_in_q[None, :]
    w_mask = (n_cp < N)[:, None]
    s_l: gl.constexpr = _row_copy_layout(s_ptr.dtype.element_ty, NW)
    n_s = n0 + gl.arange(0, BLOCK_N, layout=s_l)
    s_ptrs = s_ptr + e * stride_se + n_s
    z_l: gl.constexpr = _row_copy_layout(z_ptr.dtype.element_ty, NW)
    n_z = n0 + gl.arange(0, BLOCK_N, layout=z_l)
    z_ptrs = z_ptr + e * stride_se + n_z

    x_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, QUARTER], CT)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    x_rings = (gl.allocate_shared_memory(CT, [STAGES, BLOCK_M, QUARTER], x_sl),
               gl.allocate_shared_memory(CT, [STAGES, BLOCK_M, QUARTER], x_sl),
               gl.allocate_shared_memory(CT, [STAGES, BLOCK_M, QUARTER], x_sl),
               gl.allocate_shared_memory(CT, [STAGES, BLOCK_M, QUARTER], x_sl))
    w_ring = gl.allocate_shared_memory(gl.int16, [STAGES, BLOCK_N, QUARTER], flat)
    rows: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    s_ring = gl.allocate_shared_memory(s_ptr.dtype.element_ty, [STAGES * GROUPS, BLOCK_N], rows)
    z_ring = gl.allocate_shared_memory(z_ptr.dtype.element_ty, [STAGES * GROUPS if HAS_ZP else 1, BLOCK_N], rows)
    for t in gl.static_range(STAGES - 2):
        if kt0 + t < kt1:
            _issue_tile(x_rings, w_ring, s_ring, z_ring, t, kt0 + t, x_ptrs, x_mask, w_ptrs, w_mask, s_ptrs, z_ptrs,
                        n_s < N, n_z < N, k_in_q, K, stride_bt, stride_sk, GROUP, GROUPS, HAS_ZP, K_TAIL)
        async_copy.commit_group()

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                  instr_shape=[16, BLOCK_M, 16])
    w_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
    for kt in range(kt0, kt1):
        i = kt - kt0
        stage = i % STAGES
        async_copy.wait_group(STAGES - 3)
        fence_async_shared()
        _cta_barrier()
        if kt + STAGES - 2 < kt1:
            _issue_tile(x_rings, w_ring, s_ring, z_ring, (i + STAGES - 2) % STAGES, kt + STAGES - 2, x_ptrs, x_mask,
                        w_ptrs, w_mask, s_ptrs, z_ptrs, n_s < N, n_z < N, k_in_q, K, stride_bt, stride_sk, GROUP,
                        GROUPS, HAS_ZP, K_TAIL)
        async_copy.commit_group()
        words = w_ring.index(stage).load(w_op)
        # Quarter j's MMA runs while quarter j + 1 is unpacked; one MMA stays in flight at each wait.
        w0 = _quarter(words, s_ring, z_ring, stage, 0, GROUP, GROUPS, HAS_ZP, CODE_OFFSET, CT, w_op)
        acc = warpgroup_mma(w0, x_rings[0].index(stage).permute((1, 0)), acc, is_async=True)
        w1 = _quarter(words, s_ring, z_ring, stage, 1, GROUP, GROUPS, HAS_ZP, CODE_OFFSET, CT, w_op)
        acc = warpgroup_mma(w1, x_rings[1].index(stage).permute((1, 0)), acc, is_async=True)
        acc, w0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, w0))
        w2 = _quarter(words, s_ring, z_ring, stage, 2, GROUP, GROUPS, HAS_ZP, CODE_OFFSET, CT, w_op)
        acc = warpgroup_mma(w2, x_rings[2].index(stage).permute((1, 0)), acc, is_async=True)
        acc, w1 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, w1))
        w3 = _quarter(words, s_ring, z_ring, stage, 3, GROUP, GROUPS, HAS_ZP, CODE_OFFSET, CT, w_op)
        acc = warpgroup_mma(w3, x_rings[3].index(stage).permute((1, 0)), acc, is_async=True)
        acc, w2 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, w2))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    async_copy.wait_group(0)

    # Epilogue in a layout whose threads run along N, the contiguous dimension of the output rows.
    out_l: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, NW], [0, 1])
    res = gl.convert_layout(acc, out_l)
    offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_l))
    n_mask = offs_n < N
    ids = gl.load(sorted_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_l)))
    rows_ok = ids < num_valid
    out_rows = (ids // REDUCE_TOPK).to(gl.int64)
    if HAS_BIAS:  # noqa: SIM102 (HAS_BIAS is a compile-time switch, kt0 a run-time value)
        if kt0 == 0:  # once per output, not once per K-split
            res += gl.load(bias_ptr + e * stride_biase + offs_n, mask=n_mask, other=0.0).to(gl.float32)[:, None]
    if MUL_ROUTED:
        res *= gl.load(topk_w_ptr + ids, mask=rows_ok, other=0.0).to(gl.float32)[None, :]
    if ATOMIC:
        gl.atomic_add(c_ptr + out_rows[None, :] * stride_cm + offs_n[:, None], res,
                      mask=n_mask[:, None] & rows_ok[None, :], sem="relaxed")
    elif GATE_UP_CHUNK > 0:
        # The tile's rows are [gate chunk | up chunk] pairs: paired through shared memory.
        buf = gl.allocate_shared_memory(gl.float32, [BLOCK_N, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0, 1]))
        buf.store(res)
        _cta_barrier()
        for c in gl.static_range(BLOCK_N // (2 * GATE_UP_CHUNK)):
            gate = buf.slice(2 * c * GATE_UP_CHUNK, GATE_UP_CHUNK).load(out_l)
            up = buf.slice((2 * c + 1) * GATE_UP_CHUNK, GATE_UP_CHUNK).load(out_l)
            y = activate(gate, up, alpha, limit, ACT)
            cols = pid_n * (BLOCK_N // 2) + c * GATE_UP_CHUNK + gl.arange(0, GATE_UP_CHUNK,
                                                                          layout=gl.SliceLayout(1, out_l))
            gl.store(c_ptr + out_rows[None, :] * stride_cm + cols[:, None], y.to(c_ptr.dtype.element_ty),
                     mask=(cols < N // 2)[:, None] & rows_ok[None, :])
    else:
        y = activate(res, res, alpha, limit, ACT)
        gl.store(c_ptr + out_rows[None, :] * stride_cm + offs_n[:, None], y.to(c_ptr.dtype.element_ty),
                 mask=n_mask[:, None] & rows_ok[None, :])
