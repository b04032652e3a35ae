"""Pad-free expert permutation and the steps around the grouped GEMMs, without a host sync: on CUDA
mostly moe-triton's kernels (sort, activation, top-k sum), elsewhere torch, their twins.

Routed (token, choice) pairs are sorted by local expert; each expert's rows are one contiguous
segment of the sorted rows, `offsets` holding each segment's end (int32, cumulative), which is what
`torch._grouped_mm` and the CUTLASS grouped GEMMs read. Choices of experts another rank owns (expert
parallelism) are sorted after every local segment, computed by no GEMM, and masked out of the sum.
"""

from __future__ import annotations

import torch

from moe_core.config import Activation, MoEConfig, Routing
from moe_core.routing import route_torch
from moe_triton.act_quant import QMode, act_quant, act_quant_torch
from moe_triton.expert_permutation import ExpertPermutation, permute_by_expert_torch
from moe_triton.expert_permutation import permute_by_expert as permute_on_gpu
from moe_triton.routing import route as route_one_launch
from moe_triton.topk_sum import gather_topk_sum, gather_topk_sum_torch

__all__ = ["ExpertPermutation", "activate", "combine", "permute_by_expert", "route", "row_pass"]


def route(router_logits: torch.Tensor, routing: Routing, top_k: int,
          correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The router of every moe-cuda class: moe-triton's one-launch router on CUDA; on the CPU, where these
    classes run only as the tests' twins of their vendor kernels, its torch twin `route_torch`."""
    if router_logits.is_cuda:
        return route_one_launch(router_logits, routing, top_k, correction_bias)
    return route_torch(router_logits, routing, top_k, correction_bias)


def permute_by_expert(topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_local_experts: int,
                      expert_map: torch.Tensor | None) -> ExpertPermutation:
    """Sort the M * top_k routed pairs by local expert (stable: token order within an expert), choices of
    experts another rank owns last: on CUDA moe-triton's two launches (`expert_permutation`), elsewhere
    their torch twin."""
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
                         "must both be [M, top_k]")
    ids = topk_ids
    if expert_map is not None:
        ids = expert_map.to(ids.device)[ids.long()]
        ids = torch.where(ids < 0, num_local_experts, ids)
    permute = permute_on_gpu if ids.is_cuda else permute_by_expert_torch
    return permute(ids.to(torch.int32), topk_weights, num_local_experts)


def row_pass(h: torch.Tensor, activation: Activation | None, qmode: QMode, out_dtype: torch.dtype
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """moe-triton's row pass over h's rows (the activation, then fp8 quantization as `qmode` says):
    its one-launch kernel `act_quant` on CUDA, its torch twin `act_quant_torch` elsewhere."""
    run = act_quant if h.is_cuda else act_quant_torch
    return run(h, activation, qmode, out_dtype, h.shape[0])


def activate(h: torch.Tensor, config: MoEConfig) -> torch.Tensor:
    """GEMM1 output [P, R] -> [P, N] in h's dtype; the nonlinearity in fp32, as the reference computes it."""
    return row_pass(h, config.activation, QMode.NONE, h.dtype)[0]


def combine(y: torch.Tensor, perm: ExpertPermutation, num_tokens: int, weighted: bool) -> torch.Tensor:
    """Sum the sorted rows y [P, K] back into tokens [M, K], times the router weights when `weighted`.

    Rows of experts owned elsewhere hold whatever the GEMM left there: they are masked, never multiplied.
    Each token's choices are summed in choice order in fp32, never by atomic adds, so the result is the
    same bits on every call: on CUDA by one gathering pass of moe-triton's `gather_topk_sum` (each
    choice's sorted row found through its slot); elsewhere in torch, its twin.
    """
    top_k = perm.pair.numel() // num_tokens if num_tokens else 1
    run = gather_topk_sum if y.is_cuda else gather_topk_sum_torch
    return run(y, perm.slot, top_k, y.dtype, perm.weight if weighted else None)
