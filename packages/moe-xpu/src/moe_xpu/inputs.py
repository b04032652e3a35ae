"""What the experts class hands the kernel besides the weights: routed inputs and fp8 activations.

Shared by `moe_xpu.experts` and the torch twin, so that both compute one thing.
"""

from __future__ import annotations

import torch

from moe_core.config import MoEConfig

__all__ = ["FP8_ACTIVATION_EPS", "dequantize_fp8_groups", "quantize_fp8_groups", "routed_inputs"]

_FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
# The floor on a group's absolute maximum in vllm-xpu-kernels' per-token-group fp8 quantization.
FP8_ACTIVATION_EPS = 1e-10


def routed_inputs(hidden_states: torch.Tensor, topk_weights: torch.Tensor, config: MoEConfig
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states, fp32 top-k weights) for the kernel, which weights each expert's output.

    Weight on the input (Llama4, always top-1) scales the input by its one weight and makes the
    kernel's output weight 1.
    """
    weights = topk_weights.float()
    if not config.routing.weight_on_input:
        return hidden_states, weights
    return (hidden_states.float() * weights).to(hidden_states.dtype), torch.ones_like(weights)


def quantize_fp8_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8_e4m3fn [M, K], fp32 scales [M, K/group]): one scale per row and group,
    amax / 448, as the kernel quantizes activations for block fp8."""
    m, k = x.shape
    if k % group:
        raise ValueError(f"activation width {k} is not a multiple of the fp8 group {group}")
    xg = x.float().view(m, k // group, group)
    scale = xg.abs().amax(-1, keepdim=True).clamp(min=FP8_ACTIVATION_EPS) / _FP8_MAX
    q = (xg / scale).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(m, k), scale.squeeze(-1)


def dequantize_fp8_groups(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of `quantize_fp8_groups`, in fp32."""
    m, k = q.shape
    return (q.float().view(m, scale.shape[1], -1) * scale.unsqueeze(-1)).view(m, k)
