"""The plugin, the capability records, the oracle's view of them, and the class's call of the
kernel, on CPU: a fake XPU device, a fake vendor module where the call itself is checked."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import types

import pytest
import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.experts import Experts
from moe_core.oracle import BackendUnavailableError, select
from moe_core.plugins import PluginState, Priority, registry, reset_registry
from moe_core.quant import (
    FP8_BLOCK128_WEIGHT,
    FP8_TENSOR_WEIGHT,
    MoEQuantConfig,
    fp8_w8a8,
    int4_w4a16,
    int8_w8a16,
    mxfp4_w4a16,
    unquantized,
)
from moe_core.weights import ExpertWeights, PackedWeights
from moe_xpu import experts as xpu_experts
from moe_xpu._plugin import backend_spec
from moe_xpu._probe import probe
from moe_xpu.experts import XpuExperts, XpuFp8Experts, XpuInt4Experts, XpuMxfp4Experts

CLASSES = (XpuExperts, XpuInt4Experts, XpuFp8Experts, XpuMxfp4Experts)
XPU = DeviceInfo(Platform.XPU, 0, "Intel GPU (fake)")
CPU_DEVICE = DeviceInfo(Platform.CPU)
VENDOR_INSTALLED = importlib.util.find_spec("vllm_xpu_kernels") is not None
XPU_PRESENT = hasattr(torch, "xpu") and torch.xpu.is_available()


def _config(activation=None, dtype=torch.bfloat16, *, hidden=256, inter=128, top_k=2, bias=False, routing=None,
            parallel=None) -> MoEConfig:
    return MoEConfig(8, top_k, hidden, inter, activation=activation or Activation.silu(), dtype=dtype,
                     has_bias=bias, routing=routing or Routing.softmax_topk(True),
                     parallel=parallel or ParallelConfig())


@pytest.fixture
def vendor_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `Capability.requires` find vllm_xpu_kernels, so the rest of each record is what answers."""
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "vllm_xpu_kernels":
            return importlib.machinery.ModuleSpec(name, None)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


# ---- the plugin -------------------------------------------------------------------------------


def test_spec_declares_the_classes_and_ranks_ahead_of_triton_on_xpu() -> None:
    spec = backend_spec()
    assert spec.name == "xpu" and spec.platforms == (Platform.XPU,) and spec.probe == "moe_xpu._probe:probe"
    assert spec.priorities == (Priority("xpu", Platform.XPU, 100),)
    classes = [registry().resolve(ref) for ref in spec.experts]
    assert classes == list(CLASSES)
    layouts = [c.weight_processor.layout for c in classes]
    assert len(set(layouts)) == len(layouts)
    assert all(c.backend == "xpu" and issubclass(c, Experts) for c in classes)


@pytest.mark.skipif(XPU_PRESENT, reason="an XPU is present")
def test_probe_and_doctor_state_say_device_absent() -> None:
    assert not probe() and "XPU" in probe().reason
    status = registry().statuses["xpu"]
    assert status.state is PluginState.DEVICE_ABSENT and status.spec is not None


def test_records_say_not_validated_and_need_the_vendor_package() -> None:
    for cls in CLASSES:
        cap = cls.capability
        assert cap.platforms == frozenset({Platform.XPU}) and cap.validated_on == ()
        assert cap.unvalidated_platforms == frozenset({Platform.XPU})
        assert cap.requires == ("vllm_xpu_kernels",)
        assert any("NOT validated on real hardware" in line for line in cap.limitations)
        assert cap.dtypes == frozenset({torch.bfloat16, torch.float16})


@pytest.mark.skipif(VENDOR_INSTALLED, reason="vllm-xpu-kernels is installed")
def test_refused_with_the_reason_where_the_vendor_package_is_absent() -> None:
    support = XpuExperts.supports(_config(), unquantized(), XPU)
    assert not support and "vllm_xpu_kernels" in support.reason


def test_refused_off_xpu() -> None:
    support = XpuExperts.supports(_config(), unquantized(), CPU_DEVICE)
    assert not support and "runs on {xpu}" in support.reason


# ---- what each class accepts and refuses -------------------------------------------------------

ACCEPTED = [
    (XpuExperts, _config(), unquantized()),
    (XpuExperts, _config(dtype=torch.float16, activation=Activation.gelu_tanh()), unquantized()),
    (XpuExperts, _config(activation=Activation.swiglu_oai(), bias=True), unquantized()),
    (XpuExperts, _config(activation=Activation.relu2()), unquantized()),
    (XpuExperts, _config(routing=Routing.llama4(), top_k=1), unquantized()),
    (XpuExperts, _config(parallel=ParallelConfig(ep_size=2, ep_rank=1)), unquantized()),
    *[(XpuInt4Experts, _config(hidden=512, inter=256), int4_w4a16(g)) for g in (32, 64, 128, 256)],
    (XpuFp8Experts, _config(), MoEQuantConfig(FP8_TENSOR_WEIGHT)),
    (XpuFp8Experts, _config(activation=Activation.swiglu_oai()), MoEQuantConfig(FP8_TENSOR_WEIGHT)),
    (XpuFp8Experts, _config(), MoEQuantConfig(FP8_BLOCK128_WEIGHT)),
    (XpuFp8Experts, _config(), fp8_w8a8("block")),
    (XpuMxfp4Experts, _config(activation=Activation.swiglu_oai(), bias=True), mxfp4_w4a16()),
]


@pytest.mark.parametrize(("cls", "config", "quant"), ACCEPTED, ids=lambda v: getattr(v, "__name__", None))
def test_accepts(vendor_present, cls, config: MoEConfig, quant: MoEQuantConfig) -> None:
    support = cls.supports(config, quant, XPU)
    assert support, support.reason


REFUSED = [
    (XpuExperts, _config(dtype=torch.float32), unquantized(), "activation dtype torch.float32"),
    (XpuExperts, _config(top_k=3), unquantized(), "top_k 3"),
    (XpuExperts, _config(activation=Activation.swiglu_oai(alpha=1.5)), unquantized(), "fixes alpha=1.702"),
    (XpuExperts, _config(hidden=260), unquantized(), "hidden size 260"),
    (XpuInt4Experts, _config(), int4_w4a16(128, zero_point=True), "zero points"),
    (XpuInt4Experts, _config(), int4_w4a16(64, act_order=True), "act-order"),
    (XpuInt4Experts, _config(), int4_w4a16(-1), "channel weight scales"),
    (XpuInt4Experts, _config(), int4_w4a16(16), "group size 16"),
    (XpuInt4Experts, _config(hidden=320), int4_w4a16(128), "does not divide the hidden size 320"),
    (XpuInt4Experts, _config(), int8_w8a16(), "does not support int8 weights"),
    (XpuFp8Experts, _config(), fp8_w8a8("tensor"), "activations fp8e4m3"),
    (XpuFp8Experts, _config(), fp8_w8a8("channel"), "channel weight scales"),
    (XpuFp8Experts, _config(activation=Activation.swiglu_oai()), fp8_w8a8("block"), "swiglu_oai with block fp8"),
    (XpuFp8Experts, _config(inter=192), MoEQuantConfig(FP8_BLOCK128_WEIGHT), "intermediate size 192"),
    (XpuMxfp4Experts, _config(hidden=264), mxfp4_w4a16(), "does not divide the hidden size 264"),
]


@pytest.mark.parametrize(("cls", "config", "quant", "reason"), REFUSED, ids=lambda v: getattr(v, "__name__", None))
def test_refuses_with_a_reason(vendor_present, cls, config: MoEConfig, quant: MoEQuantConfig, reason: str) -> None:
    support = cls.supports(config, quant, XPU)
    assert not support and reason in support.reason, support.reason


@pytest.mark.parametrize(("env", "cls", "quant"), [
    ("VLLM_XPU_FUSED_MOE_USE_REF", XpuExperts, unquantized()),
    ("VLLM_XPU_FUSED_MOE_USE_MXFP4_FP8", XpuMxfp4Experts, mxfp4_w4a16()),
    ("VLLM_XPU_FORCE_XE_DEFAULT_KERNEL", XpuInt4Experts, int4_w4a16(128)),
], ids=["ref-path", "mxfp4-fp8", "xe-default-gemm"])
def test_environment_switches_that_change_the_math_are_refused(vendor_present, monkeypatch, env, cls, quant) -> None:
    assert cls.supports(_config(), quant, XPU)
    monkeypatch.setenv(env, "1")
    support = cls.supports(_config(), quant, XPU)
    assert not support and env in support.reason


def test_block_fp8_reference_switch_refuses_block_only(vendor_present, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_XPU_FUSED_MOE_NATIVE_BLOCK_FP8", "0")
    assert not XpuFp8Experts.supports(_config(), fp8_w8a8("block"), XPU)
    assert XpuFp8Experts.supports(_config(), MoEQuantConfig(FP8_TENSOR_WEIGHT), XPU)


# ---- the oracle --------------------------------------------------------------------------------


@pytest.fixture
def xpu_plugin_ready(monkeypatch: pytest.MonkeyPatch):
    """A registry in which the xpu plugin's probe saw an XPU."""
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    reset_registry()
    yield
    monkeypatch.undo()
    reset_registry()


def test_oracle_picks_the_vendor_kernel_first_on_xpu(vendor_present, xpu_plugin_ready) -> None:
    assert registry().statuses["xpu"].state is PluginState.READY
    plan = select(_config(), int4_w4a16(128), XPU)
    assert (plan.backend, plan.experts_cls) == ("xpu", XpuInt4Experts)
    assert plan.weight_layout == "xpu.int4.nk"
    backends = [c.backend for c in plan.candidates]
    if "triton" in backends:
        assert backends.index("xpu") < backends.index("triton")


def test_forcing_xpu_for_a_refused_scheme_names_the_reasons(vendor_present, xpu_plugin_ready) -> None:
    with pytest.raises(BackendUnavailableError, match="zero points"):
        select(_config(), int4_w4a16(128, zero_point=True), XPU, prefer="xpu")


# ---- loading and calling the kernel, with a fake vendor module ---------------------------------


class FakeXpuFusedMoe:
    """Records how the class builds and calls XpuFusedMoe; writes zeros."""

    def __init__(self, **kwargs) -> None:
        self.init = kwargs
        self.calls: list[dict] = []

    def apply(self, output, hidden_states, topk_weights, topk_ids, expert_map=None, a1q_scale=None) -> None:
        self.calls.append({"hidden_states": hidden_states, "topk_weights": topk_weights, "topk_ids": topk_ids,
                           "expert_map": expert_map, "a1q_scale": a1q_scale})
        output.zero_()


@pytest.fixture
def fake_vendor(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.SimpleNamespace(XpuFusedMoe=FakeXpuFusedMoe, FUSEDMOE_AVAILABLE=True)
    monkeypatch.setattr(xpu_experts, "_kernel_module", lambda: module)


def _loaded(cls, config: MoEConfig, quant: MoEQuantConfig) -> Experts:
    # The CPU stands in for the XPU: the processors are device-agnostic, the fake kernel is too.
    experts = cls(config, quant, CPU_DEVICE)
    experts.load_weights(ExpertWeights.random(config, quant, seed=2))
    return experts


def _routed(config: MoEConfig, m: int = 5):
    x = torch.randn(m, config.hidden_size).to(config.dtype)
    ids = torch.stack([torch.randperm(config.num_experts)[: config.top_k] for _ in range(m)])
    return x, torch.rand(m, config.top_k), ids


def test_kernel_is_built_from_the_processed_tensors(fake_vendor) -> None:
    config = _config(activation=Activation.swiglu_oai(), bias=True, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    experts = _loaded(XpuMxfp4Experts, config, mxfp4_w4a16())
    init, packed = experts._kernel.init, experts.weights
    for name in ("w13", "w2"):
        assert init[name] is packed[name]
        assert init[f"{name}_scales"] is packed[f"{name}_scale"] and init[f"{name}_bias"] is packed[f"{name}_bias"]
    assert init["activation"] == "swigluoai" and init["n_experts_per_token"] == 2
    assert init["num_experts"] == 4 and torch.equal(init["expert_map"], config.expert_map())
    x, w, ids = _routed(config)
    out = experts.apply(x, w, ids)
    call = experts._kernel.calls[-1]
    assert out.shape == x.shape and out.dtype == x.dtype
    assert call["topk_weights"].dtype == torch.float32 and call["a1q_scale"] is None
    assert call["expert_map"] is experts.expert_map and call["hidden_states"] is x


def test_block_w8a8_hands_the_kernel_fp8_activations_and_group_scales(fake_vendor) -> None:
    config = _config()
    experts = _loaded(XpuFp8Experts, config, fp8_w8a8("block"))
    x, w, ids = _routed(config, m=3)
    experts.apply(x, w, ids)
    call = experts._kernel.calls[-1]
    assert call["hidden_states"].dtype == torch.float8_e4m3fn
    assert call["a1q_scale"].dtype == torch.float32 and tuple(call["a1q_scale"].shape) == (3, 2)


def test_llama4_top1_scales_the_input_and_passes_unit_weights(fake_vendor) -> None:
    config = _config(routing=Routing.llama4(), top_k=1)
    experts = _loaded(XpuExperts, config, unquantized())
    x, w, ids = _routed(config)
    experts.apply(x, w, ids)
    call = experts._kernel.calls[-1]
    assert torch.equal(call["topk_weights"], torch.ones_like(w))
    assert torch.equal(call["hidden_states"], (x.float() * w).to(x.dtype))


def test_reload_builds_a_new_kernel_from_new_tensors(fake_vendor) -> None:
    config = _config()
    experts = _loaded(XpuInt4Experts, config, int4_w4a16(64))
    first = experts._kernel
    experts.load_weights(ExpertWeights.random(config, int4_w4a16(64), seed=2))
    assert experts._kernel is not first and experts._kernel.init["w13"] is not first.init["w13"]


class _Int4AsInt8Processor:
    """The int4 layout with its codes retyped int8: dtypes from which XpuFusedMoe infers bf16."""

    layout = "xpu.int4.nk"

    def __call__(self, weights, config, device) -> PackedWeights:
        packed = XpuInt4Experts.weight_processor(weights, config, device)
        return PackedWeights(self.layout, {**packed.tensors, "w13": packed["w13"].view(torch.int8)})


def test_load_refuses_a_layout_whose_dtypes_infer_another_recipe(fake_vendor) -> None:
    class Mislabelled(XpuInt4Experts):
        weight_processor = _Int4AsInt8Processor()

    with pytest.raises(RuntimeError, match=r"would infer recipe 'bf16'.*needs 'int4'"):
        _loaded(Mislabelled, _config(), int4_w4a16(64))


def test_load_refuses_the_reference_switch(fake_vendor, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_XPU_FUSED_MOE_USE_REF", "1")
    with pytest.raises(RuntimeError, match="VLLM_XPU_FUSED_MOE_USE_REF"):
        _loaded(XpuExperts, _config(), unquantized())


@pytest.mark.skipif(VENDOR_INSTALLED, reason="vllm-xpu-kernels is installed")
def test_load_without_the_vendor_package_says_what_to_install() -> None:
    with pytest.raises(RuntimeError, match=r"moe-xpu\[kernels\]"):
        _loaded(XpuExperts, _config(), unquantized())


def test_apply_before_load_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no weights loaded"):
        XpuExperts(_config(), unquantized(), CPU_DEVICE).apply(*_routed(_config()))


@pytest.mark.parametrize(("change", "message"), [
    (lambda x, w, ids: (x[:, :128], w, ids), r"hidden_states has shape \[5, 128\], expected \[M, 256\]"),
    (lambda x, w, ids: (x.half(), w, ids), "hidden_states is torch.float16, expected the layer dtype"),
    (lambda x, w, ids: (x, w[:, :1], ids), r"topk_weights has shape \[5, 1\], expected \[5, 2\]"),
    (lambda x, w, ids: (x, w, ids.float()), "topk_ids is torch.float32, expected int32 or int64"),
], ids=["hidden-width", "dtype", "topk-shape", "ids-dtype"])
def test_bad_inputs_name_what_is_wrong(fake_vendor, change, message: str) -> None:
    experts = _loaded(XpuExperts, _config(), unquantized())
    with pytest.raises(ValueError, match=message):
        experts.apply(*change(*_routed(_config())))


@pytest.mark.parametrize(("cls", "config", "weights_quant", "message"), [
    (XpuExperts, _config(), None, "unquantized weights must be in the layer dtype"),
    (XpuInt4Experts, _config(), int4_w4a16(64, zero_point=True), "takes symmetric int4"),
    (XpuFp8Experts, _config(), fp8_w8a8("channel"), "per-tensor or 128x128 block"),
    (XpuFp8Experts, _config(activation=Activation.swiglu_oai()), fp8_w8a8("block"), "cannot be interleaved"),
    (XpuMxfp4Experts, _config(), int4_w4a16(32), "takes fp4e2m1 weights"),
], ids=["dense-dtype", "int4-zp", "fp8-channel", "fp8-block-swiglu", "mxfp4-int4"])
def test_processors_refuse_weights_they_cannot_lay_out(cls, config, weights_quant, message: str) -> None:
    if weights_quant is None:
        weights = ExpertWeights.random(config, unquantized(), seed=1)
        weights = ExpertWeights(weights.key, weights.w13.half(), weights.w2.half())
    else:
        weights = ExpertWeights.random(config, weights_quant, seed=1)
    with pytest.raises(ValueError, match=message):
        cls.weight_processor(weights, config, torch.device("cpu"))
