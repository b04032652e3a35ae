"""One Triton grouped GEMM for every quantized weight type, over align-sorted (token, k) pairs.

A program owns one M-block of sorted pairs (all of one expert), one N-tile and one K-split. It
streams the expert's weights once per (M-block, N-tile), dequantizes them in registers and feeds
`tl.dot`; small M is parallelised over N and K (split-K with fp32 atomics) so that enough programs
stream weights at once to saturate memory bandwidth. `moe_gemm_direct` skips the alignment: a
block per pair, read from topk_ids (one token's top-k choices are distinct experts).
A tile's result goes to one `Sink`: stored once (after GEMM1's activation, when its columns are
interleaved gate/up chunks), added atomically into fp32 sums, or added and finished row by row by
its last contributor (`LastArrival`). A launch may also zero the next GEMM's sums on the side.
On Hopper and later every launch is programmatically dependent (`moe_triton._details.pdl`): its
programs wait for the kernel before (griddepcontrol.wait) before they write anything or read what
it may have written, then let the next launch start, so launch latency hides behind the previous
kernel. A one-token GEMM2 of int4 quads uses that head start too: before its wait it asks L2 for
its first K tiles of weights (PREFETCH_TILES, a bulk prefetch), which arrive while GEMM1 runs.
Aligned launches above the decode sizes put N tiles first in the launch order (N_FIRST): the
programs running together then share one block of gathered activation rows, read from DRAM once
and from L2 for the other N tiles; M first, every N tile re-read them from DRAM (1.05-1.20x slower
layers on the H100 at 2048 and 8192 tokens, benchmarks/results/int4_wgmma_n_first_2026-11-21.md).
A configuration with `narrow` runs an aligned block whose second half is padding (an expert's last)
over its first half only: half the MMA rows for the same dequantized weights (`_wgemm_rows` is
compiled for both row counts). Grouping M blocks per N tile (as the bf16 GEMM's group_m does, so an
expert's blocks share weight tiles in L2) measured no faster on the H100 at 128-8192 tokens
(benchmarks/results/int4_narrow_session18_2026-11-22.md).
A configuration with `tail` (int4 quads) has a full block take in its expert's next block when that
holds at most `tail` valid pairs (that expert's last): a second accumulator of `tail` columns fed by
the same dequantized weights, its rows through the same epilogue, and the next block's program
exits, so the expert's weights are dequantized once less. At 32 pairs per expert (512 tokens of
the top-8 presets) random routing spills about half the experts into a second block; tail16 made
those layers 1.12-1.16x faster on the H100; where `narrow` already cut the spilled blocks' cost,
and with 64-pair blocks (whose second accumulator spills registers), it was slower
(benchmarks/results/int4_tl_dot_tail_session20_2026-11-22.md).
A configuration with `wgmma` runs int4 quads on `quant_gemm_wgmma` instead (Gluon, Hopper only:
warp-specialized: two consumer warpgroups per program, and a producer warpgroup for blocks of
at most 64 pairs).

Weight operand layouts (`WeightOperand`, built by `moe_triton.quantized`'s processors). Both 4-bit
layouts are tensors indexed [E, N, K tile, word] that the kernel reads through strides; the memory
order is the one the H100 streamed fastest (benchmarks/results/int4_tile_major_2026-11-21.md).
- INT4 with 128-wide K tiles: int16 [E, N, cdiv(K, block_k), block_k/4] ("quads"), stored
  tile-major ([E, K tile, N, word] in memory: one program's N x K tile of weights is one contiguous
  run of block_n * 64 bytes; stored row-major the tile was 64-byte pieces of block_n rows, and the
  whole layer 1.06-1.42x slower at M <= 512). Word i of K tile t holds in nibble j (bits 4j..4j+3)
  the code of k = t*block_k + j*block_k/4 + i. The kernel runs swapped (weights as the MMA's A
  operand, in registers) and loads the words straight into that operand's register layout, where
  each 32-bit register holds two neighbouring words: one shift and one lop3 per register give
  nibble j of both as a 16-bit float pair (`_unpack_quads`), the operand of the j-th of four dots
  over contiguous K quarters. About 3.0 SASS instructions per weight in the K loop (sm_90, triton
  3.6, 16 x 128 tile, 4 warps; 2.65 when the scale is applied after the dots, see POST_SCALE)
  against 4.5 for the halves layout below, whose bytes reach the MMA layout two at a time.
  A K that 128 does not divide (gpt-oss's 2880) is padded to whole tiles when its scale groups
  divide the padded K: the padding's scale rows are zero, so its weights dequantize to exactly 0,
  and the kernel masks the activations' columns past K (K_TAIL). gpt-oss's int4 layer then took
  0.86-0.94x the halves layout's time on the H100 at M = 8..512, about the same at M = 1 and
  1.07-1.08x at M >= 2048 (benchmarks/results/int4_pdl_padded_quads_2026-11-21.md).
- INT4 that cannot be padded so (per-channel scales, K % 128 != 0), and MXFP4: uint8 [E, N, K/block_k,
  block_k/2] ("halves"), stored K-major ([E, K tile, byte, N] in memory: a program's tile is
  block_k/2 runs of block_n bytes; tile-major, gpt-oss's int4 layer was 5-16% slower and MXFP4
  within 5%). Byte i of K tile t holds k = t*block_k + i in its low nibble and
  k = t*block_k + block_k/2 + i in its high nibble: two dots over K halves. Quarters of a 64-wide
  tile would be 16-deep dots, each waited for (Triton keeps only a loop's last dot with a register
  operand in flight); on the H100 that was slower for gpt-oss at every M up to 2048.
- INT8 / FP8: the canonical [E, N, K] codes, read through strides (K contiguous).
Scales and zero points are [E, K/group, N] (N contiguous) for INT4/INT8/MXFP4; fp8 keeps its
canonical scales ([E], [E, N] or [E, N/128, K/128] blocks).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moe_core.config import Activation
from moe_core.weights.packing import E2M1_VALUES
from moe_triton._details.gemm_kernels import activate
from moe_triton._details.pdl import dependent_launch, dependent_options, wait_then_release
from moe_triton._details.quant_act import act_kind
from moe_triton.configs import GemmConfig

__all__ = ["AScale", "GemmConfig", "LastArrival", "WType", "WeightOperand", "effective_split", "moe_gemm",
           "moe_gemm_direct", "moe_gemm_torch", "pack_int4_quads", "pack_int4_tiles", "pick_config",
           "stored_k_major", "stored_tile_major", "unpack_int4_quads", "unpack_int4_tiles", "wgmma_capable",
           "zeroed_int32"]


class WType(enum.IntEnum):
    INT4 = 0
    INT8 = 1
    FP8 = 2
    MXFP4 = 3


class AScale(enum.IntEnum):
    """Scales of fp8 activations; weights: the matching fp8 weight scale granularity."""

    NONE = 0  # 16-bit activations
    ROW = 1  # one scale per A row (per-token, and per-tensor expanded to rows), weights per tensor or channel
    GROUP = 2  # one per (row, 128 k), weights in 128x128 blocks


@dataclass(frozen=True)
class WeightOperand:
    """One GEMM's weights in kernel layout.

    Invariants: `codes` follows the module docstring's layout for `wtype`; `n`, `k` are the GEMM's
    output and input sizes; `block_k` divides k, except for int4 quads, whose codes, scales and
    zero points cover `k_tiles` whole tiles and dequantize to 0 past k; for grouped int/mxfp4
    scales each block_k/4 (int4 quads), block_k/2 (halves) or block_k (int8) slice of K lies inside
    one scale group; `group` is the K extent of one scale row (k itself for per-channel).
    """

    wtype: WType
    codes: torch.Tensor
    scale: torch.Tensor  # see module docstring
    zero: torch.Tensor | None  # uint8, like scale (INT4/INT8 with integer zero points)
    n: int
    k: int
    group: int  # K per scale row; 0 for fp8 (granularity comes from AScale)
    block_k: int
    code_offset: int  # implicit zero when `zero` is None (8, 128), 0 otherwise

    @property
    def num_experts(self) -> int:
        return self.codes.shape[0]

    @property
    def quads(self) -> bool:
        """INT4 codes in the quads layout (int16 words); the halves layout is uint8."""
        return self.wtype is WType.INT4 and self.codes.dtype == torch.int16

    @property
    def k_tiles(self) -> int:
        """K tiles the kernel loops over (the last one padded past k for quads, see the invariants)."""
        return -(-self.k // self.block_k)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# ---- int4/mxfp4 tile packing (pure torch, used by the processors and the twin) -----------------


def stored_tile_major(words: torch.Tensor) -> torch.Tensor:
    """[E, N, K tile, word] values stored as [E, K tile, N, word] (the quads' order)."""
    return words.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


def stored_k_major(words: torch.Tensor) -> torch.Tensor:
    """[E, N, K tile, word] values stored as [E, K tile, word, N] (the halves' order)."""
    return words.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def pack_int4_tiles(codes: torch.Tensor, block_k: int) -> torch.Tensor:
    """Canonical packed [E, R, K/2] (even k low) -> halves layout uint8 [E, R, K/block_k, block_k/2],
    stored K-major (module docstring)."""
    E, R, half = codes.shape
    K = half * 2
    if K % block_k:
        raise ValueError(f"block_k={block_k} does not divide K={K}")
    lo, hi = codes & 0xF, codes >> 4
    full = torch.stack((lo, hi), dim=-1).view(E, R, K // block_k, 2, block_k // 2)  # [.., tile, half, i]
    return stored_k_major(full[..., 0, :] | (full[..., 1, :] << 4))


def unpack_int4_tiles(packed: torch.Tensor) -> torch.Tensor:
    """Halves layout uint8 [E, R, K tiles, block_k/2] (any strides) -> codes uint8 [E, R, K] (0..15)."""
    E, R, T, H = packed.shape
    t = packed.unsqueeze(3)
    return torch.cat((t & 0xF, t >> 4), dim=3).reshape(E, R, T * 2 * H)


def pack_int4_quads(codes: torch.Tensor, block_k: int) -> torch.Tensor:
    """Canonical packed [E, R, K/2] (even k low) -> quads layout int16 [E, R, K/block_k, block_k/4],
    stored tile-major (module docstring)."""
    E, R, half = codes.shape
    K = half * 2
    if K % block_k or block_k % 4:
        raise ValueError(f"block_k={block_k} must be a multiple of 4 dividing K={K}")
    T, Q = K // block_k, block_k // 4
    out = torch.empty(E, T, R, Q, dtype=torch.int16, device=codes.device)
    # Built one expert at a time into the tile-major buffer: the int32 temporaries of a whole layer
    # would need tens of GB.
    for e in range(E):
        c = codes[e]
        full = torch.stack((c & 0xF, c >> 4), dim=-1).view(R, T, 4, Q).to(torch.int32)
        words = full[..., 0, :] | (full[..., 1, :] << 4) | (full[..., 2, :] << 8) | (full[..., 3, :] << 12)
        out[e] = (words - ((words >> 15) << 16)).to(torch.int16).transpose(0, 1)  # two's complement
    return out.permute(0, 2, 1, 3)


def unpack_int4_quads(words: torch.Tensor) -> torch.Tensor:
    """Quads layout int16 [E, R, K tiles, block_k/4] (any strides) -> codes uint8 [E, R, K] (0..15)."""
    E, R, T, Q = words.shape
    w = words.to(torch.int32).unsqueeze(3) & 0xFFFF
    return torch.cat([(w >> (4 * j)) & 0xF for j in range(4)], dim=3).reshape(E, R, T * 4 * Q).to(torch.uint8)


# ---- the kernel -----------------------------------------------------------------------------

# One 32-bit register = two int16 words of the INT4 layout. Output j: nibble j of each word ORed
# into the mantissa of the 16-bit float 128 (bf16) or 1024 (fp16), whose ulp is 1: the pair
# (P + code_lo, P + code_hi), exact. lop3 0xEA is (a & b) | c.
_QUAD_ASM = """{
.reg .b32 t<3>;
lop3.b32 $0, $4, 0x000F000F, MAGIC, 0xEA;
shr.u32 t0, $4, 4;
lop3.b32 $1, t0, 0x000F000F, MAGIC, 0xEA;
shr.u32 t1, $4, 8;
lop3.b32 $2, t1, 0x000F000F, MAGIC, 0xEA;
shr.u32 t2, $4, 12;
lop3.b32 $3, t2, 0x000F000F, MAGIC, 0xEA;
}"""
_QUAD_ASM_BF16 = tl.constexpr(_QUAD_ASM.replace("MAGIC", "0x43004300"))
_QUAD_ASM_FP16 = tl.constexpr(_QUAD_ASM.replace("MAGIC", "0x64006400"))

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
    """L2 prefetches of one program's int4 quads weights: K tiles kt0..kt1 of rows n0.. (stored
    tile-major, so one tile's rows are one run) and the scale (and zero-point) rows they use
    (N contiguous)."""
    QK: tl.constexpr = BLOCK_K // 4
    rows = tl.minimum(N - n0, BLOCK_N)
    for kt in range(kt0, kt1):
        _prefetch_l2(b_ptr + e * stride_be + kt * stride_bt + n0 * QK, rows * QK * 2)
    scale_bytes: tl.constexpr = s_ptr.dtype.element_ty.primitive_bitwidth // 8
    for g in range(kt0 * BLOCK_K // GROUP, tl.cdiv(kt1 * BLOCK_K, GROUP)):
        _prefetch_l2(s_ptr + e * stride_se + g * stride_sk + n0, rows * scale_bytes)
        if HAS_ZP:
            _prefetch_l2(z_ptr + e * stride_se + g * stride_sk + n0, rows)


@triton.jit
def _e2m1(codes, CT: tl.constexpr):
    """e2m1 codes (below 16) -> their exact values in CT (bf16 or fp32: fp16 cannot hold the subnormal below).

    The code's exponent and mantissa bits go to the top of CT's exponent and mantissa fields, its
    sign to the sign bit: exponent 0 then lands on a subnormal of the same relative size as e2m1's
    (0.5 = 2^-1 * 1), so one multiply by 2^126 makes every value exact. Bit operations only: no
    table, no int -> float conversion."""
    c = codes.to(tl.int32)
    if CT == tl.float32:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
        bits = ((c & 7) << 22) | ((c & 8) << 28)
    else:
        tl.static_assert(CT == tl.bfloat16, "e2m1 values are built in bf16 or fp32")  # noqa: SIM300
        bits = (((c & 7) << 6) | ((c & 8) << 12)).to(tl.int16)
    return bits.to(CT, bitcast=True) * 8.507059173023462e37  # 2^126


@triton.jit
def _unpack_quads(words, CT: tl.constexpr, PTX: tl.constexpr):
    """int16 words (quads) -> four tensors of P + code (P = 128 in bf16, 1024 in fp16, 2^23 in fp32):
    nibble j of each word, exact. PTX: lop3 on register pairs (NVIDIA); else portable shifts."""
    if PTX:
        if CT == tl.bfloat16:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
            vals = tl.inline_asm_elementwise(_QUAD_ASM_BF16, "=r,=r,=r,=r,r", [words], is_pure=True, pack=2,
                                             dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16))
        else:
            vals = tl.inline_asm_elementwise(_QUAD_ASM_FP16, "=r,=r,=r,=r,r", [words], is_pure=True, pack=2,
                                             dtype=(tl.float16, tl.float16, tl.float16, tl.float16))
        return vals
    return (_biased(words & 0xF, CT), _biased((words >> 4) & 0xF, CT), _biased((words >> 8) & 0xF, CT),
            _biased((words >> 12) & 0xF, CT))


@triton.jit
def _biased(codes, CT: tl.constexpr):
    """Codes below 16 -> P + code in CT (P = 2^23 in fp32, 128 in bf16, 1024 in fp16: the power of
    two whose ulp is 1), by ORing the code into P's mantissa: exact, and cheaper than an integer
    -> float conversion, which issues at a fraction of the FMA rate."""
    if CT == tl.float32:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
        return (codes.to(tl.int32) | tl.full(codes.shape, 0x4B000000, tl.int32)).to(CT, bitcast=True)
    elif CT == tl.bfloat16:  # noqa: SIM300
        return (codes.to(tl.int16) | tl.full(codes.shape, 0x4300, tl.int16)).to(CT, bitcast=True)
    else:
        return (codes.to(tl.int16) | tl.full(codes.shape, 0x6400, tl.int16)).to(CT, bitcast=True)


@triton.jit
def _int4_zero(zero_ptrs, n_mask, HAS_ZP: tl.constexpr, CODE_OFFSET: tl.constexpr, CT: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """One scale group's P + zero point in CT (P of `_biased`), [BN, 1]."""
    if CT == tl.float32:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
        P: tl.constexpr = 8388608.0
    elif CT == tl.bfloat16:  # noqa: SIM300
        P: tl.constexpr = 128.0
    else:
        P: tl.constexpr = 1024.0
    if HAS_ZP:
        return tl.expand_dims(tl.load(zero_ptrs, mask=n_mask, other=0).to(CT) + P, 1)
    return tl.full((BLOCK_N, 1), P + CODE_OFFSET, CT)


@triton.jit
def _int4_group(scale_ptrs, zero_ptrs, n_mask, HAS_ZP: tl.constexpr, CODE_OFFSET: tl.constexpr, CT: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """One scale group's [BN, 1] scale and P + zero point in CT (P of `_biased`), N along axis 0."""
    # Through fp32: the interpreter mishandles a direct bf16 -> fp16 cast.
    s = tl.expand_dims(tl.load(scale_ptrs, mask=n_mask, other=0.0).to(tl.float32).to(CT), 1)
    return s, _int4_zero(zero_ptrs, n_mask, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)


@triton.jit
def _dot_at(w, a_ptrs, row_mask, k, K, acc_t, CT: tl.constexpr, K_TAIL: tl.constexpr):
    """acc_t + w . A^T, A's [BM, k] tile read at a_ptrs (masked rows, and with K_TAIL columns k >= K,
    read as zeros)."""
    mask = row_mask[:, None] & (k < K)[None, :] if K_TAIL else row_mask[:, None]
    return tl.dot(w, tl.trans(tl.load(a_ptrs, mask=mask, other=0.0).to(CT)), acc_t)


@triton.jit
def _dequant(codes, scale_ptrs, zero_ptrs, n_mask, WTYPE: tl.constexpr, HAS_ZP: tl.constexpr,
             CODE_OFFSET: tl.constexpr, CT: tl.constexpr, N_AXIS: tl.constexpr):
    """INT4 (halves) / INT8 / MXFP4 codes tile, N along axis N_AXIS -> values in CT; scale_ptrs/zero_ptrs
    [BN]: the group's row."""
    if WTYPE == 0:
        tl.static_assert(N_AXIS == 0, "int4 runs swapped only")
        s, z = _int4_group(scale_ptrs, zero_ptrs, n_mask, HAS_ZP, CODE_OFFSET, CT, codes.shape[0])
        return (_biased(codes, CT) - z) * s
    if WTYPE == 3:
        scale = tl.expand_dims(tl.exp2(tl.load(scale_ptrs, mask=n_mask, other=127).to(tl.float32) - 127.0), 1 - N_AXIS)
        # One return: after `if CONSTEXPR: return`, Triton 3.6 still compiles the code that follows.
        if CT == tl.float16:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
            # 2^(s - 127) leaves fp16's range for many e8m0 exponents: scale in fp32.
            values = (_e2m1(codes, tl.float32) * scale).to(CT)
        else:
            values = _e2m1(codes, CT) * scale.to(CT)  # powers of two: bf16 and fp32 hold every e8m0 scale
        return values
    # Through fp32: the interpreter mishandles a direct bf16 -> fp16 cast.
    s = tl.expand_dims(tl.load(scale_ptrs, mask=n_mask, other=0.0).to(tl.float32).to(CT), 1 - N_AXIS)
    if HAS_ZP:
        z = tl.expand_dims(tl.load(zero_ptrs, mask=n_mask, other=0).to(CT), 1 - N_AXIS)
        # codes and zeros are small integers: exact in CT, so one rounding as in the reference.
        return (codes.to(CT) - z) * s
    return (codes.to(CT) - CODE_OFFSET) * s


_ZERO_BLOCK = tl.constexpr(512)  # elements per store of the zeroing side job


@triton.jit
def _store_finished(out_ptr, acc, out_rows, row_mask, pid_n, N, stride_om, alpha, limit, ACT: tl.constexpr,
                    GATE_UP_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stores a [BM, BLOCK_N] tile of whole sums (GEMM columns pid_n * BLOCK_N + i of N) after the
    activation (identity when ACT is 0). GATE_UP_CHUNK > 0: the tile's columns are interleaved
    gate/up chunks (`quant_act.interleaved_gate_up_rows`), so it yields BLOCK_N / 2 outputs."""
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
            stride_fm, alpha, limit, ACT: tl.constexpr, GATE_UP_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr):
    """Counts one program's contribution to its rows of an N tile (partial sums already added to
    sums_ptr; one counter per (output row, N tile)); the last of a row's `expected` contributors
    reads the row's whole sums and stores it finished."""
    # Every thread's atomics are issued before the acquire-release counts publish them.
    tl.debug_barrier()
    counters = arrivals_ptr + out_rows * tl.num_programs(1) + pid_n
    last = row_mask & (tl.atomic_add(counters, 1, mask=row_mask, sem="acq_rel") == expected - 1)
    # Read at L2, where the other programs' atomics landed.
    tile = tl.load(sums_ptr + out_rows[:, None] * stride_sm + offs_n[None, :], mask=last[:, None] & n_mask[None, :],
                   other=0.0, cache_modifier=".cg")
    _store_finished(fin_ptr, tile, out_rows, last, pid_n, N, stride_fm, alpha, limit, ACT, GATE_UP_CHUNK, BLOCK_N)


@triton.jit
def _moe_wgemm_kernel(
    a_ptr, a_scale_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr, topk_w_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr, fin_ptr, arrivals_ptr, zero_ptr,
    N, K, num_valid, expected, zero_numel, zero_chunk, alpha, limit,
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
    QUADS: tl.constexpr, PTX_UNPACK: tl.constexpr, POST_SCALE: tl.constexpr, PDL: tl.constexpr,
    K_TAIL: tl.constexpr, N_FIRST: tl.constexpr, NARROW: tl.constexpr, PREFETCH_TILES: tl.constexpr,
    TAIL: tl.constexpr,
):
    if N_FIRST:
        # N tiles vary fastest in the launch order: the programs running together share one block
        # of gathered activation rows (read from DRAM once, then from L2) and a few experts' weights.
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
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
        # after GEMM1's tail. It reads only topk_ids, complete before the kernel ahead passed its
        # own wait (no launch can start before that), the expert map and the weights.
        tl.static_assert(DIRECT and QUADS and PDL, "L2 prefetch: dependent direct launches of int4 quads")
        pre_e = tl.load(sorted_ids_ptr + pid_m)
        if HAS_MAP:
            pre_e = tl.load(expert_ids_ptr + pre_e)
        if pre_e >= 0:
            _prefetch_weights_l2(b_ptr, s_ptr, z_ptr, pre_e.to(tl.int64), pid_n * BLOCK_N, N, kt0,
                                 tl.minimum(kt1, kt0 + PREFETCH_TILES), stride_be, stride_bt, stride_se, stride_sk,
                                 HAS_ZP, GROUP, BLOCK_N, BLOCK_K)
    # Launched while the previous kernel may still run (programmatic dependent launch).
    wait_then_release(PDL)
    if ZERO_SIDE:
        # A side job: clear the next GEMM's int32/fp32 accumulators (zero bits), a slice per program,
        # which saves that GEMM a fill launch.
        pid = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)
        z_end = tl.minimum(pid * zero_chunk + zero_chunk, zero_numel)
        for zero_start in range(pid * zero_chunk, z_end, _ZERO_BLOCK):
            z_offs = zero_start + tl.arange(0, _ZERO_BLOCK)
            tl.store(zero_ptr + z_offs, tl.zeros((_ZERO_BLOCK,), tl.int32), mask=z_offs < z_end)
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
        tl.static_assert(WTYPE == 0 and QUADS and SWAP_AB and not POST_SCALE and TAIL < BLOCK_M,
                         "taken-in tails: int4 quads, swapped, scaled per weight, TAIL below BLOCK_M")
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
    # Valid pairs are a prefix of the block (the alignment pads each expert's last block). Without
    # NARROW (TAIL) this is False at compile time and only the whole block's code is built.
    narrow = NARROW and tl.load(sorted_ids_ptr + pid_m * BLOCK_M + BLOCK_M // 2) >= num_valid
    # (Compile-time values lose that status in a tuple: they are spelled out per call.)
    if absorbs:
        _wgemm_rows(*tile, GROUP, WTYPE, A_SCALE, W_SCALE_PER_N, HAS_ZP, CODE_OFFSET, HAS_BIAS, A_ROWS_DIV,
                    MUL_ROUTED, REDUCE_TOPK, SINK, ACT, GATE_UP_CHUNK, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB, UPCAST,
                    DIRECT, QUADS, PTX_UNPACK, POST_SCALE, K_TAIL, BLOCK_M, TAIL)
    elif narrow:
        _wgemm_rows(*tile, GROUP, WTYPE, A_SCALE, W_SCALE_PER_N, HAS_ZP, CODE_OFFSET, HAS_BIAS, A_ROWS_DIV,
                    MUL_ROUTED, REDUCE_TOPK, SINK, ACT, GATE_UP_CHUNK, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB, UPCAST,
                    DIRECT, QUADS, PTX_UNPACK, POST_SCALE, K_TAIL, BLOCK_M // 2, 0)
    else:
        _wgemm_rows(*tile, GROUP, WTYPE, A_SCALE, W_SCALE_PER_N, HAS_ZP, CODE_OFFSET, HAS_BIAS, A_ROWS_DIV,
                    MUL_ROUTED, REDUCE_TOPK, SINK, ACT, GATE_UP_CHUNK, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB, UPCAST,
                    DIRECT, QUADS, PTX_UNPACK, POST_SCALE, K_TAIL, BLOCK_M, 0)


@triton.jit
def _block_ids(sorted_ids_ptr, pid_m, num_valid, DIRECT: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr):
    """Pair ids of block pid_m's first ROWS rows; num_valid marks padding."""
    if DIRECT:
        ids = tl.where(tl.arange(0, ROWS) == 0, pid_m, num_valid)
    else:
        ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, ROWS))
    return ids


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
    PTX_UNPACK: tl.constexpr, POST_SCALE: tl.constexpr, K_TAIL: tl.constexpr, ROWS: tl.constexpr,
    TAIL: tl.constexpr,
):
    """`_moe_wgemm_kernel`'s product and sink over the first ROWS pairs of block pid_m (expert e,
    N tile pid_n, K tiles [kt0, kt1)), and with TAIL over the next block's first TAIL pairs too
    (int4 quads: a second accumulator fed by the same dequantized weights)."""
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
    a_base = a_ptr + a_rows[:, None] * stride_am
    b_base = b_ptr + e * stride_be + offs_n[None, :] * stride_bn
    bt_base = b_ptr + e * stride_be + offs_n[:, None] * stride_bn
    s_base = s_ptr + e * stride_se + offs_n * stride_sn
    z_base = z_ptr + e * stride_se + offs_n * stride_sn
    if SWAP_AB:
        acc_t = tl.zeros((BLOCK_N, ROWS), dtype=tl.float32)
    else:
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)

    if WTYPE == 0 and QUADS:
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
        for kt in range(kt0, kt1):
            k0 = kt * BLOCK_K
            words = tl.load(bt_base + kt * stride_bt + offs_q[None, :] * stride_bk, mask=n_mask[:, None], other=0)
            v0, v1, v2, v3 = _unpack_quads(words, CT, PTX_UNPACK)
            k = k0 + offs_q
            a_ptrs = a_base + k[None, :] * stride_ak
            g = (k0 // GROUP) * stride_sk
            if POST_SCALE:
                # The tile lies in one scale group: the zero point is subtracted in CT (exact), and the
                # scale multiplies the tile's fp32 partial product, once per output instead of per weight.
                z = _int4_zero(z_base + g, n_mask, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)
                part = _dot_at(v0 - z, a_ptrs, row_mask, k, K, tl.zeros((BLOCK_N, ROWS), dtype=tl.float32), CT,
                               K_TAIL)
                part = _dot_at(v1 - z, a_ptrs + QK * stride_ak, row_mask, k + QK, K, part, CT, K_TAIL)
                part = _dot_at(v2 - z, a_ptrs + 2 * QK * stride_ak, row_mask, k + 2 * QK, K, part, CT, K_TAIL)
                part = _dot_at(v3 - z, a_ptrs + 3 * QK * stride_ak, row_mask, k + 3 * QK, K, part, CT, K_TAIL)
                acc_t += part * tl.expand_dims(tl.load(s_base + g, mask=n_mask, other=0.0).to(tl.float32), 1)
            else:
                s0, z0 = _int4_group(s_base + g, z_base + g, n_mask, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)
                if GROUP >= BLOCK_K:  # the tile lies in one scale group: one load serves its quarters
                    s1, z1, s2, z2, s3, z3 = s0, z0, s0, z0, s0, z0
                else:
                    g = ((k0 + QK) // GROUP) * stride_sk
                    s1, z1 = _int4_group(s_base + g, z_base + g, n_mask, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)
                    g = ((k0 + 2 * QK) // GROUP) * stride_sk
                    s2, z2 = _int4_group(s_base + g, z_base + g, n_mask, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)
                    g = ((k0 + 3 * QK) // GROUP) * stride_sk
                    s3, z3 = _int4_group(s_base + g, z_base + g, n_mask, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)
                # Codes and zeros are below 16: the subtraction is exact in CT, so the only rounding is
                # the scale's multiply, as in the reference.
                values, scales, zeros = (v0, v1, v2, v3), (s0, s1, s2, s3), (z0, z1, z2, z3)
                for j in tl.static_range(4):
                    w = (values[j] - zeros[j]) * scales[j]
                    acc_t = _dot_at(w, a_ptrs + j * QK * stride_ak, row_mask, k + j * QK, K, acc_t, CT, K_TAIL)
                    if TAIL > 0:
                        tail_acc_t = _dot_at(w, tail_base + (k + j * QK)[None, :] * stride_ak, tail_mask, k + j * QK,
                                             K, tail_acc_t, CT, K_TAIL)
        acc = tl.trans(acc_t)
        if TAIL > 0:
            _finish_rows(tl.trans(tail_acc_t), tail_ids, tail_mask, (tail_ids // REDUCE_TOPK).to(tl.int64),
                         tail_a_rows, e, kt0, offs_n, n_mask, *sink_args, A_SCALE, W_SCALE_PER_N, HAS_BIAS,
                         MUL_ROUTED, SINK, ACT, GATE_UP_CHUNK, BLOCK_N)
    elif WTYPE == 0 or WTYPE == 3:
        HALF: tl.constexpr = BLOCK_K // 2
        offs_h = tl.arange(0, HALF)
        for kt in range(kt0, kt1):
            k0 = kt * BLOCK_K
            a_lo = tl.load(a_base + (k0 + offs_h)[None, :] * stride_ak, mask=row_mask[:, None], other=0.0)
            a_hi = tl.load(a_base + (k0 + HALF + offs_h)[None, :] * stride_ak, mask=row_mask[:, None], other=0.0)
            g_lo = (k0 // GROUP) * stride_sk
            g_hi = ((k0 + HALF) // GROUP) * stride_sk
            if SWAP_AB:  # as for the quads
                packed = tl.load(bt_base + kt * stride_bt + offs_h[None, :] * stride_bk, mask=n_mask[:, None],
                                 other=0)
                w_lo = _dequant(packed & 0xF, s_base + g_lo, z_base + g_lo, n_mask, WTYPE, HAS_ZP,
                                CODE_OFFSET, CT, 0)
                w_hi = _dequant(packed >> 4, s_base + g_hi, z_base + g_hi, n_mask, WTYPE, HAS_ZP,
                                CODE_OFFSET, CT, 0)
                acc_t = tl.dot(w_lo, tl.trans(a_lo.to(CT)), acc_t)
                acc_t = tl.dot(w_hi, tl.trans(a_hi.to(CT)), acc_t)
            else:
                packed = tl.load(b_base + kt * stride_bt + offs_h[:, None] * stride_bk, mask=n_mask[None, :],
                                 other=0)
                w_lo = _dequant(packed & 0xF, s_base + g_lo, z_base + g_lo, n_mask, WTYPE, HAS_ZP,
                                CODE_OFFSET, CT, 1)
                w_hi = _dequant(packed >> 4, s_base + g_hi, z_base + g_hi, n_mask, WTYPE, HAS_ZP,
                                CODE_OFFSET, CT, 1)
                acc = tl.dot(a_lo.to(CT), w_lo, acc)
                acc = tl.dot(a_hi.to(CT), w_hi, acc)
        if SWAP_AB:
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
                w = _dequant(codes, s_base + g, z_base + g, n_mask, WTYPE, HAS_ZP, CODE_OFFSET, CT, 1)
                acc = tl.dot(a.to(CT), w, acc)
            elif A_SCALE == 2:
                # 128x128 weight blocks, 1x128 activation groups: BLOCK_K divides 128.
                kb = k0 // 128
                a_s = tl.load(a_scale_ptr + a_rows * stride_asm + kb * stride_ask, mask=row_mask, other=0.0)
                w_s = tl.load(s_ptr + e * stride_se + (offs_n // 128) * stride_sn + kb * stride_sk,
                              mask=n_mask, other=0.0)
                acc += tl.dot(a, codes) * a_s[:, None] * w_s[None, :]
            else:
                # Summed outside the dot: Hopper's fp8 MMA accumulates in reduced precision, so each
                # K tile's partial result is promoted to the fp32 accumulator (as DeepSeek-V3 does).
                acc += tl.dot(a, codes)

    _finish_rows(acc, ids, row_mask, out_rows, a_rows, e, kt0, offs_n, n_mask, *sink_args, A_SCALE, W_SCALE_PER_N,
                 HAS_BIAS, MUL_ROUTED, SINK, ACT, GATE_UP_CHUNK, BLOCK_N)


@triton.jit
def _finish_rows(acc, ids, row_mask, out_rows, a_rows, e, kt0, offs_n, n_mask, a_scale_ptr, s_ptr, bias_ptr, c_ptr,
                 topk_w_ptr, fin_ptr, arrivals_ptr, pid_n, N, expected, alpha, limit, stride_asm, stride_se, stride_sn,
                 stride_biase, stride_cm, stride_fm, A_SCALE: tl.constexpr, W_SCALE_PER_N: tl.constexpr,
                 HAS_BIAS: tl.constexpr, MUL_ROUTED: tl.constexpr, SINK: tl.constexpr, ACT: tl.constexpr,
                 GATE_UP_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr):
    """A [rows, BLOCK_N] product of pairs `ids` (row_mask: the valid ones; their output rows and
    activation rows): activation scale, bias (once per output, by the first K-split), router
    weight, then the sink."""
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
                    stride_fm, alpha, limit, ACT, GATE_UP_CHUNK, BLOCK_N)


# ---- launch configuration ---------------------------------------------------------------------


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def pick_config(num_pairs: int, num_experts: int, w: WeightOperand, device: torch.device) -> GemmConfig:
    """Tile shape and split-K for one GEMM: memory-bound at small M (stream weights from many
    programs at once), tensor-core tiles once each expert sees enough rows to reuse its weights.

    4-bit weights run swapped (see the kernel's SWAP_AB): block_m is then the MMA's N side, so it
    can stay at 16 for a handful of tokens per expert without wasting MMA rows."""
    per_expert = num_pairs / max(1, min(num_experts, num_pairs))
    swap = w.wtype in (WType.INT4, WType.MXFP4)
    # H100 sweep (benchmarks/results/quant_int4_h100_2026-11-21.json): at 16 pairs per expert a
    # 32-token tile beat 16 by 13-15% (gpt-oss, deepseek-v3 at M=512). Three stages, not four: the
    # int4 tuner runs (H100 session 5, H200 session 6; M <= 128, five presets) timed the layer
    # faster with one stage fewer, other parameters equal, in 37 of 40 cells (by 0.5-5%).
    if per_expert <= 8:
        bm, bn, warps, stages = 16, 128 if w.n >= 1024 else 64, 4, 3
    elif per_expert <= 48:
        bm, bn, warps, stages = 32, 128, 4, 3
    elif per_expert <= 192:
        bm, bn, warps, stages = 64, 128, 4, 3
    else:
        bm, bn, warps, stages = 128, 128, 8, 3
    m_blocks = min(num_pairs, -(-num_pairs // bm) + min(num_experts, num_pairs))
    programs = m_blocks * -(-w.n // bn)
    k_tiles = w.k_tiles
    # 8 programs per SM: at M=8 twice the K-splits of a 4-per-SM target were up to 15% faster (mixtral).
    target = 8 * _num_sms(device)
    split = 1
    while programs * split * 2 <= target and k_tiles // (split * 2) >= 2:
        split *= 2
    return GemmConfig(bm, bn, split, warps, stages, swap)


# ---- launcher -------------------------------------------------------------------------------

# Quads tiles that lie in one scale group take their scale after the tile's dots (POST_SCALE) when
# the output tile has at most this many elements: one fp32 multiply per output instead of one per
# weight pair, for a second accumulator. On the H100 (2026-11-21) that was 1-6% faster with
# BLOCK_M x BLOCK_N = 16 x 128 (mixtral-8x7b, qwen3-235b, deepseek-v3 at M <= 128) and 4-12% slower
# with 16 x 256 or 32 x 256 tiles, and the halves layout's 64-wide tiles lost 27-37%. A launch that
# takes in tails (GemmConfig.tail) scales per weight: its tiles are larger anyway.
_POST_SCALE_MAX_TILE = 16 * 128

# K tiles per program a one-token GEMM2 asks L2 for while GEMM1 runs (`moe_gemm_direct`'s
# prefetch_l2): its K loop starts on L2 hits instead of a cold DRAM stream. One tile made the int4
# layers 0.8-4.7% faster on the H100 (2026-11-21, five presets); two to four were no faster, and the
# program's whole share made gpt-oss-120b, mixtral and deepseek-v3 3.5-5.4% slower (their GEMM2
# weights beside GEMM1's stream overflow L2, presumably).
# benchmarks/results/int4_one_token_prefetch_2026-11-21.md
L2_PREFETCH_TILES = 1


@dataclass(frozen=True)
class WarpSpecializedRegs:
    """Register plan of the warp-specialized wgmma kernel (`quant_gemm_wgmma`): two consumer
    warpgroups (the default partition and a worker) and, unless the consumers copy their own
    tiles, a producer warpgroup."""

    producer_warps: int  # copy warps, their warpgroup allocated whole; 0: the consumers copy (the kernel's FOLDED)
    consumer_regs: int  # per consumer thread; 2 * consumer_regs + producer_regs <= 3 * maxnreg (with a producer)
    producer_regs: int  # per producer thread; below the MMA loop's need, ptxas serializes the wgmma
    maxnreg: int  # per thread at launch; all warps * 32 * maxnreg fit the 64K-register file


# A producer warpgroup: 12 warps at 168 registers, the consumers raised to 192, the producer down to 120.
WS_REGS = WarpSpecializedRegs(producer_warps=4, consumer_regs=192, producer_regs=120, maxnreg=168)
# Copies folded into the consumers: 8 warps at 240 registers, which a 128-token block's MMA loop needs
# to stay asynchronous (no partition below it). With the producer, ptxas serialized each consumer's
# wgmma there; folded, layers ran 1.04-1.18x faster at 2048 and 8192 tokens (H200, 2026-11-21,
# benchmarks/results/int4_wgmma_folded_2026-11-21.md). With 64 tokens or fewer the producer's plan
# keeps the MMAs asynchronous and measured faster.
FOLDED_REGS = WarpSpecializedRegs(producer_warps=0, consumer_regs=240, producer_regs=0, maxnreg=240)


def ws_regs(block_m: int) -> WarpSpecializedRegs:
    """The wgmma kernel's register plan for blocks of block_m pairs."""
    return FOLDED_REGS if block_m == 128 else WS_REGS


class Sink(enum.IntEnum):
    """Where a GEMM's tile of results goes (after bias and router weight)."""

    STORE = 0  # written once per row in out's dtype (after the activation, if any)
    ATOMIC = 1  # added into fp32 out (split-K or the top-k reduce); out is zero on entry
    LAST_ARRIVAL = 2  # added into fp32 sums; the tile's last contributor writes it finished (`LastArrival`)


@dataclass(frozen=True)
class LastArrival:
    """Partial sums meet in the fp32 `out` passed to the GEMM (zero on entry); the program that
    adds the last of an output row's contributions to an N tile (top-k choices x K-splits), counted
    in `arrivals`, stores that row of the tile finished (activation, 16-bit cast) to `finished`.
    No launch after the GEMM, and no fp32 pass over the output.

    Invariants: `arrivals` int32 with one zero counter per (output row, N tile), row-major;
    `finished` [output rows, N] (N / 2 after a gated activation), unit column stride."""

    finished: torch.Tensor
    arrivals: torch.Tensor


def effective_split(split_k: int, w: WeightOperand) -> int:
    """K-splits a launch runs: split_k, less any that would get no K tile (so every split adds)."""
    k_tiles = w.k_tiles
    return -(-k_tiles // -(-k_tiles // split_k))


def moe_gemm(a: torch.Tensor, w: WeightOperand, out: torch.Tensor, sorted_ids: torch.Tensor,
             expert_ids: torch.Tensor, num_post: torch.Tensor, num_valid: int, cfg: GemmConfig, *,
             a_rows_div: int = 1, a_scale: torch.Tensor | None = None, a_scale_mode: AScale = AScale.NONE,
             bias: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
             reduce_topk: int = 1, atomic: bool = False, last_arrival: LastArrival | None = None,
             activation: Activation | None = None, gate_up_chunk: int = 0,
             zero_side: torch.Tensor | None = None) -> None:
    """out[row] (+)= A[pair // a_rows_div] @ W[expert]^T (+ bias) (* topk weight) for each sorted pair.

    row = pair // reduce_topk; `atomic` accumulates into fp32 `out` (split-K, or the top-k reduce
    of GEMM2 when reduce_topk > 1), `last_arrival` too, finished by the last contributor
    (`LastArrival`); otherwise each pair's row is stored once in out's dtype, after `activation`
    if given (gated: W's rows interleaved by chunks of gate_up_chunk). `zero_side` (int32, any
    size): zeroed by the launch's programs on the side, for the next GEMM.

    On Hopper and later the launch may start before the previous kernel on the stream ends
    (programmatic dependent launch); its programs wait for that kernel before they read or write.
    """
    _launch(a, w, out, cfg, rows=sorted_ids, experts=expert_ids, num_post=num_post, num_valid=num_valid,
            grid_m=min(triton.cdiv(sorted_ids.numel(), cfg.block_m), num_valid), direct=False,
            has_map=False, a_rows_div=a_rows_div, a_scale=a_scale, a_scale_mode=a_scale_mode, bias=bias,
            topk_weights=topk_weights, reduce_topk=reduce_topk, sink=_sink(atomic, last_arrival),
            last_arrival=last_arrival, activation=activation, gate_up_chunk=gate_up_chunk, zero_side=zero_side)


def moe_gemm_direct(a: torch.Tensor, w: WeightOperand, out: torch.Tensor, topk_ids: torch.Tensor,
                    expert_map: torch.Tensor | None, cfg: GemmConfig, *, a_rows_div: int = 1,
                    a_scale: torch.Tensor | None = None, a_scale_mode: AScale = AScale.NONE,
                    bias: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                    reduce_topk: int = 1, atomic: bool = False, last_arrival: LastArrival | None = None,
                    activation: Activation | None = None, gate_up_chunk: int = 0,
                    zero_side: torch.Tensor | None = None, prefetch_l2: bool = False) -> None:
    """`moe_gemm` without alignment: one block per pair (pair = t * top_k + s of topk_ids int32 [M, top_k]).

    Pairs of one expert each stream its weights, so this suits pairs of distinct experts (one
    token's top-k). `expert_map` int32 [E]: global -> local id, -1 for another rank's experts.
    `prefetch_l2`: for a launch right after another direct launch (GEMM2 after GEMM1): each
    program's first weight tiles (`L2_PREFETCH_TILES`) head for L2 while that one still runs.
    It takes effect where the launch is dependent (`moe_triton._details.pdl`) and the weights
    are int4 quads stored tile-major, and changes no result.
    """
    pairs = topk_ids.view(-1)
    # The kernel's sorted-ids and expert-ids pointers carry the pairs' experts and the map here.
    _launch(a, w, out, cfg, rows=pairs, experts=expert_map if expert_map is not None else pairs, num_post=pairs,
            num_valid=pairs.numel(), grid_m=pairs.numel(), direct=True, has_map=expert_map is not None,
            a_rows_div=a_rows_div, a_scale=a_scale, a_scale_mode=a_scale_mode, bias=bias,
            topk_weights=topk_weights, reduce_topk=reduce_topk, sink=_sink(atomic, last_arrival),
            last_arrival=last_arrival, activation=activation, gate_up_chunk=gate_up_chunk, zero_side=zero_side,
            prefetch_l2=prefetch_l2)


def _sink(atomic: bool, last_arrival: LastArrival | None) -> Sink:
    if atomic and last_arrival is not None:
        raise ValueError("atomic and last_arrival are two different sinks: pass one")
    return Sink.LAST_ARRIVAL if last_arrival is not None else (Sink.ATOMIC if atomic else Sink.STORE)


def _launch(a: torch.Tensor, w: WeightOperand, out: torch.Tensor, cfg: GemmConfig, *, rows: torch.Tensor,
            experts: torch.Tensor, num_post: torch.Tensor, num_valid: int, grid_m: int, direct: bool,
            has_map: bool, a_rows_div: int, a_scale: torch.Tensor | None, a_scale_mode: AScale,
            bias: torch.Tensor | None, topk_weights: torch.Tensor | None, reduce_topk: int, sink: Sink,
            last_arrival: LastArrival | None, activation: Activation | None, gate_up_chunk: int,
            zero_side: torch.Tensor | None, prefetch_l2: bool = False) -> None:
    if w.k % w.block_k and not (w.quads and w.codes.shape[2] == w.k_tiles):
        raise ValueError(f"block_k={w.block_k} does not divide K={w.k} (only int4 quads codes pad K to whole "
                         f"tiles), codes {list(w.codes.shape)}")
    if a.shape[1] != w.k:
        raise ValueError(f"activations have {a.shape[1]} columns, the weights expect K={w.k}")
    split = effective_split(cfg.split_k, w)
    if (split > 1 or reduce_topk > 1) and not (sink is not Sink.STORE and out.dtype == torch.float32):
        raise ValueError("split-K and the top-k reduce accumulate atomically into an fp32 output")
    if activation is not None and sink is Sink.ATOMIC:
        raise ValueError("an activation needs whole sums: a STORE or LAST_ARRIVAL sink, not ATOMIC")
    if gate_up_chunk and not (activation is not None and activation.gated and cfg.block_n % (2 * gate_up_chunk) == 0):
        raise ValueError(f"interleaved gate/up chunks of {gate_up_chunk} rows need a gated activation and "
                         f"block_n divisible by {2 * gate_up_chunk}, got {activation} and {cfg}")
    if activation is not None and activation.gated and not gate_up_chunk:
        raise ValueError("a gated activation in the GEMM needs w's rows interleaved (gate_up_chunk > 0)")
    if (out.stride(1) if out.dim() == 2 else 1) != 1:
        raise ValueError("the GEMM output needs a unit column stride")
    if w.wtype is WType.INT4 and not cfg.swap_ab:
        raise ValueError("int4 weights run swapped only (the weights are the MMA's register operand): "
                         f"got {cfg}")
    if cfg.tail and not w.quads:
        raise ValueError(f"taken-in tails (GemmConfig.tail) are an option of int4 weights in the quads layout, got "
                         f"{w.wtype.name} {w.codes.dtype}")
    tail = 0 if direct else cfg.tail  # a direct launch's blocks hold one pair each: nothing to take in
    n_tiles = triton.cdiv(w.n, cfg.block_n)
    # N tiles first in the launch order (the kernel's N_FIRST) where the grid's second axis holds
    # the M blocks; decode keeps M first (one token: blocks are pairs of distinct experts).
    n_first = not direct and sink is not Sink.LAST_ARRIVAL and grid_m < 2**16
    grid = (n_tiles, grid_m, split) if n_first else (grid_m, n_tiles, split)
    fin = out
    arrivals = rows  # never read without LAST_ARRIVAL
    if last_arrival is not None:
        fin, arrivals = last_arrival.finished, last_arrival.arrivals
        out_rows = -(-num_valid // reduce_topk)
        if arrivals.dtype != torch.int32 or arrivals.numel() < out_rows * n_tiles:
            raise ValueError(f"last-arrival sums need int32 arrivals >= {out_rows} rows x {n_tiles} N tiles, got "
                             f"{arrivals.dtype} [{arrivals.numel()}]")
        if fin.stride(1) != 1:
            raise ValueError("the finished output needs a unit column stride")
    programs = grid_m * n_tiles * split
    zero_numel = zero_side.numel() if zero_side is not None else 0
    if zero_side is not None and (zero_side.dtype != torch.int32 or not zero_side.is_contiguous()
                                  or zero_numel >= 2**31):
        raise ValueError("zero_side must be a contiguous int32 tensor below 2**31 elements")
    zero_chunk = triton.cdiv(triton.cdiv(zero_numel, programs), _ZERO_BLOCK.value) * _ZERO_BLOCK.value
    if cfg.wgmma:
        # Per-channel scales have one row, whose stride may be anything (1 after a transpose): 0 keeps
        # the scale-row addresses provably 16-byte aligned for cp.async.
        scale_rows_stride = w.scale.stride(1) if w.scale.shape[1] > 1 else 0
        _check_wgmma(a, w, scale_rows_stride, direct=direct, sink=sink, a_scale_mode=a_scale_mode)
        # Gluon is imported only when a configuration asks for this kernel.
        from moe_triton._details.quant_gemm_wgmma import moe_w4a16_wgmma_kernel

        if not n_first:
            raise ValueError(f"the wgmma GEMM launches M blocks on the grid's second axis (below 65536): "
                             f"{grid_m} blocks of {cfg.block_m} pairs; take a larger block_m")
        regs = ws_regs(cfg.block_m)
        moe_w4a16_wgmma_kernel[grid](
            a, w.codes, w.scale, w.zero if w.zero is not None else w.scale, bias if bias is not None else w.scale,
            out, topk_weights if topk_weights is not None else w.scale, rows, experts, num_post,
            zero_side if zero_side is not None else rows, w.n, w.k, num_valid, zero_numel, zero_chunk,
            float(activation.alpha or 0.0) if activation else 0.0, float(activation.limit or 0.0) if activation else 0.0,
            a.stride(0), w.codes.stride(0), w.codes.stride(1), w.codes.stride(2), w.scale.stride(0), scale_rows_stride,
            bias.stride(0) if bias is not None else 0, out.stride(0),
            GROUP=w.group, HAS_ZP=w.zero is not None, CODE_OFFSET=w.code_offset, HAS_BIAS=bias is not None,
            A_ROWS_DIV=a_rows_div, MUL_ROUTED=topk_weights is not None, REDUCE_TOPK=reduce_topk,
            ATOMIC=sink is Sink.ATOMIC, ACT=int(act_kind(activation)) if activation else 0,
            GATE_UP_CHUNK=gate_up_chunk, ZERO_SIDE=zero_side is not None, SPLIT_K=split, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, K_TAIL=w.k % w.block_k != 0,
            PRODUCER_WARPS=regs.producer_warps, CONSUMER_REGS=regs.consumer_regs,
            PRODUCER_REGS=regs.producer_regs, TAIL=cfg.tail, num_warps=4, maxnreg=regs.maxnreg)
        return
    s = w.scale
    if w.wtype is WType.FP8:
        sst = (s.stride(0), 0, 0) if s.dim() == 1 else (
            (s.stride(0), 0, s.stride(1)) if s.dim() == 2 else (s.stride(0), s.stride(2), s.stride(1)))
    else:
        sst = (s.stride(0), s.stride(1), s.stride(2))
    codes = w.codes
    # (expert, k within a tile, n, K tile) strides of the codes.
    if w.wtype in (WType.INT4, WType.MXFP4):  # quads or halves: [E, N, K tiles, words per tile]
        bst = (codes.stride(0), codes.stride(3), codes.stride(1), codes.stride(2))
    else:  # canonical [E, N, K] (the K loop steps through stride_bk)
        bst = (codes.stride(0), codes.stride(2), codes.stride(1), 0)
    a_scale_t = a_scale if a_scale is not None else a
    ast = (a_scale_t.stride(0), a_scale_t.stride(1) if a_scale_t.dim() == 2 else 0)
    _moe_wgemm_kernel[grid](
        a, a_scale_t, codes, s, w.zero if w.zero is not None else s, bias if bias is not None else s, out,
        topk_weights if topk_weights is not None else s, rows, experts, num_post, fin, arrivals,
        zero_side if zero_side is not None else arrivals,
        w.n, w.k, num_valid, reduce_topk * split, zero_numel, zero_chunk,
        float(activation.alpha or 0.0) if activation else 0.0, float(activation.limit or 0.0) if activation else 0.0,
        a.stride(0), a.stride(1), ast[0], ast[1],
        *bst, *sst,
        bias.stride(0) if bias is not None else 0, out.stride(0), fin.stride(0),
        GROUP=max(w.group, 1), WTYPE=int(w.wtype), A_SCALE=int(a_scale_mode),
        W_SCALE_PER_N=s.dim() >= 2, HAS_ZP=w.zero is not None, CODE_OFFSET=w.code_offset,
        HAS_BIAS=bias is not None, A_ROWS_DIV=a_rows_div, MUL_ROUTED=topk_weights is not None,
        REDUCE_TOPK=reduce_topk, SINK=int(sink), ACT=int(act_kind(activation)) if activation else 0,
        GATE_UP_CHUNK=gate_up_chunk, ZERO_SIDE=zero_side is not None, SPLIT_K=split,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=w.block_k,
        SWAP_AB=cfg.swap_ab and w.wtype in (WType.INT4, WType.MXFP4),
        UPCAST=_interpreting() and a.dtype == torch.bfloat16, DIRECT=direct, HAS_MAP=has_map,
        QUADS=w.quads, PTX_UNPACK=codes.is_cuda and torch.version.hip is None and not _interpreting(),
        POST_SCALE=w.quads and w.group % w.block_k == 0 and not tail and cfg.block_m * cfg.block_n <= _POST_SCALE_MAX_TILE,
        K_TAIL=w.k % w.block_k != 0, N_FIRST=n_first, NARROW=cfg.narrow and not direct,
        PREFETCH_TILES=L2_PREFETCH_TILES if prefetch_l2 and direct and _prefetchable(w) else 0, TAIL=tail,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **dependent_options(w.codes.device),
    )


def _prefetchable(w: WeightOperand) -> bool:
    """Whether a dependent direct launch can prefetch w's weights into L2 (`_prefetch_weights_l2`):
    int4 quads stored tile-major, scales (and zero points) with contiguous rows, on a GPU whose
    launches are dependent (sm_90 and later: the bulk prefetch is an sm_90 instruction)."""
    c = w.codes
    return (w.quads and c.stride(3) == 1 and c.stride(1) == c.shape[3] and w.scale.stride(2) == 1
            and (w.zero is None or w.zero.stride() == w.scale.stride()) and dependent_launch(c.device))


@triton.jit
def _zero_kernel(ptr, numel, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # Waits like any dependent launch: the buffer may reuse memory the kernel ahead still uses.
    wait_then_release(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offs, tl.zeros((BLOCK,), tl.int32), mask=offs < numel)


def zeroed_int32(numel: int, device: torch.device) -> torch.Tensor:
    """A zeroed int32 buffer (GEMM sums and arrival counts), zeroed by a dependent launch: unlike a
    fill, it starts while the kernel ahead still runs, so its launch latency hides there."""
    out = torch.empty(numel, dtype=torch.int32, device=device)
    block = 1024
    _zero_kernel[(triton.cdiv(numel, block),)](out, numel, BLOCK=block, **dependent_options(device))
    return out


def wgmma_capable(device: torch.device) -> bool:
    """The wgmma kernel's GPUs: NVIDIA Hopper (sm_90; wgmma is not in later architectures), compiled kernels."""
    return (device.type == "cuda" and torch.version.hip is None and not _interpreting()
            and torch.cuda.get_device_capability(device)[0] == 9)


def _check_wgmma(a: torch.Tensor, w: WeightOperand, scale_rows_stride: int, *, direct: bool, sink: Sink,
                 a_scale_mode: AScale) -> None:
    """What the wgmma kernel (`quant_gemm_wgmma`) takes; a clear error for anything else."""
    wants = []
    if not wgmma_capable(a.device):
        wants.append(f"an NVIDIA Hopper GPU (sm_90), got {a.device}"
                     + (f" (sm_{''.join(map(str, torch.cuda.get_device_capability(a.device)))})"
                        if a.is_cuda and not _interpreting() else ""))
    if not (w.quads and w.block_k == 128):
        wants.append(f"int4 weights in the quads layout with 128-wide K tiles, got {w.wtype.name} "
                     f"{w.codes.dtype} block_k={w.block_k}")
    if a.dtype not in (torch.bfloat16, torch.float16) or a_scale_mode is not AScale.NONE:
        wants.append(f"bf16 or fp16 activations without scales, got {a.dtype} {a_scale_mode.name}")
    if direct or sink is Sink.LAST_ARRIVAL:
        wants.append("aligned launches with a STORE or ATOMIC sink (no direct launch, no last-arrival sums)")
    if a.stride(1) != 1 or w.codes.stride(3) != 1 or w.scale.stride(2) != 1 or (
            w.zero is not None and w.zero.stride() != w.scale.stride()):
        wants.append("unit-stride activation columns, quads words, scale columns, and zero points "
                     "strided like the scales")
    # cp.async moves 16-byte pieces: activation rows, scale rows (and uint8 zero-point rows).
    piece = 16 if w.zero is not None else 8
    if a.stride(0) % 8 or w.n % piece or scale_rows_stride % piece or w.scale.stride(0) % piece:
        wants.append(f"rows that split into 16-byte pieces (activation row stride a multiple of 8, N and the "
                     f"scale strides multiples of {piece}), got {a.stride(0)}, N={w.n}, {w.scale.stride()}")
    if wants:
        raise ValueError("the wgmma GEMM (GemmConfig.wgmma) needs " + "; ".join(wants))


# ---- torch twin -----------------------------------------------------------------------------


def dequantize_operand(w: WeightOperand) -> torch.Tensor:
    """fp32 [E, N, K] from the kernel layout (fp8 weights: codes times weight scales)."""
    E, N, K = w.num_experts, w.n, w.k
    if w.wtype is WType.FP8:
        c, s = w.codes.float(), w.scale.float()
        if s.dim() == 1:
            return c * s.view(E, 1, 1)
        if s.dim() == 2:
            return c * s.view(E, N, 1)
        return c * s.repeat_interleave(128, 1)[:, :N].repeat_interleave(128, 2)[:, :, :K]
    return dequantize_padded(w)[:, :, :K]


def dequantize_padded(w: WeightOperand) -> torch.Tensor:
    """fp32 [E, N, k_tiles * block_k] of a 4-bit or int8 operand, quads' K padding included."""
    if w.quads:
        codes = unpack_int4_quads(w.codes)
    elif w.wtype in (WType.INT4, WType.MXFP4):
        codes = unpack_int4_tiles(w.codes)
    else:
        codes = w.codes
    scale = w.scale.transpose(1, 2).repeat_interleave(w.group, 2)  # [E, N, padded K]
    if w.wtype is WType.MXFP4:
        return E2M1_VALUES.to(codes.device)[codes.long()] * torch.exp2(scale.float() - 127)
    zero = (w.zero.transpose(1, 2).repeat_interleave(w.group, 2).float() if w.zero is not None
            else float(w.code_offset))
    return (codes.float() - zero) * scale.float()


def moe_gemm_torch(a: torch.Tensor, w: WeightOperand, pair_expert: torch.Tensor, *, a_rows_div: int = 1,
                   a_scale: torch.Tensor | None = None, a_scale_mode: AScale = AScale.NONE,
                   bias: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 [num_pairs, N]: the kernel's per-pair result (before any top-k reduce).

    pair_expert: local expert of each pair (-1: skipped, row left zero).
    """
    wf = dequantize_operand(w)
    P = pair_expert.numel()
    rows = torch.arange(P, device=a.device) // a_rows_div
    x = a.float()[rows]
    if a_scale_mode is AScale.ROW:
        x = x * a_scale.float()[rows].view(P, 1)
    elif a_scale_mode is AScale.GROUP:
        x = x * a_scale.float()[rows].repeat_interleave(128, 1)[:, : w.k]
    out = torch.zeros(P, w.n, dtype=torch.float32, device=a.device)
    for e in pair_expert.unique().tolist():
        if e < 0:
            continue
        sel = pair_expert == e
        y = x[sel] @ wf[e].T
        if bias is not None:
            y = y + bias[e].float()
        out[sel] = y
    if topk_weights is not None:
        out = out * topk_weights.float().reshape(P, 1)
    return out
