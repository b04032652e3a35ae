"""The `moe` CLI speaks one vocabulary and stays readable (issue 58): the unquantized scheme has one set
of names and --quant/--scheme are one flag everywhere, explain defaults to run's preset, integer options
out of range name the option, candidate and doctor tables group absent devices and keep lines short
(the JSON keeps everything), and long steps say something at least every few seconds."""

from __future__ import annotations

import json
import time

import pytest
import torch

from moe_core import cli
from moe_core._progress import Heartbeat
from moe_core.cli import main
from moe_core.oracle import TEXT_WIDTH, Candidate, format_candidates
from moe_core.quant import parse_scheme, unquantized


def _error(capsys, command: str) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert captured.err.startswith(f"moe {command}: error: "), captured.err
    return captured.err.removeprefix(f"moe {command}: error: ")


def _explain_json(capsys, *argv: str) -> dict:
    assert main(["explain", "--device", "cpu", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["unquantized", "bf16", "fp16", "none"])
@pytest.mark.parametrize("flag", ["--quant", "--scheme"])
def test_every_name_of_the_unquantized_scheme_is_accepted_by_either_flag(capsys, name, flag):
    """Before: explain refused bf16 ("unknown quantization scheme 'bf16'") while bench took it."""
    assert parse_scheme(name) == unquantized()
    assert _explain_json(capsys, "--preset", "tiny", flag, name)["quant"] == "unquantized"


def test_the_scheme_flag_takes_every_scheme():
    args = cli.build_parser({}).parse_args(["run", "--scheme", "int8:64:zp"])
    assert args.quant == "int8:64:zp"


def test_explain_defaults_to_the_preset_run_uses(capsys):
    """Before: "give --preset NAME or --config PATH"."""
    assert _explain_json(capsys)["model"] == "qwen3-30b-a3b"
    assert cli.build_parser({}).parse_args(["run"]).preset == "qwen3-30b-a3b"


@pytest.mark.parametrize("seed", ["99999999999999999999", str(2**63 - 1), "-1"])
def test_a_seed_out_of_range_names_the_option(capsys, seed):
    """Before: "Overflow when unpacking long long" from inside torch, after the layer was built."""
    assert main(["run", "--preset", "tiny", "--seed", seed]) == 2
    assert f"--seed must be >= 0 and <= {2**63 - 2} (torch seeds are 64-bit), got {seed}" in _error(capsys, "run")


def test_explain_tokens_beyond_the_layer_are_refused(capsys):
    assert main(["explain", "--preset", "tiny", "--device", "cpu", "--tokens", "99999999999999999999"]) == 2
    assert "--tokens must be in [1, 8192] (the layer's max_num_tokens), got 99999999999999999999" in _error(
        capsys, "explain")


def _absent(backend: str, experts: str, plugin: str, source: str, why: str) -> Candidate:
    return Candidate(backend, experts, source, False, f"plugin {plugin} is device_absent: {why}")


def test_absent_devices_take_one_line_per_plugin_and_long_reasons_wrap():
    long_reason = "does not support " + "; ".join(f"reason number {i} of many" for i in range(20))
    candidates = [
        Candidate("cpu", "CpuOneDnnExperts", "moe-cpu", True, "", chosen=True),
        Candidate("cpu", "CpuInt4Experts", "moe-cpu", False, long_reason),
        *(_absent("triton", f"Triton{i}Experts", "triton", "moe-triton", "torch sees no CUDA device") for i in range(4)),
        _absent("marlin", "MarlinExperts", "cuda", "moe-cuda", "torch sees no NVIDIA CUDA device"),
        _absent("torch_grouped_mm", "TorchGroupedMmExperts", "cuda", "moe-cuda", "torch sees no NVIDIA CUDA device"),
    ]
    lines = format_candidates(candidates).splitlines()
    assert max(map(len, lines)) <= TEXT_WIDTH
    assert sum("device_absent" in line for line in lines) == 0
    assert [line.strip() for line in lines[-2:]] == [
        "triton (moe-triton, plugin triton, 4 classes): torch sees no CUDA device",
        "marlin, torch_grouped_mm (moe-cuda, plugin cuda, 2 classes): torch sees no NVIDIA CUDA device"]
    # the long reason wraps under its column, every word kept
    assert " ".join(" ".join(lines[2:-3]).split()).endswith(long_reason)


def test_explain_text_is_short_and_its_json_keeps_every_candidate(capsys):
    assert main(["explain", "--preset", "tiny", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    report = _explain_json(capsys, "--preset", "tiny")
    assert max(len(line) for line in text.splitlines()) <= TEXT_WIDTH
    absent = [c for c in report["candidates"] if "is device_absent: " in c["reason"]]
    if not torch.cuda.is_available():
        assert absent and sum(c["experts"] in text for c in absent) == 0  # grouped: no row per class


def test_no_candidate_claims_a_validation_doctor_denies(capsys):
    """Before: FlashInferCutlassMxfp4Experts' row ended "validated here: its CUTLASS bf16/fp8 MoE, on an
    H100" (the plugin's sentence, on every class) while doctor said it was NOT validated."""
    report = _explain_json(capsys, "--preset", "tiny")
    assert main(["doctor", "--json"]) == 0
    validated = {e["experts"]: e["validated_on"] for e in json.loads(capsys.readouterr().out)["experts"]}
    for c in report["candidates"]:
        if "validated" in c["reason"]:
            assert validated.get(c["experts"]), c


def test_doctor_text_cuts_long_notes_and_its_json_keeps_them(capsys):
    """Before: doctor printed lines of up to 1,549 characters."""
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # the plugin table's fixed columns can be wide; its last column wraps at 40 characters at least
    assert max(len(line) for line in text.splitlines()) <= TEXT_WIDTH + 40
    longest = max(report["experts"], key=lambda e: len("; ".join(e["limitations"])))
    notes = "; ".join(longest["limitations"])
    if len(notes) < 3 * TEXT_WIDTH:
        pytest.skip("no installed experts class has notes long enough to be cut")
    assert notes not in " ".join(text.split()) and longest["experts"] in text


def test_heartbeat_speaks_at_least_every_interval_while_a_step_is_silent():
    lines: list[str] = []
    with Heartbeat("converting", lines.append, interval=0.1) as progress:
        time.sleep(0.45)  # reports nothing
        progress(1, 4)
        time.sleep(0.25)
    assert lines[0] == "converting ..." and lines[-1].startswith("converting: done in ")
    texts = [line.split(" (")[0] for line in lines[1:-1]]
    first = texts.index("converting: 1/4")  # a reported step is told at once
    assert texts[:first] == ["converting: still working"] * first and first >= 3
    assert "converting: 1/4, working" in texts[first + 1:]  # and again while it stalls


def test_a_failing_step_does_not_claim_it_is_done():
    lines: list[str] = []
    with pytest.raises(RuntimeError), Heartbeat("drawing", lines.append, interval=60):
        raise RuntimeError("boom")
    assert lines == ["drawing ..."]


def test_tune_accepts_the_cli_names_of_the_unquantized_scheme_and_dtypes(monkeypatch, capsys):
    tune = pytest.importorskip("moe_triton.tune")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # stop right after the arguments parse
    for argv in (["--quant", "bf16"], ["--scheme", "unquantized"], ["--quant", "none", "--dtype", "bf16"],
                 ["--dtype", "fp16"]):
        assert tune.main(argv) == 2
        assert "torch sees no GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tune.main(["--quant", "int9"])
    assert "invalid choice: 'int9'" in capsys.readouterr().err
