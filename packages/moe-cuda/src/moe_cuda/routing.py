"""The router of moe-cuda's experts classes: softmax top-k in one Triton launch on CUDA.

moe-core's `route_torch` (the reference every router must choose as) takes about thirty torch
launches at one token, which cost more than a decode step's GEMMs (under CUDA graphs ~2 us each).
The common routing (softmax scores, no expert groups, no correction bias; renormalization and a
scaling factor optional: Mixtral, Qwen3-MoE, gpt-oss) runs here as one kernel per token row with
route_torch's semantics, infinite logits included; every other routing, and tensors off CUDA, go to
route_torch itself.

Choice: the top-k logits (softmax is monotone), ties to the lower expert id, +Inf above every
finite logit and -Inf below. Weights: softmax scores of the chosen experts; in a row holding +Inf
the +Inf experts share the probability equally and the rest score 0; a row of -Inf only chooses
experts 0..k-1 with weight 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_core.config import Routing, Scoring
from moe_core.routing import check_router_inputs, route_torch

__all__ = ["route", "softmax_topk", "takes_softmax_topk"]


@triton.jit
def _softmax_topk(logits_ptr, stride_m, weights_ptr, ids_ptr, E, eps, scale, TOP_K: tl.constexpr,
                  K_BLOCK: tl.constexpr, E_BLOCK: tl.constexpr, RENORMALIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, E_BLOCK)
    valid = experts < E
    x = tl.load(logits_ptr + row * stride_m + experts, mask=valid, other=float("-inf")).to(tl.float32)
    unbounded = (x == float("inf")) & valid
    n_unbounded = tl.sum(unbounded.to(tl.float32), 0)
    n_none = tl.sum(((x == float("-inf")) & valid).to(tl.float32), 0)
    shifted = tl.exp(x - tl.max(x, 0))
    shifted = tl.where(valid, shifted, 0.0)
    scores = tl.where(n_unbounded > 0, unbounded.to(tl.float32) / tl.maximum(n_unbounded, 1.0),
                      shifted / tl.sum(shifted, 0))
    # fp32 bits -> an int32 of the same order (negative floats: magnitude bits flipped); lanes past E
    # and experts already chosen sit below -Inf's key, so argmax's lower-index tie-break orders ties.
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(valid, bits ^ ((bits >> 31) & 0x7FFFFFFF), -2147483648)
    slots = tl.arange(0, K_BLOCK)
    chosen_ids = tl.zeros([K_BLOCK], dtype=tl.int32)
    chosen_weights = tl.zeros([K_BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(key, 0, tie_break_left=True)
        weight = tl.sum(tl.where(experts == best, scores, 0.0), 0)
        chosen_ids = tl.where(slots == j, best.to(tl.int32), chosen_ids)
        chosen_weights = tl.where(slots == j, weight, chosen_weights)
        key = tl.where(experts == best, -2147483648, key)
    if RENORMALIZE:
        chosen_weights = chosen_weights / (tl.sum(chosen_weights, 0) + eps)
    chosen_weights = chosen_weights * scale
    chosen_weights = tl.where(n_none == E, 0.0, chosen_weights)  # no expert: ids 0..k-1 by the tie-break
    out = row * TOP_K + slots
    tl.store(weights_ptr + out, chosen_weights, mask=slots < TOP_K)
    tl.store(ids_ptr + out, chosen_ids, mask=slots < TOP_K)


def takes_softmax_topk(routing: Routing, correction_bias: torch.Tensor | None) -> bool:
    """Whether `route` runs `routing` as its one kernel (on CUDA) rather than through route_torch."""
    return (routing.scoring is Scoring.SOFTMAX and not routing.grouped and correction_bias is None
            and not routing.has_correction_bias)


def softmax_topk(router_logits: torch.Tensor, routing: Routing, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The one-kernel softmax top-k (any device Triton runs on: CUDA, or the CPU under TRITON_INTERPRET)."""
    M, E = router_logits.shape
    weights = torch.empty(M, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(M, top_k, dtype=torch.int32, device=router_logits.device)
    if M:
        logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
        _softmax_topk[(M,)](logits, logits.stride(0), weights, ids, E, routing.renormalize_eps,
                            routing.routed_scaling_factor, TOP_K=top_k, K_BLOCK=triton.next_power_of_2(top_k),
                            E_BLOCK=triton.next_power_of_2(E), RENORMALIZE=routing.renormalize)
    return weights, ids


def route(router_logits: torch.Tensor, routing: Routing, top_k: int,
          correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """route_torch's (weights fp32 [M, k], ids int32 [M, k]); one launch for softmax top-k on CUDA."""
    check_router_inputs(router_logits, routing, top_k, correction_bias)
    if router_logits.is_cuda and takes_softmax_topk(routing, correction_bias):
        return softmax_topk(router_logits, routing, top_k)
    return route_torch(router_logits, routing, top_k, correction_bias)
