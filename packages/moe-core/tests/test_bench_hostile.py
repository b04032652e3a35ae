"""`moe bench` (and the helpers `moe run` shares) under bad input, interruption and busy machines:
nothing measured is lost, nothing is measured before the arguments and the output folder are checked,
and the memory estimate covers what a run really uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from _bench_support import bench_args

from moe_core import bench
from moe_core.bench import cli as bench_cli
from moe_core.bench import report, timing
from moe_core.cli import main
from moe_core.presets import get_preset
from moe_core.quant import fp8_w8a8, int4_w4a16, int8_w8a16, unquantized


@pytest.fixture
def nothing_measured(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("measuring started before the arguments were checked")
    monkeypatch.setattr(bench_cli, "measure_ceilings", refuse)
    monkeypatch.setattr(bench_cli, "quick_ceilings", refuse)
    monkeypatch.setattr(bench_cli.ExpertWeights, "random", staticmethod(refuse))


_TINY = ("--preset", "tiny", "--scheme", "bf16", "--no-plot")


def test_the_default_out_is_outside_the_committed_results():
    out = bench_args().out
    assert out == bench.DEFAULT_OUT == "moe-bench-results"
    assert not os.path.isabs(out) and "benchmarks" not in out


@pytest.mark.parametrize("argv", [
    ["--tokens", "-1"], ["--tokens", "0"], ["--repeats", "0"], ["--repeats", "-3"], ["--warmup", "-1"],
    ["--threads", "0"], ["--tokens", "100000"], ["--device", "tpu"], ["--preset", "nope"], ["--scheme", "int9"],
])
def test_bad_arguments_are_errors_before_anything_is_measured(tmp_path, capsys, nothing_measured, argv):
    assert bench.main(bench_args(*_TINY, "--out", str(tmp_path), *argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("moe bench: error: ") and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_through_the_cli(capsys, tmp_path, nothing_measured):
    assert main(["bench", *_TINY, "--out", str(tmp_path), "--repeats", "0"]) == 2
    assert "moe bench: error: --repeats must be >= 1" in capsys.readouterr().err


def _a_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file"


@pytest.mark.parametrize("make_out", [_a_file, lambda tmp: _a_file(tmp) / "out"],
                         ids=["out-is-a-file", "parent-is-a-file"])
def test_an_unusable_out_is_an_error_before_measuring(tmp_path, capsys, nothing_measured, make_out):
    out = make_out(tmp_path)
    assert bench.main(bench_args(*_TINY, "--out", str(out))) == 2
    assert f"--out {str(out)!r} is not a writable folder" in capsys.readouterr().err


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_out_is_an_error_before_measuring(tmp_path, capsys, nothing_measured):
    tmp_path.chmod(0o500)
    try:
        assert bench.main(bench_args(*_TINY, "--out", str(tmp_path / "results"))) == 2
    finally:
        tmp_path.chmod(0o700)
    assert "is not a writable folder" in capsys.readouterr().err


def test_every_point_is_written_as_it_is_measured_and_an_interrupt_keeps_them(tmp_path, capsys, fast,
                                                                               interrupt_at):
    interrupt_at(3)
    code = bench.main(bench_args(*_TINY, "--tokens", "1", "2", "4", "--repeats", "1", "--warmup", "0",
                            "--out", str(tmp_path)))
    assert code == 130
    (result,) = tmp_path.glob("bench-*.json")
    payload = json.loads(result.read_text())
    assert payload["complete"] is False and [r["tokens"] for r in payload["rows"]] == [1, 2]
    assert "2 points measured" in capsys.readouterr().err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left behind


def test_results_name_no_host_and_report_threads_min_median_and_spread(tmp_path, capsys, fast, monkeypatch):
    monkeypatch.setattr(timing, "default_threads", lambda: 1)
    assert bench.main(bench_args(*_TINY, "--tokens", "1", "--repeats", "3", "--warmup", "0", "--out", str(tmp_path))) == 0
    (result,) = tmp_path.glob("bench-*.json")
    text = result.read_text()
    payload = json.loads(text)
    assert "hostname" not in payload["machine"] and os.uname().nodename not in text
    assert payload["complete"] is True and payload["machine"]["torch_threads"] == 1 == torch.get_num_threads()
    (row,) = payload["rows"]
    assert row["min_ms"] <= row["time_ms"] <= row["p90_ms"] and row["spread"] >= 0
    captured = capsys.readouterr()
    # progress on stderr; stdout is the table only
    assert "tiny: bfloat16 weights" in captured.err and "1 tokens: timing" in captured.err
    assert "weights" not in captured.out and "timing" not in captured.out


def test_default_threads_never_exceed_the_cpus_this_process_may_use():
    threads = bench.default_threads()
    assert 1 <= threads <= torch.get_num_threads()
    if hasattr(os, "sched_getaffinity"):
        assert threads <= len(os.sched_getaffinity(0))


def test_an_unsteady_cell_is_flagged(capsys):
    steady, unsteady = bench.summarize_timings([1.0, 1.01, 1.02]), bench.summarize_timings([1.0, 1.0, 1.0, 100.0])
    assert steady.median == 1.01 and steady.min == 1.0 and steady.spread < bench.SPREAD_WARNING
    assert unsteady.p90 == 100.0 and unsteady.spread == pytest.approx(99.0)
    bench.warn_if_unsteady("steady", steady)
    assert capsys.readouterr().err == ""
    bench.warn_if_unsteady("tiny bf16 1 tokens", unsteady)
    assert "warning: tiny bf16 1 tokens: timings spread 9900% above their minimum" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no timing samples"):
        bench.summarize_timings([])


def test_the_mean_call_averages_each_input_sets_median():
    """Samples of sets timed in turn (sample i on set i % sets): a set reading more experts counts once
    per set, not by where it falls among all samples (their median, 1.8 here, is a slow set's time)."""
    fast, slow = [1.0, 1.1, 0.9], [2.0, 2.2, 1.8]
    in_turn = [t for pair in zip(fast, slow, slow, strict=True) for t in pair]  # sets: fast, slow, slow
    assert bench.mean_call_seconds(in_turn, 3) == pytest.approx((1.0 + 2.0 + 2.0) / 3)
    assert bench.mean_call_seconds([3.0, 1.0, 2.0], 1) == 2.0
    with pytest.raises(ValueError, match="2 timing samples cannot cover 3 input sets"):
        bench.mean_call_seconds([1.0, 2.0], 3)


def test_the_plot_title_fits_the_figure():
    pytest.importorskip("matplotlib")
    rows = [bench.Row("tiny", "bf16", m, "cpu", "CpuOneDnnExperts", "unquantized", "unquantized", "S", "wall-clock", m, m, m, 0.0, 1.0, m / 2, "memory", 0.5, 2.0 * m, 2.0,
                      1, 1, 2, "bfloat16", 1.0, 1.0) for m in (1, 8)]
    title = ("AMD EPYC 7B13 64-Core Processor (a long device name), 2 threads, torch 2.9.1+cu128, "
             "2000-01-01T00:00:00+00:00")
    fig = report._figure(rows, title)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box, page = fig._suptitle.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    panel_title = fig.axes[0].title.get_window_extent(renderer)
    assert panel_title.y1 <= box.y0  # laid out below the title, not under it


def test_the_json_is_replaced_atomically(tmp_path):
    path = tmp_path / "r.json"
    bench.write_json_atomic(path, {"a": 1})
    bench.write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2} and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_huge_token_count_counts_in_the_memory_estimate():
    config = get_preset("qwen3-30b-a3b").config
    assert bench.estimate_peak_bytes(config, [int4_w4a16(128)], 8192) > \
        bench.estimate_peak_bytes(config, [int4_w4a16(128)], 1) + 8192 * 8 * 4 * 2048 * 4


def test_the_memory_estimate_covers_mixtral_s_measured_peak():
    """Issue 43: `moe run --preset mixtral-8x7b` peaked at 7.1 GiB (bf16) against an estimate of 5.25."""
    mixtral = get_preset("mixtral-8x7b").config
    assert bench.estimate_peak_bytes(mixtral, [unquantized()], 128) > 7.1 * 2**30


# A layer large enough that its memory dwarfs the allocator's noise (50M parameters), small enough to
# run in seconds; `moe run` on it in a fresh process, after a warm-up run that loads every module.
_MEASURE = textwrap.dedent("""
    import resource, sys
    import torch
    from moe_core.cli import main
    from moe_core.config import MoEConfig, Routing
    from moe_core.presets import PRESETS, Preset

    def peak():  # this process's high-water mark; ru_maxrss would carry the forking parent's over exec
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    def resident():  # now, not the high-water mark: what the process holds before the run
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    config = MoEConfig(num_experts=8, top_k=2, hidden_size=1024, intermediate_size=2048,
                       routing=Routing.softmax_topk(True), dtype=torch.bfloat16)
    PRESETS["probe"] = Preset("probe", config, 128, "a test shape")
    scheme, tokens = sys.argv[1], sys.argv[2]
    assert main(["run", "--preset", "tiny", "--quant", scheme, "--tokens", "1", "--repeats", "1"]) == 0
    before = resident()
    assert main(["run", "--preset", "probe", "--quant", scheme, "--tokens", tokens, "--repeats", "1"]) == 0
    print("PEAK", peak() - before)
""")


@pytest.mark.parametrize(("quant", "scheme"), [
    (unquantized(), "unquantized"), (int4_w4a16(128), "int4:128"), (int8_w8a16(), "int8"),
    (int8_w8a16(128), "int8:128"), (fp8_w8a8("block"), "fp8-block"),
], ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_the_memory_estimate_covers_the_measured_peak_of_moe_run(quant, scheme):
    pytest.importorskip("moe_cpu")
    tokens = 256
    result = subprocess.run([sys.executable, "-c", _MEASURE, scheme, str(tokens)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    measured = int(result.stdout.rsplit("PEAK", 1)[1])
    from moe_core.config import MoEConfig, Routing
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=1024, intermediate_size=2048,
                       routing=Routing.softmax_topk(True), dtype=torch.bfloat16)
    estimate = bench.estimate_peak_bytes(config, [quant], tokens)
    assert measured <= estimate, f"{scheme}: measured peak {measured / 2**20:.0f} MiB > estimate {estimate / 2**20:.0f}"
    assert estimate < 4 * measured, f"{scheme}: estimate {estimate / 2**20:.0f} MiB is far above the measured peak"
