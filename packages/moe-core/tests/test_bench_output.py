"""What `moe bench` writes and shows: a results file of its own per run, a ranking only from backends
timed side by side, the table after the progress, and the cells whose numbers cannot be trusted."""

from __future__ import annotations

import datetime
import io
import json
import sys
import threading
import types

import pytest
import torch
from _bench_support import bench_args

from moe_core import bench
from moe_core.bench import cli as bench_cli
from moe_core.bench.results import claim_results_path

_TINY = ("--preset", "tiny", "--tokens", "1", "2", "--repeats", "1", "--warmup", "0", "--no-plot")


def test_a_results_file_is_claimed_exclusively(tmp_path):
    paths = [claim_results_path(tmp_path, "bench-x") for _ in range(3)]
    assert [p.name for p in paths] == ["bench-x.json", "bench-x-2.json", "bench-x-3.json"]
    assert all(p.exists() for p in paths)


def test_runs_started_in_the_same_second_keep_their_results_and_rankings(tmp_path, fast, monkeypatch):
    """Issue 58: two runs into one folder in the same second wrote one results file, and the later
    run's ranking replaced the earlier's scheme."""
    frozen = datetime.datetime(2026, 11, 28, 12, 0, 0, tzinfo=datetime.UTC)
    clock = types.SimpleNamespace(datetime=types.SimpleNamespace(now=lambda tz: frozen), UTC=datetime.UTC)
    monkeypatch.setattr(bench_cli, "datetime", clock)
    for scheme in ("bf16", "int4"):
        assert bench.main(bench_args(*_TINY, "--scheme", scheme, "--backends", "all", "--out", str(tmp_path))) == 0
    results = list(tmp_path.glob("bench-*.json"))
    assert sorted(p.name.split("20261128T120000Z")[1] for p in results) == ["-2.json", ".json"]
    assert sorted(json.loads(p.read_text())["rows"][0]["scheme"] for p in results) == ["bf16", "int4"]
    (ranking,) = tmp_path.glob("ranking-*.json")
    assert {e["scheme"] for e in json.loads(ranking.read_text())["entries"]} == {"unquantized", "int4_w4a16_g64"}


def test_concurrent_ranking_merges_keep_every_entry(tmp_path):
    def ranking(i: int) -> dict:
        return {"device": "dev", "measured": {"date": "d"}, "protocol": "p",
                "entries": [{"scheme": f"s{i}", "family": "f", "shape": "S", "tokens": 1, "us": {"b": 1.0}}]}

    threads = [threading.Thread(target=lambda i=i: [bench.save_ranking(ranking(i * 10 + j), tmp_path)
                                                    for j in range(5)]) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (path,) = tmp_path.glob("ranking-*.json")
    assert len(json.loads(path.read_text())["entries"]) == 30
    assert [p.name for p in tmp_path.iterdir()] == ["ranking-dev.json"]  # no lock or temporary file left


def test_the_oracles_choice_alone_writes_no_ranking(tmp_path, fast, capsys):
    assert bench.main(bench_args(*_TINY, "--scheme", "bf16", "--out", str(tmp_path))) == 0
    assert list(tmp_path.glob("ranking-*")) == []
    assert "ranking" not in capsys.readouterr().err


def test_save_ranking_needs_backends_timed_side_by_side(tmp_path, capsys):
    assert bench.main(bench_args(*_TINY, "--scheme", "bf16", "--save-ranking", "--out", str(tmp_path))) == 2
    assert "--save-ranking needs --backends all or a list of backends" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_table_follows_the_progress_on_a_shared_terminal(tmp_path, fast, monkeypatch):
    """stdout and stderr on one terminal: the progress lines end before the table starts, and the
    table's lines are not split by progress."""
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    assert bench.main(bench_args(*_TINY, "--scheme", "bf16", "--scheme", "int4", "--out", str(tmp_path))) == 0
    lines = terminal.getvalue().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("preset "))
    assert max(i for i, line in enumerate(lines) if ": timing (" in line) < header
    assert [line.split()[:3] for line in lines[header + 1:header + 5]] == [
        ["tiny", "bf16", "1"], ["tiny", "bf16", "2"], ["tiny", "int4", "1"], ["tiny", "int4", "2"]]


def test_one_backend_has_no_diff_column_and_several_say_what_it_is(tmp_path, fast, capsys):
    assert bench.main(bench_args(*_TINY, "--scheme", "bf16", "--out", str(tmp_path / "one"))) == 0
    out = capsys.readouterr().out
    assert "diff" not in out
    assert bench.main(bench_args(*_TINY, "--scheme", "bf16", "--backends", "reference,cpu",
                            "--out", str(tmp_path / "two"))) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("preset "))
    assert header.split()[-1] == "diff"
    cpu_rows = [line for line in lines if line.startswith("tiny ") and " cpu " in line]
    assert len(cpu_rows) == 2 and all("e-" in row.split()[-1] for row in cpu_rows)
    assert any(line.startswith("diff: relative L2 difference of the output from that of the cell's first backend")
               for line in lines)


def test_a_cell_above_its_floor_is_flagged_impossible(tmp_path, monkeypatch, capsys):
    """A copy bandwidth of 1 MB/s makes every floor seconds long: no layer can be that much faster."""
    monkeypatch.setattr(bench_cli, "available_memory_bytes", lambda device: 1 << 40)
    monkeypatch.setattr(bench_cli, "measure_ceilings", lambda device, dtype, host_samples: bench.Ceilings(
        1e6, {"bfloat16": 1e11}, "bfloat16", 1, 1, None, "test"))
    monkeypatch.setattr(bench_cli, "quick_ceilings", lambda device, dtype: bench.QuickCeilings(1e10, 1e11))
    assert bench.main(bench_args(*_TINY, "--scheme", "bf16", "--out", str(tmp_path))) == 0
    captured = capsys.readouterr()
    (result,) = tmp_path.glob("bench-*.json")
    assert all(r["floor_fraction"] > bench.IMPOSSIBLE_FRACTION for r in json.loads(result.read_text())["rows"])
    assert "of the floor is impossible" in captured.err
    rows = [line for line in captured.out.splitlines() if line.startswith("tiny ")]
    assert len(rows) == 2 and all("!" in row for row in rows)
    assert "warning: 2 cells marked ! report more than 1.02 of their floor, which is impossible" in captured.out


def test_a_machine_that_slows_down_during_a_cell_is_flagged(tmp_path, fast, monkeypatch, capsys):
    """Issue 58: a run under load was 100x slow with no spread warning, every sample being as slow:
    the quick ceilings re-measured after the cell show it. The baseline is the better of the two
    taken around the run's ceilings (here the copy before them, the matmul after)."""
    speeds = iter([bench.QuickCeilings(1e10, 0.5e11), bench.QuickCeilings(0.8e10, 1e11),  # before, after the ceilings
                   bench.QuickCeilings(1e10, 1e11), bench.QuickCeilings(1e10, 1e9)])  # after the first cell, the second
    monkeypatch.setattr(bench_cli, "quick_ceilings", lambda device, dtype: next(speeds))
    assert bench.main(bench_args(*_TINY, "--scheme", "bf16", "--out", str(tmp_path))) == 0
    captured = capsys.readouterr()
    (result,) = tmp_path.glob("bench-*.json")
    payload = json.loads(result.read_text())
    rows = payload["rows"]
    assert [(r["copy_recheck"], r["matmul_recheck"]) for r in rows] == [(1.0, 1.0), (1.0, 0.01)]
    quick = payload["quick_ceilings"]
    assert (quick["copy_bytes_per_s"], quick["matmul_flop_per_s"]) == (1e10, 1e11) and len(quick["measured"]) == 2
    assert "tiny: bf16: cpu: 2 tokens: the quick copy and matmul re-measured after it ran at 1.00x and 0.01x" \
        in captured.err
    assert "tiny: bf16: cpu: 1 tokens: the quick" not in captured.err
    assert "floor fractions are suspect: tiny bf16 cpu M=2 (copy 1.00x, matmul 0.01x)" in captured.out


def test_an_interrupted_run_shows_the_points_it_measured(tmp_path, fast, interrupt_at, capsys):
    interrupt_at(2)
    assert bench.main(bench_args(*_TINY, "--scheme", "bf16", "--out", str(tmp_path))) == 130
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tiny ")]
    assert [row.split()[:3] for row in rows] == [["tiny", "bf16", "1"]]


@pytest.mark.parametrize("name", ["bf16", "fp16", "none", "unquantized"])
def test_bench_speaks_the_clis_scheme_vocabulary(name):
    """Issue 58: one flag (--scheme, or --quant as run and explain say) and one set of unquantized names."""
    from moe_core.presets import get_preset
    from moe_core.quant import unquantized

    assert bench_args("--quant", name, "--scheme", "int4").scheme == [name, "int4"]
    assert bench_cli._scheme(name, get_preset("tiny")) == unquantized()


def test_a_cells_inputs_do_not_depend_on_the_other_token_counts(tmp_path, fast, monkeypatch):
    """A cell re-timed alone routes the same inputs as in a run of several token counts: its floor
    (the experts its routing reads) is the same cell's."""
    routed = {}
    real = bench_cli.routed_work

    def capture(config, logits, correction_bias):
        routed.setdefault(logits[0].shape[0], []).append([x.clone() for x in logits])
        return real(config, logits, correction_bias)

    monkeypatch.setattr(bench_cli, "routed_work", capture)
    for tokens in (("1", "2"), ("2",)):
        assert bench.main(bench_args("--preset", "tiny", "--tokens", *tokens, "--repeats", "1", "--warmup", "0",
                                     "--no-plot", "--scheme", "bf16", "--out", str(tmp_path / "-".join(tokens)))) == 0
    with_one, alone = routed[2]
    assert len(with_one) == len(alone) and all(torch.equal(a, b) for a, b in zip(with_one, alone, strict=True))
