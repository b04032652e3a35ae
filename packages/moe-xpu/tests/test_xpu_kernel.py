"""The real kernel on an Intel GPU against moe-core's fp32 reference and the torch twin.

Skipped without an XPU; with MOE_TEST_REQUIRE_DEVICE=xpu a missing XPU fails instead, and so does a
missing or unloadable vllm-xpu-kernels (nothing here skips for it).
"""

from __future__ import annotations

import pytest
import torch

from moe_core.backends import detect_device
from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.layer import FusedMoE
from moe_core.quant import (
    FP8_BLOCK128_WEIGHT,
    FP8_TENSOR_WEIGHT,
    MoEQuantConfig,
    fp8_w8a8,
    int4_w4a16,
    mxfp4_w4a16,
    unquantized,
)
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights import ExpertWeights
from moe_xpu.experts import XpuExperts, XpuFp8Experts, XpuInt4Experts, XpuMxfp4Experts
from moe_xpu.twin import twin_moe

pytestmark = pytest.mark.device("xpu")

_TOL = {torch.bfloat16: 1e-2, torch.float16: 5e-3}


def _config(activation=None, dtype=torch.bfloat16, *, hidden=512, inter=256, top_k=4, bias=False, routing=None,
            parallel=None) -> MoEConfig:
    return MoEConfig(16, top_k, hidden, inter, activation=activation or Activation.silu(), dtype=dtype,
                     has_bias=bias, routing=routing or Routing.softmax_topk(True),
                     parallel=parallel or ParallelConfig())


CASES = [
    ("bf16-silu", XpuExperts, _config(), unquantized()),
    ("fp16-gelu", XpuExperts, _config(Activation.gelu(), torch.float16), unquantized()),
    ("bf16-gelu_tanh-ep", XpuExperts, _config(Activation.gelu_tanh(), parallel=ParallelConfig(ep_size=2, ep_rank=1)),
     unquantized()),
    ("bf16-relu2", XpuExperts, _config(Activation.relu2()), unquantized()),
    ("bf16-swiglu_oai-bias", XpuExperts, _config(Activation.swiglu_oai(), bias=True), unquantized()),
    ("bf16-llama4", XpuExperts, _config(routing=Routing.llama4(), top_k=1), unquantized()),
    *[(f"int4-g{g}", XpuInt4Experts, _config(), int4_w4a16(g)) for g in (32, 64, 128, 256)],
    ("int4-g128-fp16-swiglu_oai-bias", XpuInt4Experts, _config(Activation.swiglu_oai(), torch.float16, bias=True),
     int4_w4a16(128, scale_dtype="fp16")),
    ("fp8-tensor-w8a16", XpuFp8Experts, _config(), MoEQuantConfig(FP8_TENSOR_WEIGHT)),
    ("fp8-block-w8a16", XpuFp8Experts, _config(bias=True), MoEQuantConfig(FP8_BLOCK128_WEIGHT)),
    ("fp8-block-w8a8", XpuFp8Experts, _config(), fp8_w8a8("block")),
    ("mxfp4-swiglu_oai-bias", XpuMxfp4Experts, _config(Activation.swiglu_oai(), bias=True), mxfp4_w4a16()),
    ("mxfp4-fp16-silu", XpuMxfp4Experts, _config(dtype=torch.float16), mxfp4_w4a16()),
]


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "kernel output has NaN/Inf"
    return float((out.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize(("name", "cls", "config", "quant"), CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_reference_and_twin(name: str, cls, config: MoEConfig, quant: MoEQuantConfig) -> None:
    device = detect_device("xpu")
    assert cls.supports(config, quant, device), cls.supports(config, quant, device).reason
    weights = ExpertWeights.random(config, quant, seed=3)
    layer = FusedMoE(config, quant, device=device, prefer="xpu")
    assert layer.plan.experts_cls is cls
    layer.load_weights(weights)
    tol = _TOL[config.dtype] * (2 if quant.activation is not None else 1)
    for m in (1, 7, 300):
        gen = torch.Generator().manual_seed(m)
        x = torch.randn(m, config.hidden_size, generator=gen).to(config.dtype)
        logits = torch.randn(m, config.num_experts, generator=gen)
        out = layer(x.to(device.torch_device), logits.to(device.torch_device)).cpu()
        topk_weights, topk_ids = route_torch(logits, config.routing, config.top_k)
        emap = config.expert_map("cpu")
        ref = reference_moe(x, weights, config, topk_weights, topk_ids, quant, emap)
        assert _rel_err(out, ref) < tol, f"M={m}: kernel vs reference"
        packed = cls.weight_processor(weights, config, torch.device("cpu"))
        twin = twin_moe(packed, config, quant, x, topk_weights, topk_ids, emap)
        assert _rel_err(out, twin) < tol, f"M={m}: kernel vs twin"


def test_loading_leaves_canonical_int4_weights_untouched() -> None:
    """XpuFusedMoe re-encodes int4 weights in place; canonical weights already on the device must not change."""
    device = detect_device("xpu")
    config, quant = _config(), int4_w4a16(128)
    weights = ExpertWeights.random(config, quant, seed=5).to(device.torch_device)
    before = weights.w13.clone()
    layer = FusedMoE(config, quant, device=device, prefer="xpu")
    layer.load_weights(weights)
    layer.load_weights(weights)
    assert torch.equal(weights.w13, before)
