"""Dequantization of the weight layouts (`_layouts`): in registers inside the kernels (jit), and
in torch for the twin (`dequantize_operand`).

In the kernels, 4-bit codes become floats by ORing them into the mantissa of a power of two whose
ulp is 1 (`biased`): exact, and cheaper than an integer -> float conversion; the zero point is then
subtracted in the compute type (exact for codes below 16) so the scale's multiply is the only
rounding, as in the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_core.weights.packing import E2M1_VALUES
from moe_triton.quant_gemm_details._layouts import HalvesLayout, QuadsLayout, WeightOperand, WType

__all__ = ["biased", "dequantize", "dequantize_operand", "dequantize_padded", "e2m1", "int4_group", "int4_zero",
           "unpack_quads"]

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

@triton.jit
def e2m1(codes, CT: tl.constexpr):
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
def unpack_quads(words, CT: tl.constexpr, PTX: tl.constexpr):
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
    return (biased(words & 0xF, CT), biased((words >> 4) & 0xF, CT), biased((words >> 8) & 0xF, CT),
            biased((words >> 12) & 0xF, CT))


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
             CODE_OFFSET: tl.constexpr, CT: tl.constexpr, N_AXIS: tl.constexpr):
    """INT4 (halves) / INT8 / MXFP4 codes tile, N along axis N_AXIS -> values in CT; scale_ptrs/zero_ptrs
    [BN]: the group's row."""
    if WTYPE == 0:
        tl.static_assert(N_AXIS == 0, "int4 runs swapped only")
        s, z = int4_group(scale_ptrs, zero_ptrs, n_mask, HAS_ZP, CODE_OFFSET, CT, codes.shape[0])
        return (biased(codes, CT) - z) * s
    if WTYPE == 3:
        scale = tl.expand_dims(tl.exp2(tl.load(scale_ptrs, mask=n_mask, other=127).to(tl.float32) - 127.0), 1 - N_AXIS)
        # One return: after `if CONSTEXPR: return`, Triton 3.6 still compiles the code that follows.
        if CT == tl.float16:  # noqa: SIM300 (CT is the compile-time dtype, not a literal)
            # 2^(s - 127) leaves fp16's range for many e8m0 exponents: scale in fp32.
            values = (e2m1(codes, tl.float32) * scale).to(CT)
        else:
            values = e2m1(codes, CT) * scale.to(CT)  # powers of two: bf16 and fp32 hold every e8m0 scale
        return values
    # Through fp32: the interpreter mishandles a direct bf16 -> fp16 cast.
    s = tl.expand_dims(tl.load(scale_ptrs, mask=n_mask, other=0.0).to(tl.float32).to(CT), 1 - N_AXIS)
    if HAS_ZP:
        z = tl.expand_dims(tl.load(zero_ptrs, mask=n_mask, other=0).to(CT), 1 - N_AXIS)
        # codes and zeros are small integers: exact in CT, so one rounding as in the reference.
        return (codes.to(CT) - z) * s
    return (codes.to(CT) - CODE_OFFSET) * s


# ---- torch -------------------------------------------------------------------------------------


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
        codes = QuadsLayout(w.block_k).unswizzle(w.codes)
    elif w.wtype in (WType.INT4, WType.MXFP4):
        codes = HalvesLayout(w.block_k).unswizzle(w.codes)
    else:
        codes = w.codes
    scale = w.scale.transpose(1, 2).repeat_interleave(w.group, 2)  # [E, N, padded K]
    if w.wtype is WType.MXFP4:
        return E2M1_VALUES.to(codes.device)[codes.long()] * torch.exp2(scale.float() - 127)
    zero = (w.zero.transpose(1, 2).repeat_interleave(w.group, 2).float() if w.zero is not None
            else float(w.code_offset))
    return (codes.float() - zero) * scale.float()
