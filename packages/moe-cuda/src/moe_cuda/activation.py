"""The expert activation between GEMM1 and GEMM2 as one Triton pass on CUDA.

GEMM1's rows [P, R] in the layer dtype become [P, N]: read once, the math in fp32, written once in
the layer dtype, as moe-core's `apply_activation` on an fp32 copy computes it (the torch form took
four to six launches and an fp32 copy of GEMM1's output). Every activation kind moe-core defines:
gated SiLU (optionally clamped), GELU (erf and tanh forms), gpt-oss's SwiGLU, and non-gated ReLU².
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_core.config import Activation, ActivationKind

__all__ = ["activation_pass"]

_KINDS = {ActivationKind.SILU: 0, ActivationKind.GELU: 1, ActivationKind.GELU_TANH: 2,
          ActivationKind.SWIGLU_OAI: 3, ActivationKind.RELU2: 4}
_BLOCK = 1024


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _activation(h_ptr, out_ptr, N, stride_h, stride_out, alpha, limit, KIND: tl.constexpr, CLAMPED: tl.constexpr,
                BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    if KIND == 4:  # relu2, not gated
        x = tl.load(h_ptr + row * stride_h + cols, mask=mask).to(tl.float32)
        x = tl.maximum(x, 0.0)
        y = x * x
    else:
        gate = tl.load(h_ptr + row * stride_h + cols, mask=mask).to(tl.float32)
        up = tl.load(h_ptr + row * stride_h + N + cols, mask=mask).to(tl.float32)
        if CLAMPED:  # clamped SiLU and SwiGLU: gate <= limit, -limit <= up <= limit
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
        if KIND == 0:
            y = gate * _sigmoid(gate) * up
        elif KIND == 1:
            y = 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476)) * up
        elif KIND == 2:  # 0.5 x (1 + tanh z) = x sigmoid(2z)
            z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
            y = gate * _sigmoid(2.0 * z) * up
        else:
            y = gate * _sigmoid(alpha * gate) * (up + 1.0)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def activation_pass(h: torch.Tensor, activation: Activation) -> torch.Tensor:
    """GEMM1 output [P, R] -> [P, N] in h's dtype (gated kinds read [gate | up] halves)."""
    kind = activation.kind
    n = h.shape[1] // 2 if kind.gated else h.shape[1]
    out = torch.empty(h.shape[0], n, dtype=h.dtype, device=h.device)
    if h.shape[0] == 0 or n == 0:
        return out
    if h.stride(1) != 1:
        h = h.contiguous()
    limit = activation.limit if kind is ActivationKind.SWIGLU_OAI else activation.clamp
    _activation[(h.shape[0], triton.cdiv(n, _BLOCK))](
        h, out, n, h.stride(0), out.stride(0), float(activation.alpha or 0.0), float(limit or 0.0),
        KIND=_KINDS[kind], CLAMPED=limit is not None, BLOCK=_BLOCK)
    return out
