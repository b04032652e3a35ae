"""Every validation error of the layer and quantization descriptors names the field and what is accepted."""

from __future__ import annotations

import pytest
import torch

from moe_core import Activation, MoEConfig, ParallelConfig, Routing, RoutingMethod
from moe_core.quant import (
    FP8_BLOCK128_WEIGHT,
    Granularity,
    MoEQuantConfig,
    QuantDType,
    QuantFamily,
    QuantKey,
    ScaleSpec,
    ZeroPoint,
    fp8_w8a8,
    int4_w4a16,
    int8_w8a16,
    mxfp4_w4a16,
    parse_scheme,
    unquantized,
)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_experts=0), r"MoEConfig.num_experts=0 is invalid: expected a positive int"),
    (dict(top_k=9), r"MoEConfig.top_k=9 is invalid: expected <= num_experts=8"),
    (dict(hidden_size=1.5), r"MoEConfig.hidden_size=1.5 is invalid"),
    (dict(dtype=torch.int8), r"MoEConfig.dtype=torch.int8 is invalid: expected torch.bfloat16"),
    (dict(activation="silu"), r"MoEConfig.activation='silu' is invalid: expected an Activation"),
    (dict(routing=Routing.deepseek_v3(3, 2)), r"routing.num_expert_groups=3 is invalid: expected a divisor"),
    (dict(routing=Routing.deepseek_v3(4, 1), top_k=3), r"top_k=3 exceeds the experts in the kept groups"),
    (dict(routing=Routing.llama4()), r"top_k=2 is invalid: expected 1 when routing.weight_on_input"),
    (dict(parallel=ParallelConfig(tp_size=3)), r"intermediate_size=64 is invalid: expected divisible by"),
    (dict(parallel=ParallelConfig(ep_size=9, ep_rank=0)), r"parallel.ep_size=9 is invalid"),
])
def test_moe_config_errors(kwargs, match):
    base = dict(num_experts=8, top_k=2, hidden_size=32, intermediate_size=64)
    with pytest.raises(ValueError, match=match):
        MoEConfig(**{**base, **kwargs})


@pytest.mark.parametrize("make, match", [
    (lambda: Activation("swish"), r"Activation.kind='swish' is invalid: expected one of"),
    (lambda: Activation.swiglu_oai(alpha=0), r"Activation.alpha=0 is invalid"),
    (lambda: Activation("silu", limit=7.0), r"takes no alpha/limit"),
    (lambda: Routing("tanh"), r"Routing.scoring='tanh' is invalid"),
    (lambda: Routing(num_expert_groups=2, topk_groups=3), r"topk_groups=3 is invalid: expected <= num_expert_groups=2"),
    (lambda: Routing(routed_scaling_factor=0), r"routed_scaling_factor=0 is invalid"),
    (lambda: Routing(renormalize_eps=1e-20), r"renormalize_eps=1e-20 is invalid: expected 0 when renormalize=False"),
    (lambda: ParallelConfig(ep_size=2, ep_rank=2), r"ep_rank=2 is invalid: expected an int in \[0, ep_size=2\)"),
    (lambda: ParallelConfig(tp_size=2, ep_size=2), r"either tensor-sharded or expert-sharded"),
])
def test_descriptor_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_routing_methods_and_parallel_layout():
    assert Routing.softmax_topk(True).method is RoutingMethod.SOFTMAX_TOPK_RENORM
    assert Routing.softmax_topk(False).method is RoutingMethod.SOFTMAX_TOPK
    assert Routing.sigmoid_topk(True).method is RoutingMethod.SIGMOID_TOPK
    assert Routing.deepseek_v3().method is RoutingMethod.GROUPED_TOPK
    assert Routing.llama4().method is RoutingMethod.LLAMA4
    # 10 experts over 4 ranks: 3, 3, 2, 2 (the remainder goes to the first ranks).
    sizes = [len(ParallelConfig(ep_size=4, ep_rank=r).local_expert_range(10)) for r in range(4)]
    assert sizes == [3, 3, 2, 2]
    m = ParallelConfig(ep_size=4, ep_rank=1).expert_map(10)
    assert m.tolist() == [-1, -1, -1, 0, 1, 2, -1, -1, -1, -1]
    cfg = MoEConfig(10, 2, 32, 64, parallel=ParallelConfig(ep_size=4, ep_rank=3))
    assert cfg.num_local_experts == 2 and cfg.w13_rows == 128
    assert MoEConfig(10, 2, 32, 64, activation=Activation.relu2()).w13_rows == 64


@pytest.mark.parametrize("make, match", [
    (lambda: QuantKey(QuantDType.BF16, ScaleSpec(Granularity.TENSOR)), "unquantized bf16 takes no scale"),
    (lambda: QuantKey(QuantDType.INT4), "int4 needs a ScaleSpec"),
    (lambda: QuantKey(QuantDType.FP8_E4M3, ScaleSpec(Granularity.TENSOR), ZeroPoint.INTEGER), "zero points are only"),
    (lambda: QuantKey(QuantDType.INT4, ScaleSpec(Granularity.CHANNEL), act_order=True), "act_order needs"),
    (lambda: QuantKey(QuantDType.FP4_E2M1, ScaleSpec(Granularity.GROUP, group_size=16)), "OCP MXFP4 only"),
    (lambda: ScaleSpec(Granularity.GROUP), "GROUP scales need a positive group size"),
    (lambda: ScaleSpec(Granularity.BLOCK, block_shape=(128,)), r"block_shape=\(128,\) is invalid"),
    (lambda: ScaleSpec(Granularity.TENSOR, group_size=32), "only valid with GROUP"),
    (lambda: ScaleSpec(Granularity.TENSOR, dtype="fp64"), "ScaleSpec.dtype='fp64' is invalid"),
    (lambda: int4_w4a16(0), "group_size=0 is invalid"),
    (lambda: int4_w4a16(-1, act_order=True), "act_order needs grouped scales"),
    (lambda: fp8_w8a8("row"), "granularity='row' is invalid"),
    (lambda: fp8_w8a8(dynamic_activations=False), "static activation scales are not supported"),
    (lambda: MoEQuantConfig(int4_w4a16().weight, fp8_w8a8().activation), "only supported with fp8 weights"),
    (lambda: MoEQuantConfig(FP8_BLOCK128_WEIGHT, FP8_BLOCK128_WEIGHT), "expected None .* or a dynamic"),
    (lambda: parse_scheme("int4:abc"), "group size 'abc' is not an int"),
    (lambda: parse_scheme("int3"), "unknown quantization scheme 'int3'"),
])
def test_quant_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_quant_keys_are_exact():
    # Group 32 and group 128 are different keys: no bucket folds them together (vLLM#45136).
    assert int4_w4a16(32).weight != int4_w4a16(128).weight
    assert int4_w4a16(128).weight.group_size == 128 and int4_w4a16(128).weight.code_offset == 8
    assert int4_w4a16(128, zero_point=True).weight.code_offset == 0
    assert int8_w8a16().weight.code_offset == 128 and int8_w8a16().weight.scale.granularity is Granularity.CHANNEL
    assert fp8_w8a8("block").weight.scale.block_shape == (128, 128)
    assert fp8_w8a8("block").activation.scale.group_size == 128
    assert fp8_w8a8("channel").activation.scale.granularity is Granularity.TOKEN
    assert {q.family for q in (unquantized(), int4_w4a16(), fp8_w8a8(), mxfp4_w4a16())} == set(QuantFamily)
    assert parse_scheme("int4:64:zp") == int4_w4a16(64, zero_point=True)
    assert parse_scheme("int8:-1") == int8_w8a16(-1)
    assert int4_w4a16(64, zero_point=True, act_order=True).name == "int4_w4a16_g64_zp_actorder"
    assert mxfp4_w4a16().weight.scale.dtype == "e8m0"
    assert hash(int4_w4a16(64).weight) == hash(int4_w4a16(64).weight)
