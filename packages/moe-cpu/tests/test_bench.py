"""`moe bench` (moe_core.bench) end to end on the CPU backend, at a tiny size."""

from __future__ import annotations

import argparse
import json

import pytest

from moe_core import bench
from moe_core.bench import cli as bench_cli
from moe_core.presets import get_preset
from moe_core.quant import int4_w4a16, unquantized


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def plenty_of_memory(monkeypatch):
    """The memory check sees 1 TiB free, whatever the host has."""
    monkeypatch.setattr(bench_cli, "available_memory_bytes", lambda device: 1 << 40)


def test_bench_writes_rows_with_floor_and_naive_baseline(tmp_path, plenty_of_memory):
    code = bench.main(_args("--preset", "tiny", "--tokens", "1", "4", "--scheme", "bf16", "--scheme", "int4",
                            "--repeats", "2", "--warmup", "1", "--threads", "1", "--no-plot", "--out", str(tmp_path)))
    assert code == 0
    (result,) = tmp_path.glob("bench-*.json")
    payload = json.loads(result.read_text())
    assert payload["machine"]["torch_threads"] == 1 and payload["machine"]["cpu_count"] >= 1
    assert payload["ceilings"]["copy_bytes_per_s"] > 0 and payload["ceilings"]["matmul_flop_per_s"]["bfloat16"] > 0
    assert payload["quick_ceilings"]["copy_bytes_per_s"] > 0 and payload["quick_ceilings"]["matmul_flop_per_s"] > 0
    rows = payload["rows"]
    assert [(r["scheme"], r["tokens"]) for r in rows] == [("bf16", 1), ("bf16", 4), ("int4", 1), ("int4", 4)]
    assert {r["experts"] for r in rows} == {"CpuOneDnnExperts", "CpuInt4Experts"}
    for r in rows:
        assert r["time_ms"] > 0 and r["naive_ms"] > 0 and r["floor_ms"] > 0
        assert abs(r["floor_fraction"] - r["floor_ms"] / r["time_ms"]) < 1e-9
        assert r["floor_matmul_dtype"] == "bfloat16" and r["copy_recheck"] > 0 and r["matmul_recheck"] > 0
    # the experts the timed tokens' routing selects: top-2 of 8 over 1 and 4 tokens
    distinct = {r["tokens"]: r["distinct_experts"] for r in rows}
    assert distinct[1] == 2 and 2 <= distinct[4] <= 8
    # tiny: 8 experts of 3 * 128 * 256 params; bf16 stores 2 bytes each, int4 (g64) half a byte plus a
    # bf16 scale per 64: the floor reads the scheme's bytes whatever the CPU kernel unpacks them to
    bytes_by_scheme = {r["scheme"]: r["bytes_per_expert"] for r in rows}
    assert bytes_by_scheme["bf16"] == 3 * 128 * 256 * 2
    assert bytes_by_scheme["int4"] == 3 * 128 * 256 // 2 + 3 * 128 * 256 // 64 * 2
    for r in rows:
        assert r["kernel_bytes_per_expert"] >= 3 * 128 * 256 // 2


def test_bench_refuses_a_preset_too_large_before_allocating(tmp_path, capsys, monkeypatch):
    deepseek = get_preset("deepseek-v3").config
    assert bench.planned_bytes(deepseek, [unquantized(), int4_w4a16(128)]) > 22 * 2**30
    monkeypatch.setattr(bench_cli, "available_memory_bytes", lambda device: 16 * 2**30)
    code = bench.main(_args("--preset", "deepseek-v3", "--scheme", "bf16", "--out", str(tmp_path), "--no-plot",
                            "--repeats", "1"))
    out = capsys.readouterr().out
    assert code == 1 and "deepseek-v3: needs about" in out and "of the 16.0 GiB available" in out and "not run" in out
    (result,) = tmp_path.glob("bench-*.json")
    assert json.loads(result.read_text())["refused"][0]["preset"] == "deepseek-v3"


@pytest.mark.parametrize("spare_bytes", [-1, 1])
def test_bench_runs_a_preset_exactly_when_its_plan_fits_the_headroom(tmp_path, monkeypatch, spare_bytes):
    tiny = get_preset("tiny")
    need = bench.planned_bytes(tiny.config, [unquantized(), int4_w4a16(tiny.int4_group_size)], 1)
    available = int(need / bench.MEMORY_HEADROOM) + spare_bytes
    monkeypatch.setattr(bench_cli, "available_memory_bytes", lambda device: available)
    code = bench.main(_args("--preset", "tiny", "--tokens", "1", "--scheme", "bf16", "--scheme", "int4",
                            "--repeats", "1", "--warmup", "0", "--no-plot", "--out", str(tmp_path)))
    (result,) = tmp_path.glob("bench-*.json")
    payload = json.loads(result.read_text())
    if spare_bytes < 0:
        assert code == 1 and payload["rows"] == [] and payload["refused"][0]["preset"] == "tiny"
    else:
        assert code == 0 and len(payload["rows"]) == 2 and payload["refused"] == []


def test_bench_rejects_bad_input(capsys):
    assert bench.main(_args("--preset", "nope")) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    assert bench.main(_args("--preset", "tiny", "--scheme", "int4:100")) == 2
    assert "group size 100 does not divide the hidden size 256" in capsys.readouterr().err
    assert bench.main(_args("--preset", "tiny", "--tokens", "0")) == 2
