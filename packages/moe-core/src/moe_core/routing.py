"""Torch reference router: router logits [M, E] -> (topk_weights fp32 [M, k], topk_ids int32 [M, k]).

The semantics are `Routing`'s docstring; every fast router is tested against `route_torch`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_core.config import GroupScoring, Routing, Scoring

__all__ = ["check_router_inputs", "route_torch"]


def check_router_inputs(router_logits: torch.Tensor, routing: Routing, top_k: int,
                        correction_bias: torch.Tensor | None) -> None:
    """The argument checks every router implementation shares; errors name what is accepted."""
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [M, E], got shape {list(router_logits.shape)}")
    if not router_logits.dtype.is_floating_point:
        raise ValueError(f"router_logits must be floating point, got {router_logits.dtype}")
    E = router_logits.shape[1]
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
    if routing.grouped and E % groups:
        raise ValueError(f"num_experts={E} is not divisible by num_expert_groups={groups}")
    if routing.grouped and routing.topk_groups * (E // groups) < top_k:
        raise ValueError(f"top_k={top_k} exceeds the experts in the kept groups ({routing.topk_groups} x {E // groups})")


def route_torch(router_logits: torch.Tensor, routing: Routing, top_k: int,
                correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    check_router_inputs(router_logits, routing, top_k, correction_bias)
    M, E = router_logits.shape
    logits = router_logits.float()
    if routing.scoring is Scoring.SOFTMAX:
        scores = torch.softmax(logits, -1)
    elif routing.scoring is Scoring.SIGMOID:
        scores = torch.sigmoid(logits)
    else:
        scores = F.softplus(logits).sqrt()
    if correction_bias is None:
        choice = scores
    else:
        choice = (logits if routing.correction_bias_on_logits else scores) + correction_bias.float()
    if routing.grouped:
        G = routing.num_expert_groups
        grouped = choice.view(M, G, E // G)
        if routing.group_scoring is GroupScoring.MAX:
            group_scores = grouped.amax(-1)
        else:  # DeepSeek-V3: the best two experts (one, if the group has one)
            group_scores = grouped.topk(min(2, E // G), dim=-1).values.sum(-1)
        keep = torch.zeros(M, G, dtype=torch.bool, device=logits.device)
        keep.scatter_(1, group_scores.topk(routing.topk_groups, dim=-1).indices, True)
        # -inf, not 0: with a negative bias a masked 0 could beat every kept expert.
        choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(M, E)
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if routing.renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + routing.renormalize_eps)
    if routing.routed_scaling_factor != 1.0:
        weights = weights * routing.routed_scaling_factor
    return weights, ids.to(torch.int32)
