"""Fused router: router logits [M, E] -> (topk_weights fp32 [M, k], topk_ids int32 [M, k]) in one launch.

Same signature and semantics as `moe_core.routing.route_torch` (its twin, which the tests compare
against): softmax or sigmoid scores, optional correction bias for selection only, DeepSeek-V3
groups scored by their best two experts, top-k, optional renormalization and routed scaling.
Llama4's top-1 sigmoid is the sigmoid case with k = 1 (its weight is applied to the input by the
experts, not here). A softmax over ungrouped experts without a bias chooses by logit (`Routing`).
Ties between equal choices go to the lower expert id. Infinite logits follow
`route_torch`'s rules (+Inf chooses its expert, a row of -Inf chooses none, with weight 0), with
the same ids. The launch can also quantize the layer input to fp8 (`quantize`) and clear a buffer
(`zero`) for the kernels behind it.
"""

from __future__ import annotations

import torch

from moe_core.config import Routing, Scoring
from moe_core.routing import check_router_inputs, route_torch
from moe_triton.routing_details._kernel import launch_route

__all__ = ["route", "route_torch"]


def route(router_logits: torch.Tensor, routing: Routing, top_k: int,
          correction_bias: torch.Tensor | None = None, *, zero: torch.Tensor | None = None,
          quantize: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """zero: a contiguous int32 buffer the same launch fills with zeros, in programs of its own (the
    quantized experts' split-GEMM1 sums: one launch fewer per layer). quantize: (x [M, K] 16-bit,
    codes float8_e4m3fn [M, K], scales fp32 [M, K / 128]), K a multiple of 128: programs of the same
    launch write x's e4m3 codes and one scale per 128-wide group of a row, as
    `act_quant(x, None, QMode.GROUP128, ...)` (fp8 block-scaled GEMM1's input: one launch fewer)."""
    check_router_inputs(router_logits, routing, top_k, correction_bias)
    M = router_logits.shape[0]
    if quantize is not None:
        _check_quantize(quantize, M, router_logits.device)
    weights = torch.empty(M, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(M, top_k, dtype=torch.int32, device=router_logits.device)
    if M == 0:
        if zero is not None:
            zero.zero_()
        return weights, ids
    if quantize is not None and quantize[0].shape[1] == 0:
        quantize = None
    bias = correction_bias.float().contiguous() if correction_bias is not None else None
    launch_route(router_logits.contiguous(), bias, weights, ids, top_k=top_k,
                 softmax=routing.scoring is Scoring.SOFTMAX, groups=routing.num_expert_groups,
                 topk_groups=routing.topk_groups,
                 renormalize=routing.renormalize, renormalize_eps=routing.renormalize_eps,
                 scaling=routing.routed_scaling_factor, zero=zero, quantize=quantize)
    return weights, ids


def _check_quantize(quantize: tuple[torch.Tensor, torch.Tensor, torch.Tensor], rows: int,
                    device: torch.device) -> None:
    x, codes, scales = quantize
    k = x.shape[1] if x.dim() == 2 else -1
    wants = []
    if x.dim() != 2 or x.shape[0] != rows or x.dtype not in (torch.bfloat16, torch.float16) or k % 128:
        wants.append(f"x bf16 or fp16 [{rows}, K] with K a multiple of 128, got {x.dtype} {list(x.shape)}")
    if codes.dtype != torch.float8_e4m3fn or tuple(codes.shape) != (rows, k):
        wants.append(f"codes float8_e4m3fn [{rows}, {k}], got {codes.dtype} {list(codes.shape)}")
    if scales.dtype != torch.float32 or tuple(scales.shape) != (rows, k // 128):
        wants.append(f"scales float32 [{rows}, {k // 128}], got {scales.dtype} {list(scales.shape)}")
    if any(t.device != device or (t.dim() == 2 and t.stride(-1) != 1) for t in quantize):
        wants.append(f"all three on {device} with unit column strides")
    if wants:
        raise ValueError("quantize needs " + "; ".join(wants))
