"""Dynamic fp8 quantization of activations in 1 x 128 groups, one Triton pass on CUDA.

Each row's groups of 128 columns get a scale amax / 448 (at least 1e-12 / 448) and codes x / scale
rounded to float8_e4m3fn: `moe_cuda.sglang_fp8.quantize_groups_fp8` is the torch twin (five to six
launches where this is one).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["GROUP", "quantize_groups_pass"]

GROUP = 128
_FP8_MAX = 448.0


@triton.jit
def _quantize_groups(x_ptr, codes_ptr, scales_ptr, stride_x, K, FP8_MAX: tl.constexpr, GROUP: tl.constexpr,
                     INTERPRET: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    cols = group * GROUP + tl.arange(0, GROUP)
    x = tl.load(x_ptr + row * stride_x + cols).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), 0), 1e-12) / FP8_MAX
    codes = tl.minimum(tl.maximum(x / scale, -FP8_MAX), FP8_MAX)
    if INTERPRET:
        # The CPU interpreter's fp32 -> e4m3 cast loses the carry when rounding up to the next power
        # of two: round to 3 mantissa bits here (subnormal spacing 2**-9, ties to even, as the GPU's
        # cast and torch's do), so its cast is exact.
        step = tl.exp2(tl.maximum(tl.floor(tl.log2(tl.abs(codes))), -6.0) - 3.0)
        units = tl.abs(codes) / step
        rounded = tl.floor(units + 0.5)
        odd = rounded - 2.0 * tl.floor(rounded * 0.5) == 1.0
        rounded = tl.where((rounded - units == 0.5) & odd, rounded - 1.0, rounded) * step
        codes = tl.where(codes < 0, -rounded, rounded)
    tl.store(codes_ptr + row * K + cols, codes.to(codes_ptr.dtype.element_ty, fp_downcast_rounding="rtne"))
    tl.store(scales_ptr + row * (K // GROUP) + group, scale)


def quantize_groups_pass(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [P, k] (k a multiple of 128) -> (codes [P, k] float8_e4m3fn, fp32 scales [P, k / 128])."""
    P, k = x.shape
    if k % GROUP:
        raise ValueError(f"quantize_groups_pass: {k} columns are not a multiple of the group size {GROUP}")
    codes = torch.empty(P, k, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(P, k // GROUP, dtype=torch.float32, device=x.device)
    if P:
        if x.stride(1) != 1:
            x = x.contiguous()
        _quantize_groups[(P, k // GROUP)](x, codes, scales, x.stride(0), k, FP8_MAX=_FP8_MAX, GROUP=GROUP,
                                          INTERPRET=os.environ.get("TRITON_INTERPRET") == "1")
    return codes, scales
