"""The `moe` CLI under bad input: every expected user error is `moe CMD: error: ...` with exit 2, never
a traceback, and arguments are checked before any weight is built."""

from __future__ import annotations

import json

import pytest
import torch

from moe_core import cli
from moe_core.cli import main
from moe_core.config import MoEConfig, Routing
from moe_core.layer import FusedMoE
from moe_core.quant import (
    FP8_DYNAMIC_TENSOR,
    FP8_DYNAMIC_TOKEN,
    FP8_TENSOR_WEIGHT,
    Granularity,
    fp8_w8a8,
    int4_w4a16,
    int8_w8a16,
    parse_scheme,
)
from moe_core.weights import ExpertWeights


def _error(capsys, command: str) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    prefix = f"moe {command}: error: "
    assert captured.err.startswith(prefix), captured.err
    return captured.err.removeprefix(prefix)


def test_an_unknown_device_is_an_error_naming_the_accepted_ones(capsys):
    assert main(["explain", "--preset", "tiny", "--device", "tpu"]) == 2
    message = _error(capsys, "explain")
    assert "device 'tpu' is not supported" in message and "expected cpu, cuda" in message and "xpu" in message


@pytest.mark.parametrize(("make", "expected"), [
    (lambda tmp: tmp / "missing.json", "missing.json: no such file"),
    (lambda tmp: tmp, "the folder has no config.json"),
    (lambda tmp: _write(tmp / "config.json", "{not json"), "config.json is not valid JSON"),
    (lambda tmp: _write(tmp / "config.json", "[1, 2]"), "config.json holds no JSON object"),
    (lambda tmp: _write(tmp / "config.json", "3"), "config.json holds no JSON object"),
], ids=["missing-file", "folder-without-config", "invalid-json", "json-list", "json-number"])
def test_config_errors_name_the_file(tmp_path, capsys, make, expected):
    path = make(tmp_path)
    assert main(["explain", "--config", str(path), "--device", "cpu"]) == 2
    message = _error(capsys, "explain")
    assert message.startswith(f"--config {path}") and expected in message


def _write(path, text):
    path.write_text(text)
    return path


@pytest.fixture
def no_weights_built(monkeypatch):
    """Fail the test if any weight is drawn: argument errors must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("weights were built before the arguments were checked")
    monkeypatch.setattr(ExpertWeights, "random", staticmethod(refuse))


@pytest.mark.parametrize(("argv", "expected"), [
    (["--tokens", "-1"], "--tokens must be >= 1, got [-1]"),
    (["--tokens", "4", "0"], "--tokens must be >= 1, got [0]"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--repeats", "-3"], "--repeats must be >= 1"),
    (["--threads", "0"], "--threads must be between 1 and"),
    (["--threads", "100000"], "--threads must be between 1 and"),  # torch.set_num_threads crashed on it
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--tokens", "100000"], "exceed the layer's max_num_tokens (8192)"),
    (["--device", "tpu"], "device 'tpu' is not supported"),
    (["--quant", "int4:100"], "group size 100"),
])
def test_run_checks_every_argument_before_building_weights(capsys, no_weights_built, argv, expected):
    assert main(["run", "--preset", "tiny", *argv]) == 2
    assert expected in _error(capsys, "run")


def test_run_refuses_a_layer_larger_than_memory_before_building_weights(capsys, no_weights_built, monkeypatch):
    monkeypatch.setattr(cli, "available_memory_bytes", lambda device: 1 << 20)
    assert main(["run", "--preset", "tiny", "--tokens", "1"]) == 2
    assert "needs about" in _error(capsys, "run")


def test_explain_json_prints_the_refusal_as_json_with_the_candidate_rows(capsys):
    # no CPU class takes int4 groups of 7: every candidate refuses
    assert main(["explain", "--preset", "tiny", "--device", "cpu", "--quant", "int4:7", "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["error"]["kind"] == "NoBackendError" and "no backend can serve" in report["error"]["message"]
    rows = {r["experts"]: r for r in report["candidates"]}
    assert rows["CpuInt4Experts"]["reason"] == "does not support group size 7 (supported: {128, 256, 32, 64})"
    assert not any(r["ok"] or r["chosen"] for r in rows.values())


def test_explain_json_refusal_of_a_forced_backend(capsys):
    # an installed backend that cannot serve the layer here (no GPU): the CPU rows say they could
    assert main(["explain", "--preset", "tiny", "--device", "cpu", "--backend", "triton", "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["error"]["kind"] == "BackendUnavailableError"
    rows = report["candidates"]
    assert rows and {"backend", "experts", "ok", "reason", "chosen"} <= set(rows[0])
    assert not any(r["chosen"] for r in rows)
    assert any(r["backend"] == "cpu" and r["ok"] for r in rows)
    assert any(r["backend"] == "reference" and not r["ok"] for r in rows)


def test_explain_json_with_a_bad_scheme_still_prints_json(capsys):
    assert main(["explain", "--preset", "tiny", "--quant", "int9", "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["error"] == {"kind": "ValueError", "message": report["error"]["message"]}
    assert "unknown quantization scheme 'int9'" in report["error"]["message"] and report["candidates"] == []


def test_int8_means_per_channel_in_the_cli_and_in_python():
    args = cli.build_parser({}).parse_args(["run", "--preset", "tiny", "--quant", "int8"])
    _, quant, _ = cli._layer_from_args(args)
    assert quant == int8_w8a16() == parse_scheme("int8")
    assert quant.weight.scale.granularity is Granularity.CHANNEL
    grouped = cli.build_parser({}).parse_args(["run", "--preset", "tiny", "--quant", "int8:64"])
    assert cli._layer_from_args(grouped)[1] == int8_w8a16(64)
    # int4 without a group size takes the preset's (tiny: 64), as documented
    int4 = cli.build_parser({}).parse_args(["run", "--preset", "tiny", "--quant", "int4"])
    assert cli._layer_from_args(int4)[1] == int4_w4a16(64)


def test_run_help_says_what_int8_and_fp8_mean(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "int8 is per channel (int8_w8a16())" in text and "scaled per token" in text


def test_fp8_schemes_scale_activations_per_token_unless_told():
    assert parse_scheme("fp8-tensor") == fp8_w8a8("tensor") == fp8_w8a8()
    assert fp8_w8a8().weight == FP8_TENSOR_WEIGHT and fp8_w8a8().activation == FP8_DYNAMIC_TOKEN
    assert parse_scheme("fp8-tensor:tensor").activation == FP8_DYNAMIC_TENSOR
    assert parse_scheme("fp8-channel:token") == fp8_w8a8("channel")
    with pytest.raises(ValueError, match="expected fp8-tensor:token or fp8-tensor:tensor"):
        parse_scheme("fp8-tensor:row")
    with pytest.raises(ValueError, match="activation_scales='row' is invalid"):
        fp8_w8a8(activation_scales="row")


def _fp8_layer(quant):
    config = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64,
                       routing=Routing.softmax_topk(True), dtype=torch.bfloat16)
    layer = FusedMoE(config, quant, "cpu")
    layer.load_weights(ExpertWeights.random(config, quant, seed=3))
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 128, generator=gen).to(torch.bfloat16)
    logits = torch.randn(6, 4, generator=gen)
    return layer, x, logits


@pytest.mark.parametrize("outlier", [float("inf"), 3e4], ids=["inf", "large"])
def test_default_fp8_keeps_an_outlier_token_from_changing_the_others(outlier):
    layer, x, logits = _fp8_layer(fp8_w8a8())
    assert layer.plan.experts_cls.name() == "CpuFp8EmulatedExperts"
    clean = layer(x, logits)
    x_outlier = x.clone()
    x_outlier[0] = outlier
    assert torch.equal(layer(x_outlier, logits)[1:], clean[1:])


def test_per_tensor_fp8_activations_let_one_inf_spoil_other_tokens():
    """The documented cost of activation_scales='tensor' (what some checkpoints demand): the CPU class
    scales each expert's rows together, so every token sharing an expert with the Inf turns NaN."""
    layer, x, logits = _fp8_layer(fp8_w8a8(activation_scales="tensor"))
    x[0] = float("inf")
    assert torch.isnan(layer(x, logits)[1:]).any()


def test_run_reports_min_and_median_and_the_thread_count(capsys):
    assert main(["run", "--preset", "tiny", "--backend", "reference", "--tokens", "2", "--repeats", "2",
                 "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert torch.get_num_threads() == 1
    assert "threads: 1 (--threads)" in captured.out
    header = next(line for line in captured.out.splitlines() if line.strip().startswith("tokens"))
    assert "median" in header and "min" in header
    # progress goes to stderr, so stdout holds only the report
    assert "preparing weights" in captured.err and "converting the weights" in captured.err
    assert "preparing weights" not in captured.out


def test_run_flags_a_nan_output_as_such(capsys, monkeypatch):
    monkeypatch.setattr(FusedMoE, "forward", lambda self, x, logits: torch.full_like(x, float("nan")))
    assert main(["run", "--preset", "tiny", "--backend", "reference", "--tokens", "1", "--repeats", "1"]) == 1
    assert "FAILED (NaN or Inf in the output)" in capsys.readouterr().out


def test_duplicate_token_counts_run_once(capsys):
    assert main(["run", "--preset", "tiny", "--backend", "reference", "--tokens", "2", "2", "--repeats", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["2"]]
    assert len(rows) == 1


@pytest.mark.parametrize(("raised", "code", "expected"), [
    (KeyboardInterrupt(), 130, "moe doctor: interrupted"),
    (PermissionError(13, "Permission denied", "/root/x.json"), 2, "moe doctor: error: Permission denied: /root/x.json"),
    (BrokenPipeError(), 141, ""),
])
def test_interrupts_and_os_errors_end_with_a_message_not_a_traceback(capsys, monkeypatch, raised, code, expected):
    def fail(args):
        raise raised
    monkeypatch.setattr(cli, "cmd_doctor", fail)
    assert main(["doctor"]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and expected in err
