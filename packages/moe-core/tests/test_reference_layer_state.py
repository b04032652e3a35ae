"""The reference experts own their weights and refuse ids outside the layer; scheme refusals use one
phrasing (issue 58)."""

from __future__ import annotations

import pytest
import torch

from moe_core import ExpertWeights, FusedMoE, MoEConfig, fp8_w8a8, int4_w4a16, mxfp4_w4a16
from moe_core.experts import SchemeSupport
from moe_core.quant import Granularity, QuantDType

CFG = MoEConfig(8, 2, 64, 32, dtype=torch.float32, has_bias=True)


@pytest.mark.parametrize("quant", [None, int4_w4a16(32, zero_point=True)], ids=["fp32", "int4"])
def test_writes_to_the_callers_tensors_do_not_reach_the_reference_layer(quant):
    """Before: the reference kept the caller's ExpertWeights as they were, past the load-time NaN check."""
    layer = FusedMoE(CFG, quant, "cpu", prefer="reference")
    weights = ExpertWeights.random(CFG, layer.quant, seed=int(torch.randint(0, 2**31, ())))
    layer.load_weights(weights)
    x, logits = torch.randn(5, 64), torch.randn(5, 8)
    before = layer(x, logits)
    for t in weights.tensors().values():
        t.fill_(float("nan")) if t.dtype.is_floating_point else t.fill_(1)
    assert torch.equal(layer(x, logits), before)


@pytest.mark.parametrize("bad", [8, 9, -1, -8])
def test_reference_refuses_expert_ids_outside_the_layer(bad):
    """Before: the reference dropped them silently (the token's output lost that expert's share)."""
    layer = FusedMoE(CFG, None, "cpu", prefer="reference")
    layer.load_weights(ExpertWeights.random(CFG, layer.quant, seed=1))
    ids = torch.randint(0, 8, (4, 2))
    ids[2, 0] = bad
    with pytest.raises(ValueError, match=rf"topk_ids hold expert ids outside \[0, 8\) \(the layer's experts\): "
                                         rf"\[{bad}\]"):
        layer.experts.apply(torch.randn(4, 64), torch.rand(4, 2), ids)


def test_a_scheme_refusal_says_what_the_class_supports():
    """Before: "weights fp8e4m3 (this scheme: fp4e2m1)", where "this scheme" was the class's support."""
    mxfp4_only = SchemeSupport(QuantDType.FP4_E2M1, frozenset({Granularity.GROUP}))
    assert mxfp4_only.check(fp8_w8a8("block")).reason == "weights fp8e4m3 (supports: fp4e2m1)"
    fp8_weight_only = SchemeSupport(QuantDType.FP8_E4M3, frozenset({Granularity.BLOCK}))
    assert fp8_weight_only.check(fp8_w8a8("block")).reason == "activations fp8e4m3 (supports: 16-bit)"
    assert mxfp4_only.check(mxfp4_w4a16())
