"""Dynamic fp8 e4m3 quantization inside kernels, as `moe_core.reference.fake_quantize_activation`
does it: a scale of max(amax, 1e-12) / 448 per row or group, values divided by it (correctly rounded),
clamped to +-448 and rounded to nearest even. Shared by the activation launch (`moe_triton.act_quant`)
and the quantized GEMM's in-kernel operand quantization, which must produce the same codes."""

from __future__ import annotations

import triton
import triton.language as tl

from moe_triton._common.target import interpreting

__all__ = ["FP8_MAX", "fp8_codes", "fp8_quotients", "fp8_scale", "to_fp8"]

FP8_MAX = 448.0
_FP8_MAX = tl.constexpr(FP8_MAX)  # the kernels' copy: jit code reads only constexpr globals
_INTERPRETED = tl.constexpr(interpreting())  # fixed at import, as Triton decides whether kernels are interpreted


@triton.jit
def to_fp8(q, dtype: tl.constexpr):
    """fp32 values already within +-448 -> e4m3 codes of `dtype`, rounded to nearest even."""
    if _INTERPRETED:
        # The CPU interpreter's fp32 -> e4m3 cast loses the carry when rounding up to the next
        # power of two; round to 3 mantissa bits here (subnormal spacing 2**-9, ties to even as the
        # GPU's cast and torch's) so its cast is exact.
        step = tl.exp2(tl.maximum(tl.floor(tl.log2(tl.abs(q))), -6.0) - 3.0)
        units = tl.abs(q) / step
        r = tl.floor(units + 0.5)
        odd = r - 2.0 * tl.floor(r * 0.5) == 1.0
        r = tl.where((r - units == 0.5) & odd, r - 1.0, r) * step
        q = tl.where(q < 0, -r, r)
    return q.to(dtype, fp_downcast_rounding="rtne")


@triton.jit
def fp8_scale(amax):
    """The scale of values whose largest magnitude is amax (fp32)."""
    return tl.maximum(amax, 1e-12) / _FP8_MAX


@triton.jit
def fp8_quotients(y, s):
    """y / s (correctly rounded, as torch divides) clamped to +-448, in fp32; s broadcasts against y."""
    return tl.clamp(tl.math.div_rn(y, tl.zeros_like(y) + s), -_FP8_MAX, _FP8_MAX)


@triton.jit
def fp8_codes(y, s, dtype: tl.constexpr):
    """y / s as e4m3 codes of `dtype`; s broadcasts against y."""
    return to_fp8(fp8_quotients(y, s), dtype)
