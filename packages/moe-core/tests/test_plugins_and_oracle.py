"""Discovery failure modes (quiet unless asked for, loud when asked for) and the oracle's choices."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import _fake_backends as fb
from moe_core import (
    BackendUnavailableError,
    DeviceInfo,
    FusedMoE,
    MoEConfig,
    NoBackendError,
    Platform,
    int4_w4a16,
    int8_w8a16,
    select,
    unquantized,
)
from moe_core.__about__ import __version__
from moe_core.backends import REFERENCE_BACKEND
from moe_core.config import Activation
from moe_core.plugins import (
    BackendSpec,
    CommandRef,
    ExpertsRef,
    PluginState,
    Priority,
    registry,
    reset_registry,
)
from moe_core.quant import QuantFamily

CFG = MoEConfig(8, 2, 256, 128, max_num_tokens=64)
H100 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H100", (9, 0))


@pytest.fixture
def fake_registry():
    """Install a registry from fake entry points; restore real discovery afterwards."""

    def install(*eps):
        return registry(fb.entry_points(*eps))

    yield install
    reset_registry()


def core_dist(requires=("moe-core>=0.2,<0.3",), name="moe-fake"):
    return fb.FakeDist(name, requires=requires)


def test_import_does_not_discover_plugins():
    code = ("import moe_core, moe_core.plugins as p; assert p._registry is None; "
            "moe_core.MoEConfig(4, 2, 8, 8); assert p._registry is None")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_statuses_for_every_failure_mode(fake_registry):
    reg = fake_registry(
        fb.FakeEntryPoint("cpu", fb.cpu_spec, core_dist()),
        fb.FakeEntryPoint("triton", fb.gpu_spec, core_dist()),
        fb.FakeEntryPoint("broken", ImportError("No module named 'moe_broken._plugin'"), core_dist()),
        fb.FakeEntryPoint("raises", fb.raises_in_factory, core_dist()),
        fb.FakeEntryPoint("future", fb.future_api_spec, core_dist()),
        fb.FakeEntryPoint("oldmajor", fb.old_major_spec, core_dist()),
        fb.FakeEntryPoint("stale", fb.cpu_spec, core_dist(requires=("moe-core>=9.0,<10", "torch>=2"))),
        fb.FakeEntryPoint("garbage", fb.returns_garbage, core_dist()),
        fb.FakeEntryPoint("misnamed", fb.wrong_name_spec, core_dist()),
    )
    state = {name: (s.state, s.reason) for name, s in reg.statuses.items()}
    assert state["cpu"][0] is PluginState.READY
    assert state["triton"] == (PluginState.DEVICE_ABSENT, "no CUDA device visible to torch")
    assert state["broken"][0] is PluginState.IMPORT_ERROR and "moe_broken._plugin" in state["broken"][1]
    assert state["raises"][0] is PluginState.IMPORT_ERROR and "libfoo.so.1" in state["raises"][1]
    assert state["future"][0] is PluginState.INCOMPATIBLE and "1.99" in state["future"][1]
    assert state["oldmajor"][0] is PluginState.INCOMPATIBLE and "0.3" in state["oldmajor"][1]
    assert state["stale"] == (PluginState.INCOMPATIBLE, f"requires moe-core<10,>=9.0, installed moe-core is {__version__}")
    assert state["garbage"][0] is PluginState.SPEC_ERROR and "dict" in state["garbage"][1]
    assert state["misnamed"][0] is PluginState.SPEC_ERROR and "not-its-name" in state["misnamed"][1]


def test_broken_plugins_are_quiet_when_not_asked_for(fake_registry):
    fake_registry(fb.FakeEntryPoint("cpu", fb.cpu_spec, core_dist()),
                  fb.FakeEntryPoint("triton", ImportError("triton wheel is half-installed"), core_dist()))
    plan = select(CFG, unquantized(), "cpu")
    assert plan.backend == "cpu" and plan.experts_cls is fb.FakeCpuExperts and not plan.forced


def test_broken_plugin_is_loud_when_asked_for(fake_registry):
    fake_registry(fb.FakeEntryPoint("cpu", fb.cpu_spec, core_dist()),
                  fb.FakeEntryPoint("triton", ImportError("triton wheel is half-installed"), core_dist()))
    with pytest.raises(BackendUnavailableError, match="half-installed"):
        select(CFG, unquantized(), H100, prefer="triton")


def test_forced_backend_that_is_not_installed(fake_registry, monkeypatch):
    fake_registry(fb.FakeEntryPoint("cpu", fb.cpu_spec, core_dist()))
    monkeypatch.setenv("MOE_BACKEND", "aiter")
    with pytest.raises(BackendUnavailableError, match="MOE_BACKEND='aiter' names no installed backend; "
                       "installed: cpu, reference"):
        select(CFG, unquantized(), "cpu")


def test_forced_backend_that_cannot_serve_is_not_rebound(fake_registry):
    fake_registry(fb.FakeEntryPoint("cpu", fb.cpu_spec, core_dist()))
    gelu = MoEConfig(8, 2, 256, 128, activation=Activation.gelu())
    with pytest.raises(BackendUnavailableError, match=r"backend 'cpu' cannot serve .*activation gelu"):
        select(gelu, unquantized(), "cpu", prefer="cpu")
    # Forcing the reference works, and the table still explains the CPU refusal.
    plan = select(gelu, unquantized(), "cpu", prefer="reference")
    assert plan.forced and plan.backend == "reference"
    assert any(c.backend == "cpu" and "activation gelu" in c.reason for c in plan.candidates)


def test_candidate_table_lists_every_candidate_with_a_reason(fake_registry):
    fake_registry(fb.FakeEntryPoint("cpu", fb.cpu_spec, core_dist()),
                  fb.FakeEntryPoint("triton", fb.gpu_spec, core_dist()))
    plan = select(CFG, int4_w4a16(128), "cpu")
    assert plan.experts_cls is fb.FakeCpuInt4Experts
    rows = {(c.backend, c.experts): c for c in plan.candidates}
    assert "does not support int4 weights (supports: unquantized)" in rows[("cpu", "FakeCpuExperts")].reason
    assert rows[("cpu", "FakeCpuInt4Experts")].chosen
    assert "device_absent" in rows[("triton", "FakeGpuExperts")].reason
    assert "never chosen automatically" in rows[("reference", "ReferenceExperts")].reason
    assert all(c.ok or c.reason for c in plan.candidates)
    assert "FakeCpuInt4Experts" in plan.explain()


def test_no_backend_error_is_the_table(fake_registry):
    fake_registry(fb.FakeEntryPoint("cpu", fb.cpu_spec, core_dist()))
    with pytest.raises(NoBackendError) as info:
        select(CFG, int4_w4a16(64), "cpu")
    msg = str(info.value)
    assert "group size 64 (supported: {128})" in msg and "FakeCpuExperts" in msg and "backend" in msg


def _gpu_plugin(name: str, *priorities: Priority) -> fb.FakeEntryPoint:
    spec = BackendSpec(name, (1, 1), (Platform.CUDA,), (ExpertsRef(name, "_fake_backends:FakeGpuExperts"),),
                       priorities=priorities)
    return fb.FakeEntryPoint(name, spec, core_dist())


def test_plugins_bring_their_priorities(fake_registry):
    fake_registry(
        _gpu_plugin("portable", Priority("portable", Platform.CUDA, 50)),
        _gpu_plugin("native", Priority("native", Platform.CUDA, 100), Priority("native", Platform.ROCM, 10)),
        _gpu_plugin("wna16only", Priority("wna16only", Platform.CUDA, 200, frozenset({QuantFamily.WNA16}))),
        _gpu_plugin("unranked"),
        _gpu_plugin("alsoportable", Priority("alsoportable", Platform.CUDA, 50)))
    plan = select(CFG, unquantized(), H100)
    order = [c.backend for c in plan.candidates]
    # Larger rank first, ties by name, a rank for another family or platform does not count, reference last.
    assert order == ["native", "alsoportable", "portable", "unranked", "wna16only", REFERENCE_BACKEND]
    assert plan.backend == "native"
    int4 = [c.backend for c in select(CFG, int4_w4a16(128), H100, prefer="reference").candidates]
    assert int4[0] == "wna16only"
    a100 = DeviceInfo(Platform.CUDA, 0, "NVIDIA A100", (8, 0))
    with pytest.raises(NoBackendError, match=r"compute capability >= \(9, 0\)"):
        select(CFG, unquantized(), a100)


def test_spec_priorities_must_name_its_backends():
    with pytest.raises(ValueError, match="names backend 'other', which the spec's experts do not serve"):
        BackendSpec("x", (1, 1), (Platform.CPU,), (ExpertsRef("x", "m:C"),), priorities=(Priority("other", Platform.CPU, 1),))
    with pytest.raises(ValueError, match="repeats a name"):
        BackendSpec("x", (1, 1), (Platform.CPU,), (), commands=(CommandRef("a", "m:f", ""), CommandRef("a", "m:g", "")))


def test_no_kernels_for_the_platform_says_what_to_install(fake_registry):
    fake_registry(fb.FakeEntryPoint("cpu", fb.cpu_spec, core_dist()))
    with pytest.raises(NoBackendError, match="no kernels for cuda are installed: pip install moe-triton"):
        select(CFG, unquantized(), H100)


def test_plugin_that_failed_before_its_spec_has_a_row(fake_registry):
    fake_registry(fb.FakeEntryPoint("cpu", fb.cpu_spec, core_dist()),
                  fb.FakeEntryPoint("triton", ImportError("triton wheel is half-installed"), core_dist()))
    plan = select(CFG, unquantized(), "cpu")
    row = next(c for c in plan.candidates if c.backend == "triton")
    assert not row.ok and "import_error" in row.reason and "half-installed" in row.reason


def test_experts_classes_that_fail_to_import(fake_registry):
    fake_registry(fb.FakeEntryPoint("badclass", fb.bad_class_spec, core_dist()))
    with pytest.raises(BackendUnavailableError) as info:
        select(CFG, unquantized(), "cpu", prefer="badclass")
    assert "NotExperts is not an Experts subclass" in str(info.value)
    assert "has no attribute 'Missing'" in str(info.value)


def test_each_layer_owns_its_kernel_instance(fake_registry):
    fake_registry(fb.FakeEntryPoint("cpu", fb.cpu_spec, core_dist()))
    a, b = FusedMoE(CFG, device="cpu"), FusedMoE(CFG, device="cpu")
    assert a.experts is not b.experts and a.plan.backend == "cpu"


def test_layers_route_with_their_experts_class_router():
    """FusedMoE and the conformance suite route a modular class's layers with the router the class
    names (`oracle.apply_layer` through `router_of`; route_torch where it names none), so a router
    that disagrees with route_torch fails the suite instead of going unseen."""
    from moe_core.backends import detect_device
    from moe_core.oracle import apply_layer, router_of
    from moe_core.reference import reference_moe
    from moe_core.routing import route_torch
    from moe_core.weights.canonical import ExpertWeights

    assert router_of(fb.FakeCpuExperts) is route_torch
    assert router_of(fb.FakeCpuInvertedRouterExperts) is fb.inverted_router
    cpu = detect_device("cpu")
    weights = ExpertWeights.random(CFG, unquantized(), seed=3)
    experts = fb.FakeCpuInvertedRouterExperts(CFG, unquantized(), cpu)
    experts.load_weights(weights)
    gen = torch.Generator().manual_seed(4)
    x, logits = torch.randn(5, 256, generator=gen).bfloat16(), torch.randn(5, 8, generator=gen)
    out = apply_layer(experts, x, logits, None)
    inverted = reference_moe(x, weights, CFG, *fb.inverted_router(logits, CFG.routing, 2), unquantized())
    routed = reference_moe(x, weights, CFG, *route_torch(logits, CFG.routing, 2), unquantized())
    assert torch.equal(out, inverted.to(out.dtype)) and not torch.allclose(out.float(), routed, rtol=0.1, atol=0.1)


def test_real_plugins_are_discovered_in_the_workspace():
    """The development workspace installs moe-cpu and moe-triton: both must be found, the CPU one ready."""
    reset_registry()
    reg = registry()
    assert {"cpu", "triton"} <= set(reg.statuses)
    assert reg.statuses["cpu"].state is PluginState.READY
    assert reg.statuses["triton"].state in (PluginState.READY, PluginState.DEVICE_ABSENT)


def test_int8_and_weights_on_the_reference(fake_registry):
    fake_registry()
    plan = select(CFG, int8_w8a16(-1), "cpu", prefer="reference")
    assert plan.backend == REFERENCE_BACKEND and plan.weight_layout == "canonical"
    assert torch.__version__  # torch is importable alongside the registry


def test_validation_records_name_their_platform():
    from moe_core.config import ActivationKind
    from moe_core.experts import UNQUANTIZED, Capability

    with pytest.raises(ValueError, match="expected 'platform: hardware'"):
        Capability(frozenset({Platform.CPU}), (UNQUANTIZED,), frozenset(ActivationKind), validated_on=("NVIDIA H100",))
    cap = Capability(frozenset({Platform.CUDA, Platform.ROCM}), (UNQUANTIZED,), frozenset(ActivationKind),
                     validated_on=("cuda: NVIDIA H100 80GB HBM3",))
    assert cap.unvalidated_platforms == {Platform.ROCM}
