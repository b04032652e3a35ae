"""The expert activations inside the kernels' epilogues, and their compile-time codes."""

from __future__ import annotations

import enum

import triton
import triton.language as tl

from moe_core.config import Activation


class ActKind(enum.IntEnum):
    """The ACT constexpr of every kernel that applies an activation."""

    NONE = 0  # identity (GEMM2, or quantizing the layer input)
    SILU = 1
    GELU = 2
    GELU_TANH = 3
    SWIGLU_OAI = 4
    RELU2 = 5


def act_kind(activation: Activation) -> ActKind:
    return ActKind[activation.kind.name]


@triton.jit
def _sigmoid(x, FAST: tl.constexpr):
    """FAST (NVIDIA only): 1 / (1 + 2^(-x log2 e)) by the ex2 and rcp approximations with subnormals
    flushed, three instructions where tl.sigmoid's IEEE-ready exp and division take about twelve;
    within a few fp32 ulps of it (a flushed subnormal only where the sigmoid is 1 or below 2^-126)."""
    if FAST:
        return tl.inline_asm_elementwise(
            "{ .reg .f32 t; ex2.approx.ftz.f32 t, $1; add.ftz.f32 t, t, 0f3F800000; rcp.approx.ftz.f32 $0, t; }",
            "=f,f", [x * -1.4426950408889634], dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.sigmoid(x)


@triton.jit
def activate(gate, up, alpha, limit, ACT: tl.constexpr, FAST_SIGMOID: tl.constexpr = False):
    """The expert activation in fp32 (ACT: an `ActKind` code): gate and up of the gated kinds; the
    non-gated ones read gate only. FAST_SIGMOID: `_sigmoid`'s PTX (kernels that only run on NVIDIA)."""
    if ACT == 1:
        out = gate * _sigmoid(gate, FAST_SIGMOID) * up
    elif ACT == 2:
        out = 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476)) * up
    elif ACT == 3:
        # tanh(z) = 2 * sigmoid(2z) - 1 keeps this portable across Triton backends.
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        out = gate * _sigmoid(2.0 * z, FAST_SIGMOID) * up
    elif ACT == 4:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        out = gate * _sigmoid(alpha * gate, FAST_SIGMOID) * (up + 1.0)
    elif ACT == 5:
        r = tl.maximum(gate, 0.0)
        out = r * r
    else:
        out = gate
    return out
