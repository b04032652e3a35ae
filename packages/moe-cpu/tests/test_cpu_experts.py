"""moe-cpu experts against moe_core's fp32 reference, their refusals, and the oracle's choice."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moe_core
from moe_core import (
    Activation,
    ExpertWeights,
    FusedMoE,
    MoEConfig,
    ParallelConfig,
    Routing,
    fp8_w8a8,
    int4_w4a16,
    int8_w8a16,
    mxfp4_w4a16,
    reference_moe,
    route_torch,
    unquantized,
)
from moe_core.backends import detect_device
from moe_core.plugins import PluginState, registry
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType, QuantKey, ScaleSpec, ZeroPoint
from moe_cpu._plugin import backend_spec
from moe_cpu.experts import (
    CpuDequantizedExperts,
    CpuFp8EmulatedExperts,
    CpuInt4Experts,
    CpuInt8Experts,
    CpuOneDnnExperts,
    CpuUnquantizedExperts,
)

CPU = detect_device("cpu")
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 5e-3, torch.float32: 1e-4}
# int4/int8 kernels round their scales (and int4 its zeros) to the layer dtype, fp32 included
QUANTIZED_FP32_TOLERANCE = 2e-3


def _config(E=8, k=2, K=256, N=128, dtype=torch.bfloat16, activation=None, routing=None, bias=False,
            parallel=None) -> MoEConfig:
    return MoEConfig(E, k, K, N, activation=activation or Activation.silu(),
                     routing=routing or Routing.softmax_topk(True), dtype=dtype, has_bias=bias,
                     parallel=parallel or ParallelConfig())


def _relative_error(config: MoEConfig, quant: MoEQuantConfig, tokens: int, seed: int,
                    expected_cls: type, via_oracle: bool = True) -> float:
    """Relative L2 error of `expected_cls` against the fp32 reference. via_oracle: run it as the
    FusedMoE layer the oracle builds (and check that the oracle chose it); else call it directly."""
    weights = ExpertWeights.random(config, quant, seed=seed)
    bias = None
    gen = torch.Generator().manual_seed(seed + 1)
    if config.routing.has_correction_bias:
        bias = torch.randn(config.num_experts, generator=gen) * 0.2
    x = torch.randn(tokens, config.hidden_size, generator=gen).to(config.dtype)
    logits = torch.randn(tokens, config.num_experts, generator=gen)
    topk_weights, topk_ids = route_torch(logits, config.routing, config.top_k, bias)
    if via_oracle:
        layer = FusedMoE(config, quant, "cpu", prefer="cpu", ep_group="partial")  # this rank's share
        assert layer.plan.experts_cls is expected_cls, layer.plan.explain()
        layer.load_weights(weights, bias)
        out = layer(x, logits)
    else:
        assert expected_cls.supports(config, quant, CPU)
        experts = expected_cls(config, quant, CPU)
        experts.load_weights(weights)
        out = experts.apply(x, topk_weights, topk_ids)
    assert out.dtype == config.dtype and out.shape == x.shape
    ref = reference_moe(x, weights, config, topk_weights, topk_ids, quant, config.expert_map())
    assert ref.norm() > 0
    return float((out.float() - ref).norm() / ref.norm())


ACTIVATIONS = [Activation.silu(), Activation.gelu(), Activation.gelu_tanh(), Activation.swiglu_oai(),
               Activation.relu2()]
ROUTINGS = [Routing.softmax_topk(True), Routing.softmax_topk(False), Routing.sigmoid_topk(True),
            Routing.deepseek_v3(4, 2, 2.5)]


UNQUANTIZED_CLASSES = [(CpuOneDnnExperts, torch.bfloat16), (CpuOneDnnExperts, torch.float32),
                       (CpuUnquantizedExperts, torch.bfloat16), (CpuUnquantizedExperts, torch.float16),
                       (CpuUnquantizedExperts, torch.float32)]


@pytest.mark.parametrize(("cls", "dtype"), UNQUANTIZED_CLASSES, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_unquantized_every_activation_and_dtype(cls, dtype, activation):
    config = _config(dtype=dtype, activation=activation, bias=activation.kind.value == "swiglu_oai")
    err = _relative_error(config, unquantized(), 13, 0, cls, via_oracle=False)
    assert err < TOLERANCE[dtype]


@pytest.mark.parametrize(("dtype", "expected"), [(torch.bfloat16, CpuOneDnnExperts), (torch.float32, CpuOneDnnExperts),
                                               (torch.float16, CpuUnquantizedExperts)], ids=str)
def test_oracle_prefers_onednn_and_falls_back_for_fp16(dtype, expected):
    assert _relative_error(_config(dtype=dtype), unquantized(), 10, 12, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("routing", ROUTINGS, ids=str)
def test_unquantized_every_routing(routing):
    err = _relative_error(_config(routing=routing), unquantized(), 11, 1, CpuOneDnnExperts)
    assert err < TOLERANCE[torch.bfloat16]


def test_llama4_weight_on_input():
    config = _config(k=1, routing=Routing.llama4())
    assert _relative_error(config, unquantized(), 9, 2, CpuOneDnnExperts) < 1e-2


@pytest.mark.parametrize("ep_rank", [0, 2])
def test_expert_parallel_drops_non_local_experts(ep_rank):
    config = _config(parallel=ParallelConfig(ep_size=3, ep_rank=ep_rank))
    assert _relative_error(config, int4_w4a16(64), 16, 3, CpuInt4Experts) < 1e-2


def test_expert_parallel_rank_with_no_routed_tokens_returns_zeros():
    config = _config(E=8, k=1, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    layer = FusedMoE(config, unquantized(), "cpu", ep_group="partial")
    layer.load_weights(ExpertWeights.random(config, unquantized()))
    logits = torch.full((4, 8), -10.0)
    logits[:, 0] = 10.0  # every token to expert 0, which rank 0 owns
    out = layer(torch.randn(4, 256).bfloat16(), logits)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize(("group", "zero_point", "act_order"), [
    (32, False, False), (64, True, False), (128, False, False), (64, False, True), (32, True, True),
])
def test_int4_tinygemm(dtype, group, zero_point, act_order):
    config = _config(dtype=dtype, activation=Activation.swiglu_oai(), bias=True)
    err = _relative_error(config, int4_w4a16(group, zero_point, act_order), 17, 4, CpuInt4Experts)
    assert err < (QUANTIZED_FP32_TOLERANCE if dtype == torch.float32 else TOLERANCE[dtype])


def test_int4_packing_unpacks_one_expert_at_a_time(monkeypatch):
    """The loader's memory bound is one 16-bit expert tensor of the layer: unpacking a whole layer's
    codes (a byte per weight, and twice that during the unpack) would exceed it at real widths."""
    from moe_cpu._details import packing

    seen = []
    unpack = packing.unpack_int4
    monkeypatch.setattr(packing, "unpack_int4", lambda words: seen.append(tuple(words.shape)) or unpack(words))
    config = _config()
    experts = CpuInt4Experts(config, int4_w4a16(64, act_order=True), CPU)
    experts.load_weights(ExpertWeights.random(config, int4_w4a16(64, act_order=True), seed=2))
    E, N, K = config.num_experts, config.intermediate_size, config.hidden_size
    assert seen == [(2 * N, K // 2)] * E + [(K, N // 2)] * E


def test_int8_codes_are_offset_by_128_for_every_byte():
    from moe_cpu._details.packing import int8_per_channel

    config = _config(E=1, k=1, K=256, N=128)
    weights = ExpertWeights.random(config, int8_w8a16(-1), seed=1)
    every = torch.arange(256, dtype=torch.uint8).repeat(2 * 128 * 256 // 256).view(1, 256, 256)
    weights = dataclasses.replace(weights, w13=every)
    codes, _, _ = int8_per_channel(weights, "w13", torch.bfloat16)
    assert codes.dtype == torch.int8 and torch.equal(codes.int(), every.int() - 128)


def _act_order_per_half(config: MoEConfig, quant: MoEQuantConfig, seed: int, agree: bool = False) -> ExpertWeights:
    """Act-order weights whose gate and up rows were calibrated apart (each half its own permutation,
    as GPTQ producers write them), in the per-half form w13_g_idx [E, 2, K]; `agree`: one permutation
    for both halves, still in that form."""
    gen = torch.Generator().manual_seed(seed)
    E, K, N, g = config.num_local_experts, config.hidden_size, config.intermediate_size_per_partition, quant.weight.group_size

    def grouping(k: int) -> torch.Tensor:
        return (torch.randperm(k, generator=gen) // g).int()

    gate = torch.stack([grouping(K) for _ in range(E)])
    up = gate if agree else torch.stack([grouping(K) for _ in range(E)])
    w13 = torch.randn(E, 2 * N, K, generator=gen) * K ** -0.5
    w2 = torch.randn(E, K, N, generator=gen) * N ** -0.5
    b13 = (torch.randn(E, 2 * N, generator=gen) * 0.1).to(config.dtype) if config.has_bias else None
    b2 = (torch.randn(E, K, generator=gen) * 0.1).to(config.dtype) if config.has_bias else None
    return ExpertWeights.from_float(w13, w2, quant, b13, b2, g_idx=(torch.stack([gate, up], 1),
                                    torch.stack([grouping(N) for _ in range(E)])), dtype=config.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("cls", "quant"), [
    (CpuInt4Experts, int4_w4a16(64, act_order=True)),
    (CpuInt4Experts, int4_w4a16(32, zero_point=True, act_order=True)),
    (CpuDequantizedExperts, int8_w8a16(64, act_order=True)),
], ids=["int4-g64", "int4-g32-zp", "int8-g64-dequantized"])
def test_act_order_with_gate_and_up_grouped_apart(cls, quant, dtype):
    """GPTQ producers calibrate gate_proj and up_proj apart: each half of w13 has its own g_idx.
    Against the fp32 reference, with biases, on one expert-parallel rank's experts."""
    config = _config(dtype=dtype, bias=True, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    weights = _act_order_per_half(config, quant, seed=3)
    assert not torch.equal(weights.w13_g_idx[:, 0], weights.w13_g_idx[:, 1])
    experts = cls(config, quant, CPU)
    experts.load_weights(weights)
    if cls is CpuInt4Experts:
        assert experts._packed()["w13_perm"].shape == (4, 2, 256)  # one permutation per half
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(13, 256, generator=gen).to(dtype)
    tw, ids = route_torch(torch.randn(13, 8, generator=gen), config.routing, config.top_k)
    ref = reference_moe(x, weights, config, tw, ids, quant, config.expert_map())
    err = float((experts.apply(x, tw, ids).float() - ref).norm() / ref.norm())
    assert err < (QUANTIZED_FP32_TOLERANCE if dtype == torch.float32 else TOLERANCE[dtype])


def test_int4_act_order_halves_that_agree_share_one_permutation():
    config, quant = _config(), int4_w4a16(64, act_order=True)
    weights = _act_order_per_half(config, quant, seed=5, agree=True)
    experts = CpuInt4Experts(config, quant, CPU)
    experts.load_weights(weights)
    assert experts._packed()["w13_perm"].shape == (8, 256)
    x = torch.randn(5, 256).bfloat16()
    tw, ids = route_torch(torch.randn(5, 8), config.routing, config.top_k)
    ref = reference_moe(x, weights, config, tw, ids, quant)
    assert float((experts.apply(x, tw, ids).float() - ref).norm() / ref.norm()) < TOLERANCE[torch.bfloat16]


def test_int4_float_zero_points():
    config = _config()
    quant = MoEQuantConfig(QuantKey(QuantDType.INT4, ScaleSpec(Granularity.GROUP, group_size=64, dtype="bf16"),
                                    ZeroPoint.FLOAT))
    symmetric = ExpertWeights.random(config, int4_w4a16(64), seed=5)
    gen = torch.Generator().manual_seed(6)
    zeros = {n: torch.randn(getattr(symmetric, f"{n}_scale").shape, generator=gen).bfloat16() * 0.01
             for n in ("w13", "w2")}
    weights = ExpertWeights(quant.weight, symmetric.w13, symmetric.w2, symmetric.w13_scale, symmetric.w2_scale,
                            zeros["w13"], zeros["w2"])
    layer = FusedMoE(config, quant, "cpu")
    assert layer.plan.experts_cls is CpuInt4Experts
    layer.load_weights(weights)
    x, logits = torch.randn(7, 256, generator=gen).bfloat16(), torch.randn(7, 8, generator=gen)
    tw, ti = route_torch(logits, config.routing, config.top_k)
    ref = reference_moe(x, weights, config, tw, ti, quant)
    assert float((layer(x, logits).float() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("zero_point", [False, True])
def test_int8_per_channel(dtype, zero_point):
    config = _config(dtype=dtype, activation=Activation.gelu(), bias=True)
    err = _relative_error(config, int8_w8a16(-1, zero_point), 15, 7, CpuInt8Experts)
    assert err < (QUANTIZED_FP32_TOLERANCE if dtype == torch.float32 else TOLERANCE[dtype])


@pytest.mark.parametrize("granularity", ["tensor", "channel", "block"])
def test_fp8_w8a8_emulation(granularity):
    err = _relative_error(_config(), fp8_w8a8(granularity), 12, 8, CpuFp8EmulatedExperts)
    assert err < 1e-2


@pytest.mark.parametrize("quant", [
    mxfp4_w4a16(), MoEQuantConfig(moe_core.quant.FP8_BLOCK128_WEIGHT), int4_w4a16(-1), int8_w8a16(64, True),
], ids=lambda q: q.name)
def test_dequantized_schemes(quant):
    config = _config(activation=Activation.swiglu_oai(), bias=True)
    assert _relative_error(config, quant, 10, 9, CpuDequantizedExperts) < 1e-2


@settings(max_examples=25, deadline=None)
@given(E=st.integers(1, 9), k_frac=st.floats(0, 1), K_groups=st.integers(1, 3), N_groups=st.integers(1, 3),
       tokens=st.integers(1, 20), scheme=st.sampled_from(["bf16", "fp32", "int4", "int8"]),
       seed=st.integers(0, 1000))
def test_random_shapes_match_reference(E, k_frac, K_groups, N_groups, tokens, scheme, seed):
    k = 1 + int(k_frac * (E - 1))
    K, N = 32 * K_groups, 32 * N_groups
    dtype = torch.float32 if scheme == "fp32" else torch.bfloat16
    quant, cls = {"bf16": (unquantized(), CpuOneDnnExperts), "fp32": (unquantized(), CpuOneDnnExperts),
                  "int4": (int4_w4a16(32), CpuInt4Experts), "int8": (int8_w8a16(), CpuInt8Experts)}[scheme]
    err = _relative_error(_config(E, k, K, N, dtype), quant, tokens, seed, cls)
    assert err < TOLERANCE[dtype]


# ---- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "config", "quant", "reason"), [
    (CpuInt4Experts, _config(), int4_w4a16(-1), "channel weight scales"),
    (CpuInt4Experts, _config(K=192, N=96), int4_w4a16(16), "group size 16"),
    (CpuInt4Experts, _config(K=256, N=192), int4_w4a16(128), "group size 128 does not divide the intermediate size 192"),
    (CpuInt4Experts, _config(), unquantized(), "does not support unquantized weights (supports: int4)"),
    (CpuInt8Experts, _config(), int8_w8a16(64), "group weight scales"),
    (CpuInt8Experts, _config(), int4_w4a16(64), "does not support int4 weights (supports: int8)"),
    (CpuUnquantizedExperts, _config(), int4_w4a16(64), "does not support int4 weights (supports: unquantized)"),
    (CpuOneDnnExperts, _config(), int8_w8a16(), "does not support int8 weights (supports: unquantized)"),
    (CpuDequantizedExperts, _config(K=192, N=96), int4_w4a16(128), "group size 128 does not divide the hidden size 192"),
    (CpuOneDnnExperts, _config(dtype=torch.float16), unquantized(), "activation dtype torch.float16"),
    (CpuDequantizedExperts, _config(), fp8_w8a8("tensor"), "activations fp8e4m3"),
    (CpuFp8EmulatedExperts, _config(), MoEQuantConfig(moe_core.quant.FP8_TENSOR_WEIGHT), "activations 16-bit"),
])
def test_refusals_name_the_reason(cls, config, quant, reason):
    support = cls.supports(config, quant, CPU)
    assert not support.ok
    assert reason in support.reason


def test_non_cpu_device_is_refused():
    cuda = moe_core.DeviceInfo(moe_core.Platform.CUDA, 0, "H100", (9, 0))
    for cls in (CpuOneDnnExperts, CpuUnquantizedExperts, CpuInt4Experts, CpuInt8Experts, CpuDequantizedExperts,
                CpuFp8EmulatedExperts):
        support = cls.supports(_config(), unquantized(), cuda)
        assert not support.ok and "not cuda" in support.reason


def test_int4_act_order_with_uneven_groups_is_refused_at_load():
    config, quant = _config(), int4_w4a16(64, act_order=True)
    weights = ExpertWeights.random(config, quant)
    uneven = weights.w13_g_idx.clone()
    uneven[:, :2] = 0  # group 0 now holds more than 64 channels
    layer = FusedMoE(config, quant, "cpu")
    with pytest.raises(ValueError, match="exactly 64 input channels"):
        layer.load_weights(ExpertWeights(**{**weights.__dict__, "w13_g_idx": uneven}))


def test_unquantized_weights_in_another_dtype_are_refused_at_load():
    config = _config(dtype=torch.float32)
    layer = FusedMoE(config, unquantized(), "cpu")
    weights = ExpertWeights.random(_config(), unquantized())  # bf16 tensors
    with pytest.raises(ValueError, match=r"layer dtype is torch\.float32"):
        layer.load_weights(weights)


def test_malformed_routing_is_refused():
    layer = FusedMoE(_config(), unquantized(), "cpu")
    layer.load_weights(ExpertWeights.random(_config(), unquantized()))
    x = torch.randn(3, 256).bfloat16()
    with pytest.raises(ValueError, match=r"must both be \[3, top_k\]"):
        layer.experts.apply(x, torch.rand(3, 2), torch.zeros(4, 2, dtype=torch.int32))


# ---- plugin, oracle, processors ----------------------------------------------------------------


def test_plugin_is_registered_and_ready():
    status = registry().statuses["cpu"]
    assert status.state is PluginState.READY, status.reason
    spec = backend_spec()
    assert spec.name == "cpu" and spec.platforms == (moe_core.Platform.CPU,)
    assert [r.path.rpartition(":")[2] for r in spec.experts][:3] == [
        "CpuOneDnnExperts", "CpuUnquantizedExperts", "CpuInt4Experts"]


def test_select_picks_int4_for_a_qwen3_shaped_layer():
    # qwen3-30b-a3b: 128 experts, top-8, softmax renormalized, SiLU, int4 group 128; a small twin here
    config = MoEConfig(16, 8, 256, 128, routing=Routing.softmax_topk(True))
    plan = moe_core.select(config, int4_w4a16(128), "cpu")
    assert plan.backend == "cpu" and plan.experts_cls is CpuInt4Experts
    assert plan.weight_layout == "cpu.int4pack"
    reference_row = [c for c in plan.candidates if c.backend == "reference"]
    assert reference_row and not reference_row[0].chosen


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.layout == torch._mkldnn else t


def test_onednn_prepacked_weights_hold_the_canonical_values():
    config = _config()
    weights = ExpertWeights.random(config, unquantized(), seed=13)
    packed = CpuOneDnnExperts.weight_processor(weights, config, torch.device("cpu"))
    for e in range(config.num_experts):
        assert torch.equal(_dense(packed[f"w13.{e}"]), weights.w13[e])
        assert torch.equal(_dense(packed[f"w2.{e}"]), weights.w2[e])


@pytest.mark.parametrize("quant", [unquantized(), int4_w4a16(64, True, True), int8_w8a16(-1, True),
                                   mxfp4_w4a16(), fp8_w8a8("block")], ids=lambda q: q.name)
def test_processors_are_pure_and_idempotent(quant):
    config = _config(bias=True)
    weights = ExpertWeights.random(config, quant, seed=11)
    before = {n: t.clone() for n, t in weights.tensors().items()}
    cls = moe_core.select(config, quant, "cpu").experts_cls
    first = cls.weight_processor(weights, config, torch.device("cpu"))
    second = cls.weight_processor(weights, config, torch.device("cpu"))
    assert first.layout == second.layout == cls.weight_processor.layout
    assert first.tensors.keys() == second.tensors.keys()
    for name in first.tensors:
        assert torch.equal(_dense(first[name]), _dense(second[name])), name
    for name, t in weights.tensors().items():
        assert torch.equal(t, before[name]), f"processor mutated {name}"
