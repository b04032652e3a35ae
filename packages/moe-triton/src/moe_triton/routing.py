"""Fused router: router logits [M, E] -> (topk_weights fp32 [M, k], topk_ids int32 [M, k]) in one launch.

Same signature and semantics as `moe_core.routing.route_torch` (its twin, which the tests compare
against): softmax or sigmoid scores, optional correction bias for selection only, DeepSeek-V3
groups scored by their best two experts, top-k, optional renormalization and routed scaling.
Llama4's top-1 sigmoid is the sigmoid case with k = 1 (its weight is applied to the input by the
experts, not here). Ties between equal scores go to the lower expert id. Infinite logits follow
`route_torch`'s rules (+Inf chooses its expert, a row of -Inf chooses none, with weight 0), with
the same ids. The launch can also ask L2 for the chosen experts' weights (`prefetch`), quantize
the layer input to fp8 (`quantize`) and clear a buffer (`zero`) for the kernels behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from moe_core.config import Routing, Scoring
from moe_core.routing import check_router_inputs, route_torch
from moe_triton.routing_details._kernel import launch_route

__all__ = ["ExpertPrefetch", "route", "route_torch"]


@dataclass(frozen=True, eq=False)
class ExpertPrefetch:
    """Weights the routing launch asks L2 for, of the experts it chooses (`route`'s prefetch): for
    each (token, choice) pair, `programs_per_pair` programs of one warp route that token again and
    bulk-prefetch the chosen expert's slab of every tensor, so that the GEMMs behind read those
    weights from L2 rather than wait on DRAM. A hint: the results do not change. NVIDIA sm_90 and
    later (`cp.async.bulk.prefetch.L2`)."""

    tensors: tuple[torch.Tensor, ...]  # each [E, ...] on one GPU, expert e's slab tensor[e] contiguous
    programs_per_pair: int = 1  # > 0; each program's 32 lanes ask for 64 KB each per step
    # int64 [tensors, 3] on their device, the routing kernel's prefetch table: address, bytes between
    # experts, bytes per expert. Built here, with a host-to-device copy (not while a CUDA graph is
    # being captured); `tensors` keeps the addresses valid.
    table: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        if not self.tensors or self.programs_per_pair < 1:
            raise ValueError(f"ExpertPrefetch needs one tensor or more and programs_per_pair >= 1, got "
                             f"{len(self.tensors)} tensors, programs_per_pair={self.programs_per_pair}")
        devices = {t.device for t in self.tensors}
        experts = {t.shape[0] if t.dim() else 0 for t in self.tensors}
        if len(devices) != 1 or len(experts) != 1 or not all(t.dim() > 1 and t[0].is_contiguous()
                                                             for t in self.tensors):
            raise ValueError("ExpertPrefetch's tensors must share one device and their expert count (dim 0), each "
                             "expert's slab contiguous; got " + ", ".join(f"{list(t.shape)} stride {t.stride()} on "
                                                                          f"{t.device}" for t in self.tensors))
        rows = [[t.data_ptr(), t.stride(0) * t.element_size(), t[0].nbytes] for t in self.tensors]
        object.__setattr__(self, "table", torch.tensor(rows, dtype=torch.int64).to(self.tensors[0].device))

    @property
    def num_experts(self) -> int:
        return self.tensors[0].shape[0]


def route(router_logits: torch.Tensor, routing: Routing, top_k: int,
          correction_bias: torch.Tensor | None = None, *, zero: torch.Tensor | None = None,
          quantize: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
          prefetch: ExpertPrefetch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """zero: a contiguous int32 buffer the same launch fills with zeros, in programs of its own (the
    quantized experts' split-GEMM1 sums: one launch fewer per layer). quantize: (x [M, K] 16-bit,
    codes float8_e4m3fn [M, K], scales fp32 [M, K / 128]), K a multiple of 128: programs of the same
    launch write x's e4m3 codes and one scale per 128-wide group of a row, as
    `act_quant(x, None, QMode.GROUP128, ...)` (fp8 block-scaled GEMM1's input: one launch fewer).
    prefetch: the chosen experts' weights to ask L2 for (`ExpertPrefetch`), on the logits' GPU,
    with as many experts as the logits' columns."""
    check_router_inputs(router_logits, routing, top_k, correction_bias)
    M = router_logits.shape[0]
    if quantize is not None:
        _check_quantize(quantize, M, router_logits.device)
    if prefetch is not None and (prefetch.num_experts != router_logits.shape[1]
                                 or prefetch.tensors[0].device != router_logits.device):
        raise ValueError(f"prefetch holds {prefetch.num_experts} experts on {prefetch.tensors[0].device}; the logits "
                         f"route among {router_logits.shape[1]} on {router_logits.device}")
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
                 scaling=routing.routed_scaling_factor, zero=zero, quantize=quantize,
                 prefetch=(prefetch.table, prefetch.programs_per_pair) if prefetch is not None else None)
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
