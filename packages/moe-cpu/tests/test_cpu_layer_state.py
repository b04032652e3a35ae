"""A loaded CPU layer owns its state (issue 58): it keeps no references to the caller's tensors, it
refuses routed ids outside its experts, and it survives copy.deepcopy and torch.save/torch.load
(oneDNN's opaque prepacked tensors included), giving bit-identical outputs afterwards."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from moe_core import ExpertWeights, FusedMoE, MoEConfig, fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16
from moe_core.experts import Experts
from moe_core.quant import MoEQuantConfig
from moe_cpu.experts import (
    CpuDequantizedExperts,
    CpuFp8EmulatedExperts,
    CpuInt4Experts,
    CpuInt8Experts,
    CpuOneDnnExperts,
    CpuUnquantizedExperts,
)

# Every CPU class, with a layer it serves: (dtype, scheme or None for unquantized, the class).
LAYERS = [
    pytest.param(torch.bfloat16, None, CpuOneDnnExperts, id="onednn-bf16"),
    pytest.param(torch.float32, None, CpuOneDnnExperts, id="onednn-fp32"),
    pytest.param(torch.float16, None, CpuUnquantizedExperts, id="dense-fp16"),
    pytest.param(torch.bfloat16, int4_w4a16(32, zero_point=True), CpuInt4Experts, id="int4"),
    pytest.param(torch.float32, int8_w8a16(-1), CpuInt8Experts, id="int8-fp32"),
    pytest.param(torch.bfloat16, fp8_w8a8("block", block=(32, 32)), CpuFp8EmulatedExperts, id="fp8"),
    pytest.param(torch.bfloat16, mxfp4_w4a16(), CpuDequantizedExperts, id="mxfp4"),
]


def _layer(dtype: torch.dtype, quant: MoEQuantConfig | None, cls: type[Experts]) -> tuple[FusedMoE, ExpertWeights]:
    config = MoEConfig(8, 2, 64, 64, dtype=dtype, has_bias=True)
    layer = FusedMoE(config, quant, "cpu", prefer="cpu")
    assert type(layer.experts) is cls, layer.plan.explain()
    weights = ExpertWeights.random(config, layer.quant, seed=int(torch.randint(0, 2**31, ())))
    layer.load_weights(weights)
    return layer, weights


def _inputs(layer: FusedMoE) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(6, 64).to(layer.config.dtype), torch.randn(6, 8)


@pytest.mark.parametrize(("dtype", "quant", "cls"), LAYERS)
def test_writes_to_the_callers_tensors_do_not_reach_the_layer(dtype, quant, cls):
    """Before: the fp16 class (and every class's biases, int8's fp32 scales) kept the caller's tensors."""
    layer, weights = _layer(dtype, quant, cls)
    x, logits = _inputs(layer)
    before = layer(x, logits)
    for t in weights.tensors().values():
        t.zero_() if t.dtype.is_floating_point else t.fill_(3)
    assert torch.equal(layer(x, logits), before)


@pytest.mark.parametrize(("dtype", "quant", "cls"), LAYERS)
@pytest.mark.parametrize("bad", [8, -1, 2**40])
def test_expert_ids_outside_the_layer_are_refused(dtype, quant, cls, bad):
    """Before: KeyError or a bincount error from inside the dispatch."""
    layer, _ = _layer(dtype, quant, cls)
    x, _ = _inputs(layer)
    ids = torch.randint(0, 8, (6, 2))
    ids[3, 1] = bad
    with pytest.raises(ValueError, match=rf"topk_ids hold expert ids outside \[0, 8\) \(the layer's experts\): "
                                         rf"\[{bad}\]"):
        layer.experts.apply(x, torch.rand(6, 2), ids)


@pytest.mark.parametrize(("dtype", "quant", "cls"), LAYERS)
def test_deepcopy_and_torch_save_keep_the_layer(dtype, quant, cls):
    """Before: NotImplementedError: Cannot access storage of OpaqueTensorImpl (the oneDNN class)."""
    layer, _ = _layer(dtype, quant, cls)
    x, logits = _inputs(layer)
    expected = layer(x, logits)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    for restored in (copy.deepcopy(layer), torch.load(buffer, weights_only=False)):
        assert type(restored.experts) is cls
        assert torch.equal(restored(x, logits), expected)
    assert torch.equal(layer(x, logits), expected)  # the original is untouched


@pytest.mark.parametrize(("dtype", "quant", "cls"), LAYERS)
def test_weights_loaded_again_are_the_ones_served(dtype, quant, cls):
    """The classes split their packed weights into per-expert views once, not on every call: a
    layer given new weights serves those, as a layer built with them does."""
    layer, _ = _layer(dtype, quant, cls)
    x, logits = _inputs(layer)
    before = layer(x, logits)
    fresh = ExpertWeights.random(layer.config, layer.quant, seed=12345)
    built = FusedMoE(layer.config, quant, "cpu", prefer="cpu")
    built.load_weights(fresh)
    layer.load_weights(fresh)
    after = layer(x, logits)
    assert torch.equal(after, built(x, logits)) and not torch.equal(after, before)


def test_a_fused_transformers_model_deep_copies_and_saves():
    transformers = pytest.importorskip("transformers")
    from moe_core.integrations.transformers import fuse

    config = transformers.MixtralConfig(hidden_size=64, vocab_size=128, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16, intermediate_size=96,
                                        num_local_experts=4, num_experts_per_tok=2, torch_dtype=torch.bfloat16)
    model = transformers.MixtralForCausalLM(config).to(torch.bfloat16).eval()
    fuse(model)
    ids = torch.randint(0, 128, (1, 7))
    with torch.no_grad():
        expected = model(ids).logits
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        for restored in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
            assert torch.equal(restored(ids).logits, expected)
