"""A pure-torch twin of AITER's `fused_moe`, reading the same arguments in the same layouts.

It computes what `aiter.fused_moe.fused_moe` documents, from the tensors `moe_rocm.layouts` produces:
unshuffle the weights, dequantize them as AITER does (per-row or 128x128 block fp32 scales), quantize
the activations dynamically to the weights' fp8 type (amax / fp8 max per row, or per row and 128
columns; an all-zero group gets scale 1, as AITER's `pertoken_quant`), GEMM1, the gated activation
on [gate | up], the stage-1 output rounded to the output dtype (AITER's intermediate buffer), GEMM2,
and the router weights applied after GEMM1 (`doweight_stage1`) or after GEMM2. `expert_mask` is
AITER's 0/1 int32 mask over the global experts: the masked-in experts, in order, are the local
weights' experts, and choices of the others contribute nothing.

Used on the CPU to prove that the processed layouts carry the canonical weights (the tests compare it
with `moe_core.reference.reference_moe`); the kernel itself runs only on a ROCm GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_rocm.aiter_api import ActivationType, QuantType
from moe_rocm.layouts import unshuffle_weight

__all__ = ["fused_moe_twin"]

_BLOCK = 128  # per_128x128: weight blocks of 128x128, activation groups of 1x128


def fused_moe_twin(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weight: torch.Tensor,
                   topk_ids: torch.Tensor, expert_mask: torch.Tensor | None = None,
                   activation: ActivationType = ActivationType.Silu, quant_type: QuantType = QuantType.No,
                   doweight_stage1: bool = False, w1_scale: torch.Tensor | None = None,
                   w2_scale: torch.Tensor | None = None, a1_scale: torch.Tensor | None = None,
                   a2_scale: torch.Tensor | None = None, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """[M, K] -> [M, K] in `dtype` (default: hidden_states'), with AITER's `fused_moe` parameters."""
    if a1_scale is not None or a2_scale is not None:
        raise ValueError("fused_moe_twin models dynamic activation scales only: pass a1_scale=a2_scale=None")
    dtype = dtype or hidden_states.dtype
    E, R, K = w1.shape
    N = w2.shape[2]
    if R != 2 * N or tuple(w2.shape) != (E, K, N):
        raise ValueError(f"fused_moe_twin models gated layers (w1 [E, 2N, K], w2 [E, K, N]); got w1 {list(w1.shape)}, "
                         f"w2 {list(w2.shape)}")
    w13 = _dequantize(unshuffle_weight(w1), w1_scale, quant_type)
    w2f = _dequantize(unshuffle_weight(w2), w2_scale, quant_type)
    fp8 = w1.dtype if quant_type is not QuantType.No else None
    ids = topk_ids.long()
    if expert_mask is not None:
        local = expert_mask.long().cumsum(0) - 1
        ids = torch.where(expert_mask.bool(), local, -1)[ids]
    weights = topk_weight.float()
    a1 = _quantize(hidden_states.float(), quant_type, fp8)
    out = torch.zeros(hidden_states.shape[0], K, dtype=torch.float32, device=hidden_states.device)
    for e in range(E):
        token, slot = (ids == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        h = a1[token] @ w13[e].T
        if doweight_stage1:
            h = h * weights[token, slot, None]
        a = _activate(h, activation).to(dtype).float()
        y = _quantize(a, quant_type, fp8) @ w2f[e].T
        if not doweight_stage1:
            y = y * weights[token, slot, None]
        out.index_add_(0, token, y)
    return out.to(dtype)


def _dequantize(w: torch.Tensor, scale: torch.Tensor | None, quant_type: QuantType) -> torch.Tensor:
    if quant_type is QuantType.No:
        return w.float()
    if scale is None:
        raise ValueError(f"{quant_type.name} weights need their scales")
    if quant_type is QuantType.per_Token:
        return w.float() * scale.float().reshape(w.shape[0], w.shape[1], 1)
    if quant_type is QuantType.per_128x128:
        return w.float() * scale.float().repeat_interleave(_BLOCK, 1).repeat_interleave(_BLOCK, 2)
    raise ValueError(f"fused_moe_twin does not model quant_type {quant_type!r}")


def _quantize(x: torch.Tensor, quant_type: QuantType, fp8: torch.dtype | None) -> torch.Tensor:
    """Quantize-dequantize fp32 activations [rows, cols] the way AITER's dynamic quantization does."""
    if quant_type is QuantType.No:
        return x
    groups = x.view(x.shape[0], -1, _BLOCK) if quant_type is QuantType.per_128x128 else x.unsqueeze(1)
    fp8_max = torch.finfo(fp8).max
    scale = groups.abs().amax(-1, keepdim=True) / fp8_max
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    codes = (groups / scale).clamp(-fp8_max, fp8_max).to(fp8)
    return (codes.float() * scale).view_as(x)


def _activate(h: torch.Tensor, activation: ActivationType) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    if activation is ActivationType.Silu:
        return F.silu(gate) * up
    if activation is ActivationType.Gelu:
        return F.gelu(gate) * up
    raise ValueError(f"fused_moe_twin does not model activation {activation!r}")
