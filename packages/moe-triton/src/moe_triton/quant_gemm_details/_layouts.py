"""The quantized GEMM's weight layouts: how the experts' processors store codes for the kernels.

Both 4-bit layouts are tensors indexed [E, N, K tile, word] that the kernel reads through strides;
their memory order is the one the kernels stream fastest (docs/design/triton-gemm-quantized.md).

- `QuadsLayout` (int4 with 128-wide K tiles, and MXFP4): int16 [E, N, cdiv(K, block_k), block_k/4],
  stored tile-major ([E, K tile, N, word] in memory: one program's N x K tile of weights is one
  contiguous run). Word i of K tile t holds the codes of k = t*block_k + j*block_k/4 + i for the
  four quarters j, at the word bits its `code_bits` name: int4 in nibble j (bits 4j..4j+3,
  `INT4_NIBBLES`), MXFP4 where one shift puts an e2m1 code's bits where a bf16 holds them
  (`E2M1_FIELDS`). The kernel runs swapped (weights as the MMA's A operand, in registers) and
  loads the words straight into that operand's register layout, where each 32-bit register holds
  two neighbouring words: shifts and lop3s of the register give quarter j of both as a 16-bit float
  pair (`_dequant.unpack_quads`, `_dequant.unpack_e2m1_quads`), the operand of the j-th of four dots
  over contiguous K quarters; for MXFP4 (a scale per 32 k) quarter j is scale group j. A K that
  128 does not divide (gpt-oss's 2880) is padded to whole tiles when its scale groups divide the
  padded K: the padding's weights dequantize to exactly 0 (int4: zero scale rows; MXFP4: code 0),
  and the kernel masks the activations' columns past K (K_TAIL).
- `HalvesLayout` (int4 that cannot be padded so: per-channel scales, K % 128 != 0):
  uint8 [E, N, K/block_k, block_k/2], stored K-major ([E, K tile, byte, N] in memory: a program's
  tile is block_k/2 runs of block_n bytes). Byte i of K tile t holds k = t*block_k + i in its low
  nibble and k = t*block_k + block_k/2 + i in its high nibble: two dots over K halves.
- `ByteQuadsLayout` (int8 with 128-wide K tiles): int32 [E, N, K/block_k, block_k/4], stored
  tile-major like the quads, byte j of word i holding the code of k = t*block_k + j*block_k/4 + i:
  the same four quarters and the same register pairs (two neighbouring words, here two 32-bit
  registers), from which one `prmt` per quarter takes byte j of both (`_dequant.unpack_byte_quads`).
  A K that 128 does not divide is padded as the 4-bit quads' is (codes at their zero; a per-channel
  scale row covers the padded K).
- INT8 whose quarters would straddle scale groups, and FP8: the canonical [E, N, K] codes, read
  through strides (K contiguous).

Scales and zero points are [E, K/group, N] (N contiguous) for INT4/INT8; MXFP4's e8m0 exponents are
int32 [E, K tiles, N] (`pack_e8m0_tiles`: one word per row and tile, which the kernels pipeline like
any other operand, brings all four quarters' exponents; a folded operand's words hold each quarter's
factor exponent, see there); fp8 keeps its canonical scales ([E], [E, N] or [E, N/128, K/128] blocks).

`GateUpInterleave` orders a gated w13's rows so that each GEMM1 output tile holds matching gate and
up columns (the activation then runs in GEMM1's epilogue).

Each layout is a round trip: `swizzle` builds it from canonical codes, `unswizzle` gives them back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property

import torch

__all__ = ["E2M1_FIELDS", "E8M0_FOLDED_BIAS", "E8M0_WORD_BYTES", "INT4_NIBBLES", "ByteQuadsLayout", "GateUpInterleave",
           "HalvesLayout", "QuadsLayout", "WType", "WeightOperand", "pack_e8m0_tiles", "stored_k_major",
           "stored_tile_major", "unpack_e8m0_tiles"]


class WType(enum.IntEnum):
    INT4 = 0
    INT8 = 1
    FP8 = 2
    MXFP4 = 3


@dataclass(frozen=True)
class WeightOperand:
    """One GEMM's weights in kernel layout.

    Invariants: `codes` follows this module's layout for `wtype`; `n`, `k` are the GEMM's
    output and input sizes; `block_k` divides k, except for quads, whose codes, scales and
    zero points cover `k_tiles` whole tiles and dequantize to 0 past k; for grouped int/mxfp4
    scales each block_k/4 (quads), block_k/2 (halves) or block_k (int8) slice of K lies inside
    one scale group; `group` is the K extent of one scale row (per channel: k, or for quads codes
    the padded k_tiles * block_k).
    """

    wtype: WType
    codes: torch.Tensor
    # [E, K / group, N] (N contiguous); MXFP4: int32 [E, K tiles, N]; fp8: [E], [E, N] or [E, N/128, K/128]
    scale: torch.Tensor
    zero: torch.Tensor | None  # uint8, like scale (INT4/INT8 with integer zero points)
    n: int
    k: int
    group: int  # K per scale row; 0 for fp8 (granularity comes from AScale)
    block_k: int
    code_offset: int  # implicit zero when `zero` is None (8, 128), 0 otherwise
    # MXFP4: every e8m0 scale is at most 2^1, so one multiply per weight scales an unpacked code
    # (`_dequant.e8m0_factors`) and `scale` holds the factors' exponents (`pack_e8m0_tiles`); otherwise two.
    folded_scale: bool = False

    @property
    def num_experts(self) -> int:
        return self.codes.shape[0]

    @cached_property
    def quads(self) -> bool:
        """Codes four per word over a K tile's quarters: 4-bit ones in int16 words (the halves layout
        is uint8), int8 ones in int32 words (`ByteQuadsLayout`; canonical int8 is uint8). Read several
        times per launch: computed once."""
        return ((self.wtype in (WType.INT4, WType.MXFP4) and self.codes.dtype == torch.int16)
                or (self.wtype is WType.INT8 and self.codes.dtype == torch.int32))

    @cached_property
    def one_scale_row(self) -> bool:
        """Integer weights with one scale row for all of K (per channel), which the kernels may apply to
        the sums instead of the weights. Fixed per operand: computed once."""
        return self.wtype in (WType.INT4, WType.INT8) and self.group >= self.k

    @property
    def k_tiles(self) -> int:
        """K tiles the kernel loops over (the last one padded past k for quads, see the invariants)."""
        return -(-self.k // self.block_k)

    @cached_property
    def scale_rows_in_pieces(self) -> bool:
        """Whether each K tile's scale rows (zero-point rows, MXFP4's exponent words) split into 16-byte
        pieces that Triton can prove aligned (N and the row strides multiples of 16 elements, which it
        specializes), so that the mma kernel may copy them with the tile's words; a per-channel row
        (one for all of K) is read once, not copied. Fixed per operand: computed once."""
        return self.group >= self.k_tiles * self.block_k or (
            self.n % 16 == 0 and self.scale.stride(0) % 16 == 0 and self.scale.stride(1) % 16 == 0)

    @cached_property
    def scale_rows_in_pairs(self) -> bool:
        """Whether the 16-bit scale rows [E, K/group, N] read as int32 words of two neighbouring rows' scales
        (unit N stride, N and the strides between rows even, 4-byte aligned), as the tl.dot kernel's
        SCALE_PAIRS does. Fixed per operand: computed once."""
        s = self.scale
        return (s.dim() == 3 and s.element_size() == 2 and s.stride(2) == 1 and s.data_ptr() % 4 == 0
                and self.n % 2 == 0 and all(s.shape[d] == 1 or s.stride(d) % 2 == 0 for d in (0, 1)))


def stored_tile_major(words: torch.Tensor) -> torch.Tensor:
    """[E, N, K tile, word] values stored as [E, K tile, N, word] (the quads' order)."""
    return words.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


def stored_k_major(words: torch.Tensor) -> torch.Tensor:
    """[E, N, K tile, word] values stored as [E, K tile, word, N] (the halves' order)."""
    return words.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


# The byte (little-endian, as CUDA and x86 read a word) of a K tile's exponent word that holds quarter
# j's: quarters 0 and 1 in the low bytes of the word's 16-bit halves, 2 and 3 in the high ones, so
# one shift and one mask give a pair of quarters' factors as a bf16 pair (`_dequant.quarter_e8m0_factors`).
E8M0_WORD_BYTES = (0, 2, 1, 3)
# A folded operand's words (`WeightOperand.folded_scale`: every s <= 128) hold s + 126 per quarter,
# the biased exponent of its factor 2^(s - 1) in bf16 and fp32 (126..254): the factor is the byte
# shifted into place.
E8M0_FOLDED_BIAS = 126


def pack_e8m0_tiles(exps: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """uint8 e8m0 exponents [E, 4 * T, N] (groups of 32 k, four per 128-wide K tile) -> (int32 [E, T, N],
    folded): word [e, t, n]'s byte `E8M0_WORD_BYTES[j]` is group 4t + j's exponent s of row n, or
    s + `E8M0_FOLDED_BIAS` where the tensor folds (every s at most 128: `WeightOperand.folded_scale`)."""
    E, G, N = exps.shape
    if exps.dtype != torch.uint8 or G % 4:
        raise ValueError(f"expected uint8 exponents with a multiple of 4 groups, got {exps.dtype} {list(exps.shape)}")
    folded = not exps.numel() or int(exps.max()) <= 128
    if folded:
        exps = exps + E8M0_FOLDED_BIAS
    quarters = exps.reshape(E, G // 4, 4, N)[:, :, list(E8M0_WORD_BYTES)]  # the permutation is its own inverse
    return quarters.transpose(2, 3).contiguous().view(torch.int32).squeeze(3), folded


def unpack_e8m0_tiles(words: torch.Tensor, folded: bool) -> torch.Tensor:
    """int32 [E, T, N] of `pack_e8m0_tiles` (folded or not) -> its uint8 exponents [E, 4 * T, N]."""
    E, T, N = words.shape
    quarters = words.contiguous().unsqueeze(3).view(torch.uint8)[..., list(E8M0_WORD_BYTES)]
    exps = quarters.transpose(2, 3).reshape(E, 4 * T, N)
    return exps - E8M0_FOLDED_BIAS if folded else exps


@dataclass(frozen=True)
class HalvesLayout:
    """int4 codes two per byte over the two halves of each K tile, stored K-major."""

    block_k: int  # K per tile; divides K

    def swizzle(self, codes: torch.Tensor) -> torch.Tensor:
        """Canonical packed [E, R, K/2] (even k low) -> uint8 [E, R, K/block_k, block_k/2], stored K-major."""
        block_k = self.block_k
        E, R, half = codes.shape
        K = half * 2
        if K % block_k:
            raise ValueError(f"block_k={block_k} does not divide K={K}")
        lo, hi = codes & 0xF, codes >> 4
        full = torch.stack((lo, hi), dim=-1).view(E, R, K // block_k, 2, block_k // 2)  # [.., tile, half, i]
        return stored_k_major(full[..., 0, :] | (full[..., 1, :] << 4))

    def unswizzle(self, packed: torch.Tensor) -> torch.Tensor:
        """uint8 [E, R, K tiles, block_k/2] (any strides) -> codes uint8 [E, R, K] (0..15)."""
        E, R, T, H = packed.shape
        t = packed.unsqueeze(3)
        return torch.cat((t & 0xF, t >> 4), dim=3).reshape(E, R, T * 2 * H)


# Where each quarter's 4-bit code sits in a quads word: code bit b of quarter j at word bit [j][b].
INT4_NIBBLES = ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
# An e2m1 code's bits 0-2 (mantissa, exponent) go to a bf16's bits 6-8 and its sign (bit 3) to bit
# 15 (`_dequant.unpack_e2m1_quads`): quarter 0 is stored there already, quarter 1 three bits lower (one
# shift places both its field and its sign). No placement gives all four quarters one shift each, so
# quarters 2 and 3 keep their 3-bit fields apart from their signs: 11 instructions per 32-bit register
# (eight weights) instead of 15 for nibbles.
E2M1_FIELDS = ((6, 7, 8, 15), (3, 4, 5, 12), (9, 10, 11, 14), (0, 1, 2, 13))


@dataclass(frozen=True)
class QuadsLayout:
    """4-bit codes four per int16 word over the four quarters of each K tile, stored tile-major."""

    block_k: int  # K per tile; a multiple of 4 dividing the (padded) K
    code_bits: tuple[tuple[int, ...], ...] = INT4_NIBBLES  # INT4_NIBBLES or E2M1_FIELDS

    def __post_init__(self) -> None:
        if sorted(b for bits in self.code_bits for b in bits) != list(range(16)) or len(self.code_bits) != 4:
            raise ValueError(f"code_bits must place four 4-bit codes on the 16 bits of a word, got {self.code_bits}")

    def swizzle(self, codes: torch.Tensor) -> torch.Tensor:
        """Canonical packed [E, R, K/2] (even k low) -> int16 [E, R, K/block_k, block_k/4], stored tile-major."""
        block_k = self.block_k
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
            words = torch.zeros(R, T, Q, dtype=torch.int32, device=codes.device)
            for j, bits in enumerate(self.code_bits):
                for b, at in enumerate(bits):
                    words |= ((full[..., j, :] >> b) & 1) << at
            out[e] = (words - ((words >> 15) << 16)).to(torch.int16).transpose(0, 1)  # two's complement
        return out.permute(0, 2, 1, 3)

    def unswizzle(self, words: torch.Tensor) -> torch.Tensor:
        """int16 [E, R, K tiles, block_k/4] (any strides) -> codes uint8 [E, R, K] (0..15)."""
        E, R, T, Q = words.shape
        w = words.to(torch.int32).unsqueeze(3) & 0xFFFF
        quarters = [sum(((w >> at) & 1) << b for b, at in enumerate(bits)) for bits in self.code_bits]
        return torch.cat(quarters, dim=3).reshape(E, R, T * 4 * Q).to(torch.uint8)


@dataclass(frozen=True)
class ByteQuadsLayout:
    """int8 codes four per int32 word over the four quarters of each K tile, stored tile-major."""

    block_k: int  # K per tile; a multiple of 4 dividing K

    def swizzle(self, codes: torch.Tensor) -> torch.Tensor:
        """Canonical uint8 [E, R, K] -> int32 [E, R, K/block_k, block_k/4], stored tile-major."""
        E, R, K = codes.shape
        if codes.dtype != torch.uint8 or K % self.block_k or self.block_k % 4:
            raise ValueError(f"expected uint8 codes whose K={K} is a multiple of block_k={self.block_k} (a multiple "
                             f"of 4), got {codes.dtype}")
        T, Q = K // self.block_k, self.block_k // 4
        out = torch.empty(E, T, R, 4 * Q, dtype=torch.uint8, device=codes.device)
        for e in range(E):  # one expert at a time: a whole layer's permuted copy would double its size
            out[e] = codes[e].view(R, T, 4, Q).permute(1, 0, 3, 2).reshape(T, R, 4 * Q)  # byte j of word i
        return out.view(torch.int32).permute(0, 2, 1, 3)

    def unswizzle(self, words: torch.Tensor) -> torch.Tensor:
        """int32 [E, R, K tiles, block_k/4] (any strides) -> codes uint8 [E, R, K]."""
        E, R, T, Q = words.shape
        return words.contiguous().view(torch.uint8).view(E, R, T, Q, 4).transpose(3, 4).reshape(E, R, T * 4 * Q)


@dataclass(frozen=True)
class GateUpInterleave:
    """A gated w13's rows [gate (n) | up (n)] taken as chunk 0 of the gate, chunk 0 of up, chunk 1 of
    the gate, ...: a GEMM1 output tile of 2 * chunk columns holds matching gate and up columns."""

    chunk: int  # rows per chunk; divides n

    def row_order(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        """Canonical row index of each swizzled row (`index_select` it along the rows to swizzle)."""
        chunk = self.chunk
        if n % chunk:
            raise ValueError(f"gate/up chunks of {chunk} rows do not divide N={n}")
        return torch.arange(2 * n, device=device).view(2, n // chunk, chunk).transpose(0, 1).reshape(-1)

    def unswizzle(self, h: torch.Tensor) -> torch.Tensor:
        """[..., 2n] columns in `row_order` -> canonical [gate | up]."""
        chunk = self.chunk
        *lead, width = h.shape
        return h.reshape(*lead, width // (2 * chunk), 2, chunk).transpose(-3, -2).reshape(*lead, width)
