"""Fused router: router logits [M, E] -> (topk_weights fp32 [M, k], topk_ids int32 [M, k]) in one launch.

Same signature and semantics as `moe_core.routing.route_torch` (its twin, which the tests compare
against): softmax or sigmoid scores, optional correction bias for selection only, DeepSeek-V3
groups scored by their best two experts, top-k, optional renormalization and routed scaling.
Llama4's top-1 sigmoid is the sigmoid case with k = 1 (its weight is applied to the input by the
experts, not here). Ties between equal scores go to the lower expert id.
"""

from __future__ import annotations

import torch

from moe_core.config import Routing, Scoring
from moe_core.routing import route_torch
from moe_triton._details.routing_kernels import launch_route

__all__ = ["route", "route_torch"]


def route(router_logits: torch.Tensor, routing: Routing, top_k: int,
          correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [M, E], got shape {list(router_logits.shape)}")
    if not router_logits.dtype.is_floating_point:
        raise ValueError(f"router_logits must be floating point, got {router_logits.dtype}")
    M, E = router_logits.shape
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k={top_k} must be in [1, num_experts={E}]")
    if routing.has_correction_bias:
        if correction_bias is None or tuple(correction_bias.shape) != (E,):
            got = None if correction_bias is None else list(correction_bias.shape)
            raise ValueError(f"routing has a correction bias: expected correction_bias of shape [{E}], got {got}")
        if correction_bias.device != router_logits.device:
            raise ValueError(f"correction_bias is on {correction_bias.device}, router_logits on {router_logits.device}")
    elif correction_bias is not None:
        raise ValueError("correction_bias was given but routing.has_correction_bias is False")
    groups = routing.num_expert_groups
    if E % groups:
        raise ValueError(f"num_experts={E} is not divisible by num_expert_groups={groups}")
    if groups > 1 and routing.topk_groups * (E // groups) < top_k:
        raise ValueError(f"top_k={top_k} exceeds the experts in the kept groups "
                         f"({routing.topk_groups} x {E // groups})")
    weights = torch.empty(M, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(M, top_k, dtype=torch.int32, device=router_logits.device)
    if M == 0:
        return weights, ids
    bias = correction_bias.float().contiguous() if correction_bias is not None else None
    launch_route(router_logits.contiguous(), bias, weights, ids, top_k=top_k,
                 softmax=routing.scoring is Scoring.SOFTMAX, groups=groups, topk_groups=routing.topk_groups,
                 renormalize=routing.renormalize, renormalize_eps=routing.renormalize_eps,
                 scaling=routing.routed_scaling_factor)
    return weights, ids
