"""Discovery, the probe, AITER detection, the capability per architecture and its refusals, on fake ROCm devices."""

from __future__ import annotations

import pytest
import torch

from moe_core import (
    Activation,
    DeviceInfo,
    MoEConfig,
    ParallelConfig,
    Platform,
    Routing,
    fp8_w8a8,
    unquantized,
)
from moe_core.config import ExpertPlacement
from moe_core.plugins import PluginState, registry
from moe_core.quant import FP8_CHANNEL_WEIGHT, FP8_DYNAMIC_GROUP128, MoEQuantConfig, QuantFamily, int4_w4a16
from moe_core.testing.conformance import SCENARIOS
from moe_core.weights import PackedWeights
from moe_rocm._plugin import backend_spec
from moe_rocm._probe import probe
from moe_rocm.aiter_api import aiter_installation
from moe_rocm.experts import AiterExperts, fused_moe_arguments

MI300X = DeviceInfo(Platform.ROCM, 0, "AMD Instinct MI300X", (9, 4))
MI355X = DeviceInfo(Platform.ROCM, 0, "AMD Instinct MI355X", (9, 5))


def _config(dtype=torch.bfloat16, activation=None, routing=None, top_k=2, bias=False, parallel=None,
            N=128) -> MoEConfig:
    return MoEConfig(8, top_k, 256, N, activation=activation or Activation.silu(),
                     routing=routing or Routing.softmax_topk(True), dtype=dtype, has_bias=bias,
                     parallel=parallel or ParallelConfig())


@pytest.fixture
def amd_aiter(tmp_path, monkeypatch):
    """An importable package shaped like AMD's AITER (never imported: detection reads the files)."""
    package = tmp_path / "aiter"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('AITER must not be imported by capability checks')\n")
    (package / "fused_moe.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))


# ---- discovery and probe --------------------------------------------------------------------


def test_spec_declares_one_rocm_backend_ahead_of_triton():
    spec = backend_spec()
    assert spec.name == "aiter" and spec.platforms == (Platform.ROCM,)
    assert [r.path for r in spec.experts] == ["moe_rocm.experts:AiterExperts"]
    assert [(p.backend, p.platform, p.rank) for p in spec.priorities] == [("aiter", Platform.ROCM, 100)]
    for family in QuantFamily:
        assert registry().rank("aiter", Platform.ROCM, family) == 100
        assert registry().rank("aiter", Platform.CUDA, family) == 0


@pytest.mark.skipif(torch.version.hip is not None and torch.cuda.is_available(), reason="a ROCm GPU is present")
def test_plugin_is_device_absent_without_a_rocm_gpu():
    assert not probe()
    status = registry().statuses["aiter"]
    assert status.state is PluginState.DEVICE_ABSENT and status.distribution == "moe-rocm"
    assert status.reason == probe().reason
    assert registry().resolve(backend_spec().experts[0]) is AiterExperts


# ---- AITER detection ------------------------------------------------------------------------


def test_missing_aiter_is_the_capability_refusal():
    if aiter_installation():
        pytest.skip("an AMD AITER is installed here")
    reason = AiterExperts.supports(_config(), unquantized(), MI355X).reason
    assert reason == "needs the Python package 'aiter', which is not installed"
    assert "git clone --recursive https://github.com/ROCm/aiter" in aiter_installation().reason


def test_pypi_aiter_is_not_taken_for_amd_aiter(tmp_path, monkeypatch):
    (tmp_path / "aiter.py").write_text("")  # PyPI's aiter (asynchronous iterators) is one module
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = AiterExperts.supports(_config(), unquantized(), MI355X).reason
    assert "is not AMD's AITER (no aiter/fused_moe.py)" in reason and "amd-aiter" in reason


def test_amd_aiter_is_found_without_importing_it(amd_aiter):
    assert aiter_installation()
    assert AiterExperts.supports(_config(), unquantized(), MI300X)


# ---- the capability per architecture --------------------------------------------------------


@pytest.mark.parametrize("device", [MI300X, MI355X], ids=lambda d: d.name)
@pytest.mark.parametrize("config", [
    _config(), _config(torch.float16), _config(activation=Activation.gelu()),
    _config(parallel=ParallelConfig(ep_size=3, ep_rank=1)), _config(routing=Routing.llama4(), top_k=1),
    _config(routing=Routing.deepseek_v3(4, 2, 2.5)),
], ids=["bf16", "fp16", "gelu", "expert-parallel", "llama4", "deepseek-routing"])
def test_unquantized_is_served_on_both_architectures(amd_aiter, device, config):
    assert AiterExperts.supports(config, unquantized(), device)


@pytest.mark.parametrize("granularity", ["channel", "block"])
def test_fp8_is_served_on_gfx950_only(amd_aiter, granularity):
    assert AiterExperts.supports(_config(), fp8_w8a8(granularity), MI355X)
    refusal = AiterExperts.supports(_config(), fp8_w8a8(granularity), MI300X)
    assert not refusal and refusal.reason.startswith("fp8 on gfx942: AITER quantizes activations to "
                                                     "torch.float8_e4m3fnuz (max 240)")


@pytest.mark.parametrize(("config", "quant", "device", "reason"), [
    (_config(torch.float32), unquantized(), MI355X, "activation dtype torch.float32"),
    (_config(activation=Activation.gelu_tanh()), unquantized(), MI355X, "activation gelu_tanh"),
    (_config(activation=Activation.swiglu_oai()), unquantized(), MI355X, "activation swiglu_oai"),
    (_config(activation=Activation.relu2()), unquantized(), MI355X, "activation relu2"),
    (_config(bias=True), unquantized(), MI355X, "expert biases"),
    (_config(N=112), unquantized(), MI355X, "intermediate size 112 (must be a multiple of 32)"),
    (_config(), int4_w4a16(128), MI355X, "does not support int4 weights (supports: unquantized, fp8e4m3)"),
    (_config(), fp8_w8a8("tensor"), MI355X, "per-tensor fp8: AITER's dynamic activation scale is one amax"),
    (_config(), MoEQuantConfig(FP8_CHANNEL_WEIGHT, FP8_DYNAMIC_GROUP128), MI355X,
     "channel fp8 weights with group activation scales (AITER pairs them with token scales)"),
    (_config(N=160), fp8_w8a8("block"), MI355X, "block fp8 needs K and N multiples of 128 (K=256, N=160)"),
    (_config(routing=Routing.llama4(), top_k=1), fp8_w8a8("channel"), MI355X, "fp8 with the router weight on"),
    (_config(), unquantized(), DeviceInfo(Platform.ROCM, 0, "AMD Instinct MI250X", (9, 0)), "(9, 4)"),
    (_config(), unquantized(), DeviceInfo(Platform.ROCM, 0, "AMD Radeon PRO W7900", (11, 0)), "<= (9, 5)"),
    (_config(), unquantized(), DeviceInfo(Platform.ROCM, 0, "AMD GPU"), "architecture is unknown"),
    (_config(), unquantized(), DeviceInfo(Platform.CUDA, 0, "NVIDIA H100", (9, 0)), "runs on {rocm}, not cuda"),
])
def test_refusals_say_why(amd_aiter, config, quant, device, reason):
    support = AiterExperts.supports(config, quant, device)
    assert not support and reason in support.reason, support.reason


@pytest.mark.parametrize("device", [MI300X, MI355X], ids=lambda d: d.name)
def test_each_architecture_meets_conformance_scenarios(amd_aiter, device):
    """What moe-core's conformance suite asks on a real ROCm machine: the class serves some of its scenarios."""
    served = {name for name, config, quant in SCENARIOS if AiterExperts.supports(config, quant, device)}
    expected = {"bf16-silu", "fp16-gelu", "bf16-deepseek-routing", "bf16-llama4-routing", "bf16-expert-parallel"}
    if device is MI355X:
        expected |= {"fp8-channel", "fp8-block128"}
    assert served == expected


# ---- the call -------------------------------------------------------------------------------


def test_bad_inputs_are_refused_before_the_kernel():
    cfg = _config()
    experts = AiterExperts(cfg, unquantized(), MI355X)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    w = torch.full((3, 2), 0.5)
    with pytest.raises(ValueError, match=r"hidden_states must be on the ROCm device, got cpu"):
        experts.apply(torch.zeros(3, 256, dtype=torch.bfloat16), w, ids)
    with pytest.raises(ValueError, match=r"hidden_states must be \[M, 256\], got \[3, 128\]"):
        experts.apply(torch.zeros(3, 128, dtype=torch.bfloat16), w, ids)
    with pytest.raises(ValueError, match=r"dtype torch.float16 differs from the layer dtype torch.bfloat16"):
        experts.apply(torch.zeros(3, 256, dtype=torch.float16), w, ids)


def test_expert_parallel_layers_pass_a_mask_of_their_own_experts():
    cfg = _config(parallel=ParallelConfig(ep_size=3, ep_rank=1))
    experts = AiterExperts(cfg, unquantized(), DeviceInfo(Platform.CPU))
    assert experts.expert_mask.dtype == torch.int32
    assert experts.expert_mask.tolist() == [0, 0, 0, 1, 1, 1, 0, 0]  # rank 1 of 3 owns experts 3..5 of 8


def test_arguments_refuse_another_layout():
    with pytest.raises(ValueError, match=r"expected weights in layout 'aiter.shuffle16x16', got 'cpu.dense'"):
        fused_moe_arguments(PackedWeights("cpu.dense", {}), _config(), unquantized(), None)


def test_placements_the_mask_cannot_express_are_refused(amd_aiter):
    placement = ExpertPlacement(8, ((5, 4), (0, 1, 2, 3), (6, 7)))  # rank 0 holds expert 5, then expert 4
    unordered = _config(parallel=ParallelConfig(ep_size=3, ep_rank=0, placement=placement))
    refusal = AiterExperts.supports(unordered, unquantized(), MI355X)
    assert not refusal and "not in increasing global order" in refusal.reason
    ordered = _config(parallel=ParallelConfig(ep_size=3, ep_rank=2, placement=placement))
    assert AiterExperts.supports(ordered, unquantized(), MI355X)
