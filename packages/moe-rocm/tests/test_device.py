"""The real AITER kernel on a ROCm GPU, against moe-core's fp32 reference and against its CPU twin.

Skipped without a ROCm GPU; with MOE_TEST_REQUIRE_DEVICE=rocm that skip becomes an error, so a device
run cannot pass by testing nothing. AITER missing on such a machine fails the tests (the oracle
refuses the forced backend with "needs the Python package 'aiter'").
"""

from __future__ import annotations

import pytest
import torch

from moe_core import (
    Activation,
    BackendUnavailableError,
    ExpertWeights,
    FusedMoE,
    MoEConfig,
    ParallelConfig,
    Routing,
    detect_device,
    fp8_w8a8,
    reference_moe,
    route_torch,
    unquantized,
)
from moe_rocm.aiter_api import GFX950, arch_of
from moe_rocm.experts import AiterExperts, fused_moe_arguments
from moe_rocm.twin import fused_moe_twin

pytestmark = pytest.mark.device("rocm")

TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 5e-3}


def _config(dtype=torch.bfloat16, activation=None, routing=None, top_k=2, parallel=None) -> MoEConfig:
    return MoEConfig(16, top_k, 512, 256, activation=activation or Activation.silu(),
                     routing=routing or Routing.softmax_topk(True), dtype=dtype,
                     parallel=parallel or ParallelConfig(), max_num_tokens=512)


CASES = {
    "bf16-silu": (_config(), unquantized()),
    "fp16-gelu": (_config(torch.float16, Activation.gelu()), unquantized()),
    "bf16-expert-parallel": (_config(parallel=ParallelConfig(ep_size=4, ep_rank=2)), unquantized()),
    "bf16-llama4": (_config(routing=Routing.llama4(), top_k=1), unquantized()),
    "fp8-channel": (_config(), fp8_w8a8("channel")),
    "fp8-block": (_config(), fp8_w8a8("block")),
}


def _layer(cfg: MoEConfig, quant) -> FusedMoE | None:
    """The layer on AITER; None where the capability refuses fp8 (gfx942), after checking it is refused."""
    device = detect_device("cuda")
    if quant.weight.quantized and arch_of(device.capability) is not GFX950:
        with pytest.raises(BackendUnavailableError, match=r"fp8 on gfx942"):
            FusedMoE(cfg, quant, device="cuda", prefer="aiter")
        return None
    layer = FusedMoE(cfg, quant, device="cuda", prefer="aiter", ep_group="partial")
    assert layer.plan.experts_cls is AiterExperts
    return layer


def _inputs(cfg: MoEConfig, m: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, cfg.hidden_size, generator=gen).to(cfg.dtype).cuda()
    logits = torch.randn(m, cfg.num_experts, generator=gen).cuda()
    return x, logits


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_reference(name):
    cfg, quant = CASES[name]
    layer = _layer(cfg, quant)
    if layer is None:
        return
    weights = ExpertWeights.random(cfg, quant, seed=3)
    layer.load_weights(weights)
    emap = cfg.expert_map("cuda")
    tol = TOLERANCE[cfg.dtype] * (2 if quant.activation is not None else 1)
    for m, seed in ((1, 1), (37, 2), (300, 3)):
        x, logits = _inputs(cfg, m, seed)
        out = layer(x, logits)
        w, ids = route_torch(logits, cfg.routing, cfg.top_k)
        ref = reference_moe(x, weights, cfg, w, ids, quant, emap)
        assert out.shape == x.shape and out.dtype == x.dtype and torch.isfinite(out).all()
        err = float((out.float() - ref).norm() / ref.norm())
        assert err < tol, f"{name} M={m}: relative L2 error {err:.2e} >= {tol}"


@pytest.mark.parametrize("name", ["bf16-silu", "bf16-expert-parallel", "fp8-block"])
def test_kernel_matches_its_cpu_twin(name):
    """The twin's reading of AITER's semantics (layouts, scales, activation quantization, mask) holds on the GPU."""
    cfg, quant = CASES[name]
    layer = _layer(cfg, quant)
    if layer is None:
        return
    layer.load_weights(ExpertWeights.random(cfg, quant, seed=4))
    experts = layer.experts
    x, logits = _inputs(cfg, 64, 5)
    w, ids = route_torch(logits, cfg.routing, cfg.top_k)
    out = experts.apply(x, w, ids)
    args = fused_moe_arguments(experts.weights, cfg, quant, experts.expert_mask)
    args = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    twin = fused_moe_twin(x.cpu(), topk_weight=w.cpu(), topk_ids=ids.cpu(), **args)
    err = float((out.cpu().float() - twin.float()).norm() / twin.float().norm())
    assert err < TOLERANCE[cfg.dtype], f"{name}: kernel vs twin relative L2 error {err:.2e}"
