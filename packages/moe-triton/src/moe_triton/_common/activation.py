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
def activate(gate, up, alpha, limit, ACT: tl.constexpr):
    """The expert activation in fp32 (ACT: an `ActKind` code): gate and up of the gated kinds; the
    non-gated ones read gate only."""
    if ACT == 1:
        out = gate * tl.sigmoid(gate) * up
    elif ACT == 2:
        out = 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476)) * up
    elif ACT == 3:
        # tanh(z) = 2 * sigmoid(2z) - 1 keeps this portable across Triton backends.
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        out = gate * tl.sigmoid(2.0 * z) * up
    elif ACT == 4:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        out = gate * tl.sigmoid(alpha * gate) * (up + 1.0)
    elif ACT == 5:
        r = tl.maximum(gate, 0.0)
        out = r * r
    else:
        out = gate
    return out
