"""Dequantization of the weight layouts (`_layouts`): in registers inside the kernels (jit), and
in torch for the twin (`dequantize_operand`).

In the kernels, int4 codes become floats by ORing them into the mantissa of a power of two whose
ulp is 1 (`biased`): exact, and cheaper than an integer -> float conversion; the zero point is then
subtracted in the compute type (exact for codes below 16) so the scale's multiply is the only
rounding, as in the reference. e2m1 codes become floats by moving their bits into a bf16's
(`unpack_e2m1_quads`), which `e8m0_factors` then scale exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_core.weights.packing import E2M1_VALUES
from moe_triton.quant_gemm_details._layouts import (
    E2M1_FIELDS,
    E8M0_FOLDED_BIAS,
    E8M0_WORD_BYTES,
    INT4_NIBBLES,
    ByteQuadsLayout,
    HalvesLayout,
    QuadsLayout,
    WeightOperand,
    WType,
    unpack_e8m0_tiles,
)

__all__ = ["biased", "byte_quarter_ptx", "dequantize", "dequantize_operand", "dequantize_padded", "e2m1_quarter_ptx",
           "e2m1_weights", "e8m0_factors", "int4_group", "int4_zero", "int8_zero", "paired_scales",
           "quarter_e8m0_exponent", "quarter_e8m0_factors", "unpack_byte_quads", "unpack_e2m1_quads", "unpack_quads"]

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

# int8 codes (uint8, zero point 128) -> bf16 code - 128, four codes of one register per instance,
# without an integer -> float conversion (a quarter of the FMA rate): for each pair of codes placed in
# 16-bit lanes (prmt), m = 0x4300 | (code & 0x7F) is 128 + its low seven bits and
# n = 0x4380 ^ (code & 0x80) is 256, or 128 when its top bit is set, both exact in bf16, and
# m - n = code - 128 exactly (an fma by -1: bf16 subtraction needs sm_90). lop3 0xEA is (a & b) | c,
# 0x6A is (a & b) ^ c. `int8_centered_torch` checks the recipe on all 256 codes.
INT8_M_AND, INT8_M_OR, INT8_N_AND, INT8_N_XOR = 0x007F, 0x4300, 0x0080, 0x4380
_INT8_CENTER = (f"lop3.b32 m, p, 0x{INT8_M_AND:04X}{INT8_M_AND:04X}, 0x{INT8_M_OR:04X}{INT8_M_OR:04X}, 0xEA;\n"
                f"lop3.b32 n, p, 0x{INT8_N_AND:04X}{INT8_N_AND:04X}, 0x{INT8_N_XOR:04X}{INT8_N_XOR:04X}, 0x6A;\n")
_INT8_ASM_BF16 = tl.constexpr("{\n.reg .b32 p, m, n, neg;\nmov.b32 neg, 0xBF80BF80;\n"
                              + "".join(f"prmt.b32 p, $2, 0, {select};\n{_INT8_CENTER}fma.rn.bf16x2 ${out}, n, neg, m;\n"
                                        for out, select in ((0, "0x4140"), (1, "0x4342"))) + "}")


@triton.constexpr_function
def byte_quarter_ptx(j: int, out: str, lo: str, hi: str, fp16: bool, scale: str = "") -> str:
    """PTX of quarter j of two neighbouring int32 words `lo`, `hi` of the int8 quads layout
    (`_layouts.ByteQuadsLayout`): `out` gets byte j of each, code - 128 (zero point 128), as a 16-bit
    float pair, exactly, times the 16-bit pair `scale` if one is named (one rounding). One `prmt`
    puts byte j of lo in the low half and of hi in the high half (bytes 1 and 3 repeat them; the
    masks below drop them); then bf16 `_INT8_ASM_BF16`'s recipe (m = 0x4300 | (c & 0x7F),
    n = 0x4380 ^ (c & 0x80), m - n by an fma with -1), fp16 the code ORed into 1024's mantissa minus
    1152. The scale is multiplied here because, multiplied outside, LLVM re-pairs the asm's 16-bit
    halves (two PRMTs per pair in the SASS). A constexpr function: the kernels build their asm from it."""
    select = f"0x{4 + j}{4 + j}{j}{j}"
    v = "v" if scale else out
    if fp16:
        body = (f"mov.b32 c, 0x64806480; prmt.b32 p, {lo}, {hi}, {select}; "
                f"lop3.b32 m, p, 0x00FF00FF, 0x64006400, 0xEA; sub.f16x2 {v}, m, c;")
        regs, mul = "p, m, c", "mul.rn.f16x2"
    else:
        body = (f"mov.b32 c, 0xBF80BF80; prmt.b32 p, {lo}, {hi}, {select}; "
                f"{_INT8_CENTER}"
                f"fma.rn.bf16x2 {v}, n, c, m;")
        regs, mul = "p, m, n, c", "mul.rn.bf16x2"
    if scale:
        return f"{{.reg .b32 {regs}, v; {body} {mul} {out}, v, {scale};}}"
    return f"{{.reg .b32 {regs}; {body}}}"


_BYTE_QUADS_ASM_BF16 = tl.constexpr("{" + " ".join(byte_quarter_ptx(j, f"${j}", "$4", "$5", False)
                                                   for j in range(4)) + "}")
_BYTE_QUADS_ASM_FP16 = tl.constexpr("{" + " ".join(byte_quarter_ptx(j, f"${j}", "$4", "$5", True)
                                                   for j in range(4)) + "}")


@triton.constexpr_function
def e2m1_quarter_ptx(j: int, out: str, src: str) -> str:
    """PTX of quarter j of one 32-bit register `src` = two int16 words of the MXFP4 quads layout
    (`_layouts.E2M1_FIELDS`): `out` gets both words' e2m1 codes as a bf16 pair, the code's mantissa
    and exponent in bits 6-8 and its sign in bit 15 of each half, every other bit zero. That bf16 is
    the code's value times 2^-126, exactly: a code of exponent 0 lands on a subnormal, as e2m1's own
    subnormal (0.5 = 2^-1 * 1), and the others on normals of the same relative size. lop3 0xEA is
    (a & b) | c. A constexpr function: the kernels build their asm from it at compile time."""
    if j == 0:  # stored in place
        return f"and.b32 {out}, {src}, 0x81C081C0;"
    if j == 1:  # three bits lower, sign included
        return f"{{.reg .b32 t; shl.b32 t, {src}, 3; and.b32 {out}, t, 0x81C081C0;}}"
    # Quarters 2 and 3: a shift for the 3-bit field, one for the sign.
    field = f"shr.b32 f, {src}, 3" if j == 2 else f"shl.b32 f, {src}, 6"
    sign = f"shl.b32 s, {src}, {1 if j == 2 else 2}"
    return f"{{.reg .b32 f, s; {field}; and.b32 f, f, 0x01C001C0; {sign}; lop3.b32 {out}, s, 0x80008000, f, 0xEA;}}"


_E2M1_QUADS_ASM = tl.constexpr("{" + " ".join(e2m1_quarter_ptx(j, f"${j}", "$4") for j in range(4)) + "}")


@triton.jit
def _e2m1_bits(w, j: tl.constexpr):
    """`e2m1_quarter_ptx` on int32 words (one word each): quarter j's bf16 bits in the low 16 bits."""
    if j == 0:
        bits = w & 0x81C0
    elif j == 1:
        bits = (w << 3) & 0x81C0
    elif j == 2:
        bits = ((w >> 3) & 0x01C0) | ((w << 1) & 0x8000)
    else:
        bits = ((w << 6) & 0x01C0) | ((w << 2) & 0x8000)
    return bits


@triton.jit
def _e2m1_value(bits, DT: tl.constexpr):
    """bf16 bits in an int32's low half -> that bf16 in DT (bf16, or fp32: the same bits, 16 zeros after)."""
    if DT == tl.float32:  # noqa: SIM300 (DT is the compile-time dtype, not a literal)
        v = (bits << 16).to(tl.float32, bitcast=True)
    else:
        v = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return v


@triton.jit
def unpack_e2m1_quads(words, DT: tl.constexpr, PTX: tl.constexpr):
    """int16 words (MXFP4 quads) -> four tensors, quarters 0-3: each e2m1 code's value times 2^-126,
    exact, in DT (bf16, or fp32: every such value is a bf16, and an fp32 with the same exponent range).
    PTX: shifts and lop3 on register pairs (`e2m1_quarter_ptx`, NVIDIA, DT bf16); else portable shifts."""
    if PTX:
        tl.static_assert(DT == tl.bfloat16, "the PTX unpack yields bf16 pairs")  # noqa: SIM300
        vals = tl.inline_asm_elementwise(_E2M1_QUADS_ASM, "=r,=r,=r,=r,r", [words], is_pure=True, pack=2,
                                         dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16))
    else:
        w = words.to(tl.int32)
        vals = (_e2m1_value(_e2m1_bits(w, 0), DT), _e2m1_value(_e2m1_bits(w, 1), DT),
                _e2m1_value(_e2m1_bits(w, 2), DT), _e2m1_value(_e2m1_bits(w, 3), DT))
    return vals


@triton.jit
def _pow2(e, FT: tl.constexpr):
    """2^e in FT (bf16 or fp32) for integer e in [-126, 127], built from its exponent bits."""
    if FT == tl.float32:  # noqa: SIM300 (FT is the compile-time dtype, not a literal)
        p = ((e + 127) << 23).to(tl.float32, bitcast=True)
    else:
        p = ((e + 127) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return p


@triton.jit
def e8m0_factors(exps, FT: tl.constexpr, FOLDED: tl.constexpr):
    """e8m0 exponents s (uint8) -> (lo, hi) in FT (bf16 or fp32) that make an `unpack_e2m1_quads`
    value v (the code's value c times 2^-126) the weight c * 2^(s - 127), exactly: v * lo when
    FOLDED, else (v * lo) * hi.

    Why exact: c has at most two significant bits and |c| <= 6, and bf16 and fp32 share fp32's
    exponent range, so c * 2^(s-127) is a bf16 for every e8m0 s (0..254) unless it overflows, which
    it does in the fp32 reference too (2 * 2^127 and up). A product of such exact values rounds to
    itself, so each multiply below gives the exact weight (inf where the reference's is).
    - FOLDED (every s of the tensor at most 128, the processor's check): lo = 2^(s-1) = 2^126 * 2^(s-127),
      a bf16 for s <= 128 (2^127 at most): one multiply per weight.
    - Otherwise 2^(s-1) can exceed bf16's largest power of two (2^127), so the 2^126 is split:
      lo = 2^(min(s, 128) - 1) gives c * 2^(min(s, 128) - 127) exactly (|c| * 2 at most), and
      hi = 2^(max(s, 128) - 128) the rest; both factors are normal powers of two for every s."""
    s = exps.to(tl.int32)
    if FOLDED:
        lo = _pow2(s - 1, FT)
        hi = lo  # unused
    else:
        lo = _pow2(tl.minimum(s, 128) - 1, FT)
        hi = _pow2(tl.maximum(s, 128) - 128, FT)
    return lo, hi


_FOLDED_BIAS = tl.constexpr(E8M0_FOLDED_BIAS)


@triton.constexpr_function
def _word_byte(j):
    """The byte of a K tile's exponent word that holds quarter j's (`_layouts.E8M0_WORD_BYTES`)."""
    return E8M0_WORD_BYTES[j]


@triton.jit
def quarter_e8m0_exponent(exp_words, j: tl.constexpr, FOLDED: tl.constexpr):
    """Quarter j's e8m0 exponents s (int32) from a K tile's exponent words (`_layouts.pack_e8m0_tiles`,
    folded or not)."""
    s = (exp_words >> (8 * _word_byte(j))) & 0xFF
    if FOLDED:
        s -= _FOLDED_BIAS
    return s


@triton.jit
def quarter_e8m0_factors(exp_words, j: tl.constexpr, FT: tl.constexpr, FOLDED: tl.constexpr):
    """`e8m0_factors` of quarter j from a K tile's exponent words (`_layouts.pack_e8m0_tiles`),
    [ROWS] words -> [ROWS, 1] factors. Folded words hold each factor's biased exponent: in bf16 one
    shift and one mask give quarters 0 and 1 (or 2 and 3) as a pair, each half read in place by the
    multiplies; in fp32 each quarter is one shift and one mask."""
    if FOLDED:
        if FT == tl.float32:  # noqa: SIM300 (FT is the compile-time dtype, not a literal)
            if _word_byte(j) == 3:
                bits = (exp_words >> 1) & 0x7F800000
            else:
                bits = (exp_words << (23 - 8 * _word_byte(j))) & 0x7F800000
            lo = bits.to(tl.float32, bitcast=True)
        else:
            # Quarters 0 and 1 sit in bytes 0 and 2, 2 and 3 in bytes 1 and 3: one shift puts a pair
            # in both halves' exponent bits.
            if j < 2:
                pair = (exp_words << 7) & 0x7F807F80
            else:
                pair = (exp_words >> 1) & 0x7F807F80
            if j % 2 == 1:
                pair = pair >> 16
            lo = pair.to(tl.int16).to(tl.bfloat16, bitcast=True)
        lo = tl.expand_dims(lo, 1)
        return lo, lo
    return e8m0_factors(tl.expand_dims(quarter_e8m0_exponent(exp_words, j, False), 1), FT, False)


@triton.jit
def e2m1_weights(v, lo, hi, FOLDED: tl.constexpr, CT: tl.constexpr):
    """Weights of `unpack_e2m1_quads` values with their group's `e8m0_factors`, computed in the
    factors' type (exact, see there), as CT: bf16 and fp32 hold them exactly; fp16 (whose range is
    far narrower) takes each one rounded once, as a cast of the reference's fp32 weight."""
    w = v.to(lo.dtype) * lo
    if not FOLDED:
        w = w * hi
    return w.to(CT)


@triton.jit
def _quarters_asm(words, ASM_BF16: tl.constexpr, ASM_FP16: tl.constexpr, CONSTRAINTS: tl.constexpr,
                  CT: tl.constexpr):
    """The four quarters of quads words from an asm on register pairs (two words per call), as
    16-bit floats of CT (bf16 or fp16)."""
    if CT == tl.bfloat16:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
        vals = tl.inline_asm_elementwise(ASM_BF16, CONSTRAINTS, [words], is_pure=True, pack=2,
                                         dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16))
    else:
        vals = tl.inline_asm_elementwise(ASM_FP16, CONSTRAINTS, [words], is_pure=True, pack=2,
                                         dtype=(tl.float16, tl.float16, tl.float16, tl.float16))
    return vals


@triton.jit
def unpack_quads(words, CT: tl.constexpr, PTX: tl.constexpr):
    """int16 words (quads) -> four tensors of P + code (P = 128 in bf16, 1024 in fp16, 2^23 in fp32):
    nibble j of each word, exact. PTX: lop3 on register pairs (NVIDIA); else portable shifts."""
    if PTX:
        return _quarters_asm(words, _QUAD_ASM_BF16, _QUAD_ASM_FP16, "=r,=r,=r,=r,r", CT)
    return (biased(words & 0xF, CT), biased((words >> 4) & 0xF, CT), biased((words >> 8) & 0xF, CT),
            biased((words >> 12) & 0xF, CT))


@triton.jit
def unpack_byte_quads(words, CT: tl.constexpr, PTX: tl.constexpr):
    """int32 words (int8 quads) -> four tensors, quarters 0-3: byte j of each word minus 128, exact,
    in CT. PTX (NVIDIA, bf16 or fp16): `byte_quarter_ptx` on register pairs (two 32-bit words a
    call: two input registers); else shifts and a conversion (0..255 and their differences with 128
    are exact in every CT)."""
    if PTX:
        return _quarters_asm(words, _BYTE_QUADS_ASM_BF16, _BYTE_QUADS_ASM_FP16, "=r,=r,=r,=r,r,r", CT)
    return (((words & 0xFF).to(CT) - 128), (((words >> 8) & 0xFF).to(CT) - 128),
            (((words >> 16) & 0xFF).to(CT) - 128), (((words >> 24) & 0xFF).to(CT) - 128))


@triton.jit
def int8_zero(zero_ptrs, n_mask, HAS_ZP: tl.constexpr, CT: tl.constexpr, BLOCK_N: tl.constexpr):
    """One scale group's zero point - 128 in CT (0 without zero points), [BN, 1]."""
    if HAS_ZP:
        return tl.expand_dims(tl.load(zero_ptrs, mask=n_mask, other=128).to(CT) - 128, 1)
    return tl.zeros((BLOCK_N, 1), CT)


@triton.jit
def paired_scales(words, ST: tl.constexpr):
    """int32 words [BN/2], each two neighbouring 16-bit scales (the even row's in the low half) -> the
    [BN] scales in ST."""
    pairs = tl.join((words & 0xFFFF).to(tl.int16), (words >> 16).to(tl.int16))
    return tl.reshape(pairs, (2 * words.shape[0],)).to(ST, bitcast=True)


@triton.jit
def biased(codes, CT: tl.constexpr):
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
def int4_zero(zero_ptrs, n_mask, HAS_ZP: tl.constexpr, CODE_OFFSET: tl.constexpr, CT: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """One scale group's P + zero point in CT (P of `biased`), [BN, 1]."""
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
def int4_group(scale_ptrs, zero_ptrs, n_mask, HAS_ZP: tl.constexpr, CODE_OFFSET: tl.constexpr, CT: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """One scale group's [BN, 1] scale and P + zero point in CT (P of `biased`), N along axis 0."""
    # Through fp32: the interpreter mishandles a direct bf16 -> fp16 cast.
    s = tl.expand_dims(tl.load(scale_ptrs, mask=n_mask, other=0.0).to(tl.float32).to(CT), 1)
    return s, int4_zero(zero_ptrs, n_mask, HAS_ZP, CODE_OFFSET, CT, BLOCK_N)


@triton.jit
def dequantize(codes, scale_ptrs, zero_ptrs, n_mask, WTYPE: tl.constexpr, HAS_ZP: tl.constexpr,
             CODE_OFFSET: tl.constexpr, CT: tl.constexpr, N_AXIS: tl.constexpr, PTX: tl.constexpr):
    """INT4 (halves) / INT8 codes tile, N along axis N_AXIS -> values in CT; scale_ptrs/zero_ptrs
    [BN]: the group's row. PTX: bf16 int8 codes of zero point 128 centered by `_INT8_ASM_BF16`."""
    if WTYPE == 0:
        tl.static_assert(N_AXIS == 0, "int4 runs swapped only")
        s, z = int4_group(scale_ptrs, zero_ptrs, n_mask, HAS_ZP, CODE_OFFSET, CT, codes.shape[0])
        return (biased(codes, CT) - z) * s
    # Through fp32: the interpreter mishandles a direct bf16 -> fp16 cast.
    s = tl.expand_dims(tl.load(scale_ptrs, mask=n_mask, other=0.0).to(tl.float32).to(CT), 1 - N_AXIS)
    if HAS_ZP:
        z = tl.expand_dims(tl.load(zero_ptrs, mask=n_mask, other=0).to(CT), 1 - N_AXIS)
        # codes and zeros are small integers: exact in CT, so one rounding as in the reference.
        return (codes.to(CT) - z) * s
    if PTX and CT == tl.bfloat16 and CODE_OFFSET == 128:  # noqa: SIM300
        v = tl.inline_asm_elementwise(_INT8_ASM_BF16, "=r,=r,r", [codes], is_pure=True, pack=4, dtype=tl.bfloat16)
        return v * s
    return (codes.to(CT) - CODE_OFFSET) * s


# ---- torch -------------------------------------------------------------------------------------


def byte_quarter_torch(lo: torch.Tensor, hi: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`byte_quarter_ptx`'s bf16 path in torch, on int32 words: (code - 128 of byte j of lo, of hi).
    Its prmt leaves byte j of lo in bits 0-7 and 8-15 of a register and byte j of hi in 16-23 and
    24-31; each 16-bit lane then goes through `_INT8_ASM_BF16`'s lop3s and fma."""
    p = (((lo >> (8 * j)) & 0xFF) * 0x0101) | ((((hi >> (8 * j)) & 0xFF) * 0x0101) << 16)
    return _centered_lane(p & 0xFFFF), _centered_lane((p >> 16) & 0xFFFF)


def _centered_lane(lane: torch.Tensor) -> torch.Tensor:
    """`_INT8_ASM_BF16`'s lop3s and fma on 16-bit lanes held in int32 (the code in the low byte; the
    masks drop the high byte), in torch."""
    m = ((lane & INT8_M_AND) | INT8_M_OR).to(torch.int16).view(torch.bfloat16)
    n = ((lane & INT8_N_AND) ^ INT8_N_XOR).to(torch.int16).view(torch.bfloat16)
    return m - n


def int8_centered_torch(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes -> bf16 code - 128 by `_INT8_ASM_BF16`'s bit recipe (its lop3 and fma), in torch."""
    return _centered_lane(codes.to(torch.int32))


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
    if w.quads and w.wtype is WType.INT8:
        codes = ByteQuadsLayout(w.block_k).unswizzle(w.codes)
    elif w.quads:
        codes = QuadsLayout(w.block_k, E2M1_FIELDS if w.wtype is WType.MXFP4 else INT4_NIBBLES).unswizzle(w.codes)
    elif w.wtype is WType.INT4:
        codes = HalvesLayout(w.block_k).unswizzle(w.codes)
    else:
        codes = w.codes
    if w.wtype is WType.MXFP4:
        exps = unpack_e8m0_tiles(w.scale, w.folded_scale).transpose(1, 2)
        exps = exps.repeat_interleave(w.group, 2)  # [E, N, padded K]
        return E2M1_VALUES.to(codes.device)[codes.long()] * torch.exp2(exps.float() - 127)
    scale = w.scale.transpose(1, 2).repeat_interleave(w.group, 2)  # [E, N, padded K]
    zero = (w.zero.transpose(1, 2).repeat_interleave(w.group, 2).float() if w.zero is not None
            else float(w.code_offset))
    return (codes.float() - zero) * scale.float()
