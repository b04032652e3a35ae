"""FusedMoE input checking and weight reloading, and the CLI commands that need only moe-core."""

from __future__ import annotations

import json

import pytest
import torch

import _fake_backends as fb
from moe_core import ExpertWeights, FusedMoE, MoEConfig, Routing, int4_w4a16, reference_moe, route_torch
from moe_core.backends import Platform
from moe_core.cli import main

CFG = MoEConfig(8, 2, 64, 32, max_num_tokens=16)


def _layer(cfg=CFG, quant=None, seed=0):
    layer = FusedMoE(cfg, quant, "cpu", prefer="reference")
    weights = ExpertWeights.random(cfg, layer.quant, seed=seed)
    bias = torch.randn(cfg.num_experts) if cfg.routing.has_correction_bias else None
    layer.load_weights(weights, correction_bias=bias)
    return layer, weights


def test_forward_matches_reference_and_reload_is_stable():
    layer, weights = _layer(quant=int4_w4a16(32))
    x, logits = torch.randn(5, 64).bfloat16(), torch.randn(5, 8)
    out = layer(x, logits)
    tw, ids = route_torch(logits, CFG.routing, 2)
    ref = reference_moe(x, weights, CFG, tw, ids, layer.quant)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
    layer.load_weights(weights)
    assert torch.equal(layer(x, logits), out)
    other, _ = _layer(quant=int4_w4a16(32), seed=1)
    assert not torch.equal(other(x, logits), out) and torch.equal(layer(x, logits), out)


@pytest.mark.parametrize("x, logits, match", [
    (torch.randn(3, 63).bfloat16(), torch.randn(3, 8), r"hidden_states must be \[M, 64\], got \[3, 63\]"),
    (torch.randn(3, 64).bfloat16(), torch.randn(3, 7), r"router_logits must be \[3, 8\]"),
    (torch.randn(3, 64), torch.randn(3, 8), "hidden_states dtype torch.float32 differs from the layer dtype"),
    (torch.randn(3, 64).bfloat16(), torch.randint(0, 3, (3, 8)), "router_logits must be floating point"),
    (torch.randn(17, 64).bfloat16(), torch.randn(17, 8), "17 tokens exceed MoEConfig.max_num_tokens=16"),
])
def test_forward_input_errors(x, logits, match):
    layer, _ = _layer()
    with pytest.raises(ValueError, match=match):
        layer(x, logits)


def test_empty_batch_and_correction_bias_errors():
    layer, _ = _layer()
    assert layer(torch.randn(0, 64).bfloat16(), torch.randn(0, 8)).shape == (0, 64)
    ds = MoEConfig(8, 2, 64, 32, routing=Routing.deepseek_v3(4, 2))
    ds_layer = FusedMoE(ds, None, "cpu", prefer="reference")
    w = ExpertWeights.random(ds, ds_layer.quant)
    with pytest.raises(ValueError, match=r"pass correction_bias of shape \[8\], got None"):
        ds_layer.load_weights(w)
    with pytest.raises(ValueError, match="correction_bias was given but"):
        layer.load_weights(w, correction_bias=torch.zeros(8))


def test_doctor_json(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["core"]["version"] and report["devices"][0]["platform"] == "cpu"
    # The workspace installs moe-cpu and moe-triton: doctor must list both, with their distributions.
    plugins = {p["name"]: p for p in report["plugins"]}
    assert {"cpu", "triton"} <= set(plugins)
    assert plugins["cpu"]["state"] == "ready" and plugins["cpu"]["backends"] == ["cpu"]
    assert {"moe-core", "moe-cpu", "moe-triton"} <= set(report["distributions"])


def test_doctor_require_missing_device(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert main(["doctor", "--require", "cuda"]) == 1
    assert "require cuda: FAILED: no cuda device is visible to torch" in capsys.readouterr().out


def test_explain_with_missing_forced_backend(capsys, monkeypatch):
    monkeypatch.setenv("MOE_BACKEND", "no_such_kernel")
    assert main(["explain", "--preset", "qwen3-30b-a3b", "--quant", "int4", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "MOE_BACKEND='no_such_kernel' names no installed backend; installed: " in err
    assert all(name in err for name in ("cpu", "reference", "triton"))


def test_explain_hf_config(tmp_path, capsys):
    cfg = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_experts": 128, "num_experts_per_tok": 8,
           "moe_intermediate_size": 768, "norm_topk_prob": True, "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
                                   "sym": True}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["explain", "--config", str(tmp_path), "--device", "cpu", "--backend", "reference", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["quant"] == "int4_w4a16_g128" and plan["config"].startswith("E=128 top-8 K=2048 N=768")


def test_run_tiny_on_the_reference(capsys):
    assert main(["run", "--preset", "tiny", "--backend", "reference", "--tokens", "1", "4", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "reference / ReferenceExperts" in out and out.count(" ok") >= 2


def test_hf_quant_config_uses_the_readers_parsers():
    from moe_core.hf_config import UnsupportedModelError, quant_from_hf
    from moe_core.quant import Granularity

    # desc_act with one group per row cannot reorder anything: the GPTQ reader loads it as plain per-channel.
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": True, "sym": True}
    key = quant_from_hf({"quantization_config": gptq}).weight
    assert key.scale.granularity is Granularity.CHANNEL and not key.act_order and key.scale.dtype == "fp16"
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}
    assert quant_from_hf({"quantization_config": awq}).name == "int4_w4a16_g128_zp"
    with pytest.raises(UnsupportedModelError, match="per-tensor scales"):
        quant_from_hf({"quantization_config": {"quant_method": "fp8"}})


def _plugin_with_commands(*commands):
    from moe_core.plugins import BackendSpec

    return BackendSpec("cmds", (1, 1), (Platform.CPU,), (), commands=commands)


def _record_argv(argv):
    _record_argv.seen = argv
    return 7


def test_plugins_contribute_subcommands(capsys, monkeypatch):
    """`moe NAME ...` runs the plugin's function with the rest of argv; `moe --help` lists it."""
    from moe_core import plugins
    from moe_core.plugins import CommandRef

    ep = fb.FakeEntryPoint("cmds", _plugin_with_commands(
        CommandRef("frobnicate", "test_layer_and_cli:_record_argv", "frobnicate the kernels")), fb.FakeDist("moe-frob"))
    plugins.registry(fb.entry_points(ep))
    try:
        assert main(["frobnicate", "--x", "1"]) == 7 and _record_argv.seen == ["--x", "1"]
        with pytest.raises(SystemExit):
            main(["--help"])
        assert "frobnicate the kernels (from moe-frob)" in capsys.readouterr().out
    finally:
        plugins.reset_registry()


@pytest.mark.parametrize("clash", ["two plugins", "a core command"])
def test_a_subcommand_claimed_twice_is_an_error(capsys, clash):
    from moe_core import plugins
    from moe_core.plugins import CommandRef

    name = "run" if clash == "a core command" else "tune"
    eps = [fb.FakeEntryPoint("cmds", _plugin_with_commands(CommandRef(name, "m:f", "")), fb.FakeDist("moe-a"))]
    if clash == "two plugins":
        spec = _plugin_with_commands(CommandRef(name, "m:g", ""))
        eps.append(fb.FakeEntryPoint("cmds2", type(spec)("cmds2", spec.api_version, spec.platforms, (),
                                                         commands=spec.commands), fb.FakeDist("moe-b")))
    plugins.registry(fb.entry_points(*eps))
    try:
        assert main(["doctor"]) == 2
        err = capsys.readouterr().err
        assert (f"both contribute `moe {name}`" in err) if clash == "two plugins" else "is a moe-core command" in err
    finally:
        plugins.reset_registry()


def test_tune_is_moe_triton_s_subcommand():
    from moe_core import plugins

    plugins.reset_registry()
    status, ref = plugins.registry().commands()["tune"]
    assert status.distribution == "moe-triton" and ref.path == "moe_triton.tune:main"


def test_a_call_too_large_for_memory_is_refused_before_allocating(monkeypatch):
    """max_num_tokens admits the call, but its intermediates cannot fit: a MemoryError naming the sizes,
    not an out-of-memory kill."""
    from moe_core import layer as layer_module

    big = MoEConfig(8, 2, 64, 32, max_num_tokens=10**7)
    layer = FusedMoE(big, None, "cpu", prefer="reference")
    layer.load_weights(ExpertWeights.random(big, layer.quant))
    monkeypatch.setattr(layer_module, "available_memory_bytes", lambda device: 64 << 20)
    M = 2 * 10**6  # about 3.3 GiB of fp32 intermediates
    x, logits = torch.zeros(M, 64, dtype=torch.bfloat16), torch.zeros(M, 8)
    with pytest.raises(MemoryError, match=r"2000000 tokens need about 3\.3 GiB .* 0\.1 GiB is available on cpu"):
        layer(x, logits)
    small = torch.randn(3, 64).bfloat16(), torch.randn(3, 8)  # small calls never query memory
    assert layer(*small).shape == (3, 64)
