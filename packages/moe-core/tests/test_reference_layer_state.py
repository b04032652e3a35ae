"""The reference experts own their weights and refuse ids outside the layer; scheme refusals use one
phrasing (issue 58)."""

from __future__ import annotations

import dataclasses
import importlib.util

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


@pytest.mark.parametrize(("dtype", "byte", "limit"), [(torch.bfloat16, 254, 252), (torch.bfloat16, 253, 252),
                                                      (torch.float32, 254, 252), (torch.float16, 141, 140)])
@pytest.mark.parametrize("backend", ["reference", pytest.param("cpu", marks=pytest.mark.skipif(
    importlib.util.find_spec("moe_cpu") is None, reason="moe-cpu is not installed"))])
def test_mxfp4_scales_that_overflow_the_layer_dtype_are_refused(dtype, byte, limit, backend):
    """Before: e8m0 byte 254 (2**127) loaded and every output was NaN; only 0xFF was refused."""
    cfg = MoEConfig(8, 2, 64, 32, dtype=dtype)
    weights = ExpertWeights.random(cfg, mxfp4_w4a16(), seed=int(torch.randint(0, 2**31, ())))
    expert = int(torch.randint(0, 8, ()))
    scale = weights.w2_scale.clone()
    scale[expert, 3, 0] = byte
    layer = FusedMoE(cfg, mxfp4_w4a16(), "cpu", prefer=backend)
    with pytest.raises(ValueError, match=rf"ExpertWeights.w2_scale: experts {expert} have scales \(expert {expert}: "
                                         rf"up to byte {byte}\) .* Accepted for a {str(dtype)[6:]} layer: e8m0 bytes <= {limit}"):
        layer.load_weights(dataclasses.replace(weights, w2_scale=scale))
    scale[expert, 3, 0] = limit  # the largest byte that fits loads, and its outputs are finite
    layer.load_weights(dataclasses.replace(weights, w2_scale=scale))
    assert torch.isfinite(layer(torch.randn(4, 64).to(dtype) * 1e-30, torch.randn(4, 8))).all()


def test_int4_scales_that_overflow_an_fp16_layer_are_refused():
    cfg = MoEConfig(8, 2, 64, 32, dtype=torch.float16)
    quant = int4_w4a16(32, scale_dtype="fp32")
    weights = ExpertWeights.random(cfg, quant, seed=1)
    scale = weights.w13_scale.clone()
    scale[2, 0, 0] = 1e5
    with pytest.raises(ValueError, match=r"w13_scale: experts 2 have scales \(expert 2: up to 1e\+05\) .* largest "
                                         r"float16 value 6.55e\+04"):
        FusedMoE(cfg, quant, "cpu", prefer="reference").load_weights(dataclasses.replace(weights, w13_scale=scale))


@pytest.mark.parametrize(("call", "fragment"), [
    (lambda: fp8_w8a8("block", block=128), r"fp8_w8a8: block=128 is invalid: expected \(rows, cols\)"),
    (lambda: fp8_w8a8("block", block=(64,)), r"block=\(64,\) is invalid"),
    (lambda: fp8_w8a8("tensor", block=(64, 64)), r"block=\(64, 64\) is read with granularity='block' only"),
    (lambda: fp8_w8a8("block", activation_scales="tensor"), "activation_scales='tensor' is not read with "
     "granularity='block'"),
], ids=["block-int", "block-one", "block-with-tensor", "block-tensor-activations"])
def test_fp8_factory_arguments_are_checked(call, fragment):
    """Before: TypeError: 'int' object is not iterable; block= and activation_scales= silently ignored."""
    with pytest.raises(ValueError, match=fragment):
        call()
    assert fp8_w8a8("block", block=[64, 32]).weight.scale.block_shape == (64, 32)


@pytest.mark.parametrize(("w13", "w2", "fragment"), [
    (torch.randn(64, 32), torch.randn(32, 32), r"w13 must be a float tensor \[experts, out, in\].*got "
     r"torch.float32 \[64, 32\]; one expert's matrix needs a leading expert dimension"),
    (torch.randn(2, 64, 32), [[1.0]], "w2 must be a float tensor .* got list"),
    (torch.randint(0, 9, (2, 64, 32)), torch.randn(2, 32, 32), r"w13 must be a float tensor .* got torch.int64"),
    (torch.randn(2, 64, 32), torch.randn(3, 32, 32), r"w13 \[2, 64, 32\] and w2 \[3, 32, 32\] disagree"),
], ids=["2d", "list", "int", "expert-count"])
def test_from_float_refuses_tensors_of_the_wrong_rank(w13, w2, fragment):
    """Before: "not enough values to unpack (expected 3, got 2)" from inside quantization."""
    with pytest.raises(ValueError, match=f"from_float: {fragment}"):
        ExpertWeights.from_float(w13, w2, int4_w4a16(32))
