"""The shipped conformance suite fails rather than passing vacuously."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import _fake_backends as fb
from moe_core.plugins import registry, reset_registry
from moe_core.testing import conformance


def _request(plugin: str):
    return SimpleNamespace(module=SimpleNamespace(CONFORMANCE_PLUGIN=plugin))


@pytest.fixture
def fake_plugins():
    def install(*eps):
        return registry(fb.entry_points(*eps))

    yield install
    reset_registry()


def test_a_class_that_refuses_every_scenario_fails(fake_plugins):
    fake_plugins(fb.FakeEntryPoint("refuser", fb.refuser_spec, fb.FakeDist("moe-refuser")))
    assert conformance.cases("refuser") == []
    with pytest.raises(AssertionError, match="FakeCpuRefusesAllExperts accepts none of the conformance scenarios"):
        conformance.test_conformance_tests_every_class(_request("refuser"))


def test_a_plugin_that_is_not_installed_fails(fake_plugins):
    fake_plugins()
    with pytest.raises(AssertionError, match="plugin 'nothing' has no experts classes"):
        conformance.test_conformance_tests_every_class(_request("nothing"))


def test_a_class_with_cases_passes(fake_plugins):
    fake_plugins(fb.FakeEntryPoint("cpu", fb.cpu_spec, fb.FakeDist("moe-fake")))
    assert "bf16-silu" in {c.scenario for c in conformance.cases("cpu")}
    conformance.test_conformance_tests_every_class(_request("cpu"))


def test_a_plugin_without_a_present_device_skips(fake_plugins):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    fake_plugins(fb.FakeEntryPoint("triton", fb.gpu_spec, fb.FakeDist("moe-fake")))
    with pytest.raises(pytest.skip.Exception, match=r"no device of \['cuda'\] is present"):
        conformance.test_conformance_tests_every_class(_request("triton"))
