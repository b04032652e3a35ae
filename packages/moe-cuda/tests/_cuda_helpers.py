"""Shared by moe-cuda's tests: tiny layers, their inputs and the error measure."""

from __future__ import annotations

import torch

from moe_core.backends import DeviceInfo, Platform, detect_device
from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.oracle import apply_layer
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights

CPU = DeviceInfo(Platform.CPU)


def layer(E=8, K=256, N=128, top_k=2, dtype=torch.bfloat16, activation=None, routing=None, bias=False,
          parallel=None) -> MoEConfig:
    return MoEConfig(E, top_k, K, N, activation=activation or Activation.silu(),
                     routing=routing or Routing.softmax_topk(True), dtype=dtype, has_bias=bias,
                     parallel=parallel or ParallelConfig(), max_num_tokens=4096)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "output has NaN/Inf"
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def run_against_reference(cls, config, quant, device=CPU, m=37, seed=3, weights=None):
    """(relative L2 error, output) of `cls` on `weights` (default: a random layer) against the fp32 reference."""
    weights = weights if weights is not None else ExpertWeights.random(config, quant, seed=seed)
    experts = cls(config, quant, device)
    experts.load_weights(weights)
    gen = torch.Generator().manual_seed(seed)
    dev = device.torch_device
    x = torch.randn(m, config.hidden_size, generator=gen).to(config.dtype).to(dev)
    logits = torch.randn(m, config.num_experts, generator=gen).to(dev)
    bias = (torch.randn(config.num_experts, generator=gen) * 0.2).to(dev) if config.routing.has_correction_bias \
        else None
    out = apply_layer(experts, x, logits, bias)
    w, ids = route_torch(logits, config.routing, config.top_k, bias)
    ref = reference_moe(x, weights, config, w, ids, quant, config.expert_map(dev))
    return rel_err(out, ref), out


def cuda_device() -> DeviceInfo:
    return detect_device("cuda")
