"""Torch reference router: router logits [M, E] -> (topk_weights fp32 [M, k], topk_ids int32 [M, k]).

The semantics are `Routing`'s docstring; every fast router is tested against `route_torch`.

Infinite logits have defined results, computed without host synchronization; rows of finite logits
route exactly as if these rules did not exist:
- A +Inf logit chooses its expert: +Inf experts rank above every other (a selection bias does not
  change that), lower ids first among several, and a group holding one is kept first. Their weight
  is the limit of their score as the logit grows without bound: softmax shares the probability
  equally among the row's n +Inf experts (1/n each, 0 for every other expert, which then follow in
  the order of their logits where no selection bias orders them); sigmoid gives 1; sqrt-softplus
  gives +Inf, which renormalization turns into an equal share (without it the weight, and so the
  output, is +Inf).
- A -Inf logit rules its expert out: its score is 0 (softmax, sigmoid and sqrt-softplus alike) and it
  ranks below every possible expert of the kept groups, whatever the bias; it fills a slot (weight
  0, lower ids first) only where fewer than k experts are possible. A row whose logits are all -Inf
  has no possible expert: it gets the k lowest expert ids with weight 0, so the token's routed
  output is zero (with Llama4's weight on the input, the experts see a zero input), as for a token
  that a capacity-limited router drops. (Choosing experts the router ruled out, or NaN weights,
  would be silently wrong.)
NaN logits are garbage in, garbage out: the weights and ids of their rows are unspecified.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_core.config import GroupScoring, Routing, Scoring

__all__ = ["check_router_inputs", "route_torch"]

_INF = float("inf")


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
    unbounded = logits == _INF  # +Inf logits (see the module docstring)
    row_unbounded = unbounded.any(-1, keepdim=True)
    if routing.scoring is Scoring.SOFTMAX:
        # softmax is NaN on a row holding +Inf; its limit shares the probability among the +Inf experts.
        scores = torch.where(row_unbounded, unbounded / unbounded.sum(-1, keepdim=True).clamp(min=1),
                             torch.softmax(logits, -1))
    elif routing.scoring is Scoring.SIGMOID:
        scores = torch.sigmoid(logits)
    else:
        scores = F.softplus(logits).sqrt()
    if routing.chooses_by_logit:
        choice = logits  # softmax's order (`Routing`), and the order it keeps in a +Inf row whose other scores are 0
    elif correction_bias is None:
        # Softmax scores the other experts of a +Inf row 0: their logits keep the order softmax has.
        choice = torch.where(row_unbounded, logits, scores) if routing.scoring is Scoring.SOFTMAX else scores
    else:
        choice = (logits if routing.correction_bias_on_logits else scores) + correction_bias.float()
    choice = torch.where(unbounded, _above_every_choice(E, logits.device), choice)
    # Below every possible expert whatever the bias, lower ids first; above the experts of dropped groups.
    selectable = torch.where(logits == -_INF, _below_every_choice(E, logits.device), choice)
    if routing.grouped:
        G = routing.num_expert_groups
        grouped = choice.view(M, G, E // G)
        if routing.group_scoring is GroupScoring.MAX:
            group_scores = grouped.amax(-1)
        else:  # DeepSeek-V3: the best two experts (one, if the group has one)
            group_scores = grouped.topk(min(2, E // G), dim=-1).values.sum(-1)
        # Groups holding a +Inf expert first, groups of -Inf experts only last, lower ids first in each.
        group_scores = torch.where(unbounded.view(M, G, E // G).any(-1), _above_every_choice(G, logits.device),
                                   group_scores)
        group_scores = torch.where((logits == -_INF).view(M, G, E // G).all(-1), _below_every_choice(G, logits.device),
                                   group_scores)
        keep = torch.zeros(M, G, dtype=torch.bool, device=logits.device)
        keep.scatter_(1, group_scores.topk(routing.topk_groups, dim=-1).indices, True)
        # -inf, not 0: with a negative bias a masked 0 could beat every kept expert.
        selectable = selectable.view(M, G, E // G).masked_fill(~keep.unsqueeze(-1), -_INF).view(M, E)
    ids = selectable.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if routing.renormalize:
        # Unbounded scores (sqrt-softplus of +Inf) share the weight equally, as in the limit.
        infinite = weights == _INF
        weights = torch.where(infinite.any(-1, keepdim=True), infinite / infinite.sum(-1, keepdim=True).clamp(min=1),
                              weights / (weights.sum(-1, keepdim=True) + routing.renormalize_eps))
    if routing.routed_scaling_factor != 1.0:
        weights = weights * routing.routed_scaling_factor
    no_expert = (logits == -_INF).all(-1, keepdim=True)
    weights = weights.masked_fill(no_expert, 0.0)
    ids = torch.where(no_expert, torch.arange(top_k, device=ids.device), ids)
    return weights, ids.to(torch.int32)


def _above_every_choice(n: int, device: torch.device) -> torch.Tensor:
    """The n largest finite fp32 values, descending: where +Inf experts (groups) stand in the choice, so
    that they rank above every finite choice and the lower id wins among them (torch.topk breaks
    ties arbitrarily). Finite choices are scores (at most ~2e19) plus a bias, or logits plus a bias,
    far from these."""
    largest_finite_bits = 0x7F7FFFFF
    return torch.arange(largest_finite_bits, largest_finite_bits - n, -1, dtype=torch.int32,
                        device=device).view(torch.float32)


def _below_every_choice(n: int, device: torch.device) -> torch.Tensor:
    """The n most negative finite fp32 values, ascending toward the lower id: where -Inf experts stand."""
    return -_above_every_choice(n, device).flip(0)
