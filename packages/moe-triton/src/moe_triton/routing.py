"""Fused router: router logits [M, E] -> (topk_weights fp32 [M, k], topk_ids int32 [M, k]) in one launch.

Same signature and semantics as `moe_core.routing.route_torch` (its twin, which the tests compare
against): softmax or sigmoid scores, optional correction bias for selection only, DeepSeek-V3
groups scored by their best two experts, top-k, optional renormalization and routed scaling.
Llama4's top-1 sigmoid is the sigmoid case with k = 1 (its weight is applied to the input by the
experts, not here). Ties between equal scores go to the lower expert id. Infinite logits follow
`route_torch`'s rules (+Inf chooses its expert, a row of -Inf chooses none, with weight 0), with
the same ids. The launch can also clear a buffer for the kernels behind it (`zero`).
"""

from __future__ import annotations

import torch

from moe_core.config import Routing, Scoring
from moe_core.routing import check_router_inputs, route_torch
from moe_triton.routing_details._kernel import launch_route

__all__ = ["route", "route_torch"]


def route(router_logits: torch.Tensor, routing: Routing, top_k: int,
          correction_bias: torch.Tensor | None = None, *, zero: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """zero: a contiguous int32 buffer the same launch fills with zeros, in programs of its own (the
    quantized experts' split-GEMM1 sums: one launch fewer per layer)."""
    check_router_inputs(router_logits, routing, top_k, correction_bias)
    M = router_logits.shape[0]
    weights = torch.empty(M, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(M, top_k, dtype=torch.int32, device=router_logits.device)
    if M == 0:
        if zero is not None:
            zero.zero_()
        return weights, ids
    bias = correction_bias.float().contiguous() if correction_bias is not None else None
    launch_route(router_logits.contiguous(), bias, weights, ids, top_k=top_k,
                 softmax=routing.scoring is Scoring.SOFTMAX, groups=routing.num_expert_groups,
                 topk_groups=routing.topk_groups,
                 renormalize=routing.renormalize, renormalize_eps=routing.renormalize_eps,
                 scaling=routing.routed_scaling_factor, zero=zero)
    return weights, ids
