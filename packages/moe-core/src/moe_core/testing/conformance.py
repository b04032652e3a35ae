"""The backend conformance suite: every experts class of a plugin against the fp32 reference.

Cases are generated from what each class declares: a scenario becomes a test for a class exactly
when `supports()` accepts it on a device that is present, so a claim that the kernel cannot keep
fails here, and a refusal is checked to be a real refusal by the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from moe_core.backends import DeviceInfo, detect_device
from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.experts import Experts
from moe_core.oracle import BackendUnavailableError, apply_layer, select
from moe_core.plugins import PluginState, registry
from moe_core.quant import MoEQuantConfig, fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16, unquantized
from moe_core.reference import ReferenceExperts, reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights

__all__ = [
    "Case",
    "cases",
    "test_conformance_layers_do_not_share_state",
    "test_conformance_matches_reference",
    "test_conformance_refusals_are_enforced",
    "test_conformance_reload_is_idempotent",
    "test_conformance_spec",
    "test_conformance_tests_every_class",
]

_E, _K, _N = 8, 256, 128
_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}


def _cfg(dtype=torch.bfloat16, activation=None, routing=None, top_k=2, bias=False, parallel=None) -> MoEConfig:
    return MoEConfig(_E, top_k, _K, _N, activation=activation or Activation.silu(),
                     routing=routing or Routing.softmax_topk(True), dtype=dtype, has_bias=bias,
                     parallel=parallel or ParallelConfig(), max_num_tokens=256)


# (name, config, quant): each exercises one feature on top of a plain bf16 SiLU layer.
SCENARIOS: tuple[tuple[str, MoEConfig, MoEQuantConfig], ...] = (
    ("bf16-silu", _cfg(), unquantized()),
    ("fp16-gelu", _cfg(torch.float16, Activation.gelu()), unquantized()),
    ("fp32-silu-norenorm", _cfg(torch.float32, routing=Routing.softmax_topk(False)), unquantized()),
    ("bf16-gelu_tanh", _cfg(activation=Activation.gelu_tanh()), unquantized()),
    ("bf16-relu2", _cfg(activation=Activation.relu2()), unquantized()),
    ("bf16-swiglu_oai-bias", _cfg(activation=Activation.swiglu_oai(), bias=True), unquantized()),
    ("bf16-deepseek-routing", _cfg(routing=Routing.deepseek_v3(4, 2, 2.5)), unquantized()),
    ("bf16-llama4-routing", _cfg(routing=Routing.llama4(), top_k=1), unquantized()),
    ("bf16-expert-parallel", _cfg(parallel=ParallelConfig(ep_size=3, ep_rank=1)), unquantized()),
    ("int4-g32", _cfg(), int4_w4a16(32)),
    ("int4-g64-fp16", _cfg(torch.float16), int4_w4a16(64)),
    ("int4-g128-zp", _cfg(), int4_w4a16(128, zero_point=True)),
    ("int4-channel", _cfg(), int4_w4a16(-1)),
    ("int4-g64-actorder", _cfg(), int4_w4a16(64, act_order=True)),
    ("int4-g128-ep-bias", _cfg(bias=True, parallel=ParallelConfig(ep_size=2, ep_rank=0)), int4_w4a16(128)),
    ("int8-channel", _cfg(), int8_w8a16(-1)),
    ("int8-g128-zp", _cfg(), int8_w8a16(128, zero_point=True)),
    ("fp8-tensor", _cfg(), fp8_w8a8("tensor")),
    ("fp8-tensor-act-tensor", _cfg(), fp8_w8a8("tensor", activation_scales="tensor")),
    ("fp8-channel", _cfg(), fp8_w8a8("channel")),
    ("fp8-block128", _cfg(), fp8_w8a8("block")),
    ("mxfp4-swiglu_oai-bias", _cfg(activation=Activation.swiglu_oai(), bias=True), mxfp4_w4a16()),
)


@dataclass(frozen=True)
class Case:
    experts_cls: type[Experts]
    scenario: str
    config: MoEConfig
    quant: MoEQuantConfig
    device: DeviceInfo

    @property
    def id(self) -> str:
        return f"{self.experts_cls.name()}-{self.scenario}-{self.device.platform.value}"


def _plugin_classes(plugin: str) -> list[type[Experts]]:
    if plugin == "reference":  # moe-core's built-in experts, present in every installation
        return [ReferenceExperts]
    status = registry().statuses.get(plugin)
    if status is None or status.spec is None:
        return []
    return [registry().resolve(ref) for ref in status.spec.experts]


def _present_devices(cls: type[Experts]) -> list[DeviceInfo]:
    devices = [detect_device("cpu")]
    if torch.cuda.is_available():
        devices.append(detect_device("cuda"))
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        devices.append(detect_device("xpu"))
    return [d for d in devices if d.platform in cls.capability.platforms]


def cases(plugin: str) -> list[Case]:
    out = []
    for cls in _plugin_classes(plugin):
        for device in _present_devices(cls):
            for name, config, quant in SCENARIOS:
                if cls.supports(config, quant, device):
                    out.append(Case(cls, name, config, quant, device))
    return out


def _layer_inputs(case: Case, m: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    cfg = case.config
    x = torch.randn(m, cfg.hidden_size, generator=gen).to(cfg.dtype)
    logits = torch.randn(m, cfg.num_experts, generator=gen)
    bias = torch.randn(cfg.num_experts, generator=gen) * 0.2 if cfg.routing.has_correction_bias else None
    dev = case.device.torch_device
    return x.to(dev), logits.to(dev), bias.to(dev) if bias is not None else None


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "kernel output has NaN/Inf"
    return float((out.float() - ref).norm() / ref.norm())


# ---- the tests ------------------------------------------------------------------------------


def test_conformance_tests_every_class(request: pytest.FixtureRequest) -> None:
    """Each experts class must meet at least one scenario on each present device it claims (platform and
    compute capability): a class that refuses every case would otherwise pass the suite with zero cases."""
    plugin = request.module.CONFORMANCE_PLUGIN
    classes = _plugin_classes(plugin)
    assert classes, f"plugin {plugin!r} has no experts classes to test (is it installed and ready?)"
    tested = 0
    for cls in classes:
        for device in (d for d in _present_devices(cls) if cls.capability.check_compute_capability(d)):
            names = [name for name, config, quant in SCENARIOS if cls.supports(config, quant, device)]
            assert names, (f"{cls.name()} accepts none of the conformance scenarios on {device}: "
                           f"{', '.join(n for n, _, _ in SCENARIOS)}")
            tested += 1
    if not tested:
        platforms = sorted({p.value for cls in classes for p in cls.capability.platforms})
        pytest.skip(f"no device of {platforms} is present")


def test_conformance_spec(request: pytest.FixtureRequest) -> None:
    plugin = request.module.CONFORMANCE_PLUGIN
    if plugin == "reference":
        assert ReferenceExperts.capability.platforms and ReferenceExperts.weight_processor.layout == "canonical"
        return
    status = registry().statuses.get(plugin)
    assert status is not None, f"plugin {plugin!r} is not installed (entry point group moe_core.backends)"
    assert status.state in (PluginState.READY, PluginState.DEVICE_ABSENT), f"{plugin}: {status.state}: {status.reason}"
    assert status.spec.experts, f"plugin {plugin!r} declares no experts classes"
    for ref in status.spec.experts:
        cls = registry().resolve(ref)
        assert cls.backend == ref.backend, f"{ref.path} serves {cls.backend!r}, spec says {ref.backend!r}"
        assert isinstance(cls.weight_processor.layout, str) and cls.weight_processor.layout
        assert cls.capability.schemes and cls.capability.activations and cls.capability.platforms


def test_conformance_matches_reference(conformance_case: Case) -> None:
    case = conformance_case
    weights = ExpertWeights.random(case.config, case.quant, seed=11)
    experts = case.experts_cls(case.config, case.quant, case.device)
    experts.load_weights(weights)
    emap = case.config.expert_map(case.device.torch_device)
    for m, seed in ((1, 1), (37, 2)):
        x, logits, bias = _layer_inputs(case, m, seed)
        out = apply_layer(experts, x, logits, bias)  # as FusedMoE calls it, with the class's own router
        assert out.shape == x.shape and out.dtype == x.dtype
        # Every router must choose as route_torch does: the reference follows its choices.
        w, ids = route_torch(logits, case.config.routing, case.config.top_k, bias)
        ref = reference_moe(x, weights, case.config, w, ids, case.quant, emap)
        tol = _TOL[case.config.dtype] * (2 if case.quant.activation is not None else 1)
        assert _rel_err(out, ref) < tol, f"M={m}: relative L2 error {_rel_err(out, ref):.2e} >= {tol}"


def test_conformance_reload_is_idempotent(conformance_case: Case) -> None:
    case = conformance_case
    weights = ExpertWeights.random(case.config, case.quant, seed=5)
    experts = case.experts_cls(case.config, case.quant, case.device)
    x, logits, bias = _layer_inputs(case, 9, 3)
    experts.load_weights(weights)
    first = apply_layer(experts, x, logits, bias)
    experts.load_weights(weights)
    second = apply_layer(experts, x, logits, bias)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    # The canonical weights are untouched by conversion.
    again = ExpertWeights.random(case.config, case.quant, seed=5)
    for name, t in weights.tensors().items():
        assert torch.equal(t, again.tensors()[name]), f"loading mutated canonical {name}"


def test_conformance_layers_do_not_share_state(conformance_case: Case) -> None:
    case = conformance_case
    a = case.experts_cls(case.config, case.quant, case.device)
    b = case.experts_cls(case.config, case.quant, case.device)
    wa = ExpertWeights.random(case.config, case.quant, seed=21)
    wb = ExpertWeights.random(case.config, case.quant, seed=22)
    a.load_weights(wa)
    x, logits, bias = _layer_inputs(case, 8, 4)
    before = apply_layer(a, x, logits, bias)
    b.load_weights(wb)
    after = apply_layer(a, x, logits, bias)
    torch.testing.assert_close(before, after, rtol=0, atol=0)
    assert not torch.equal(apply_layer(b, x, logits, bias), after)


def test_conformance_refusals_are_enforced(request: pytest.FixtureRequest) -> None:
    """Every scenario a class refuses on a present device is refused by the oracle when forced."""
    for cls in _plugin_classes(request.module.CONFORMANCE_PLUGIN):
        for device in _present_devices(cls):
            backend = cls.backend
            for _name, config, quant in SCENARIOS:
                if any(c.supports(config, quant, device) for c in _plugin_classes(request.module.CONFORMANCE_PLUGIN)
                       if c.backend == cls.backend):
                    continue
                with pytest.raises(BackendUnavailableError, match=backend):
                    select(config, quant, device, prefer=backend)

