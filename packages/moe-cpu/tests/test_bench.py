"""`moe bench` (moe_core.bench) end to end on the CPU backend, at a tiny size."""

from __future__ import annotations

import argparse
import json

from moe_core import bench
from moe_core.presets import get_preset
from moe_core.quant import int4_w4a16, unquantized


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_bench_writes_rows_with_floor_and_naive_baseline(tmp_path):
    code = bench.main(_args("--preset", "tiny", "--tokens", "1", "4", "--scheme", "bf16", "--scheme", "int4",
                            "--repeats", "2", "--warmup", "1", "--threads", "1", "--no-plot", "--out", str(tmp_path)))
    assert code == 0
    (result,) = tmp_path.glob("bench-*.json")
    payload = json.loads(result.read_text())
    assert payload["machine"]["torch_threads"] == 1 and payload["machine"]["cpu_count"] >= 1
    assert payload["ceilings"]["copy_gbps"] > 0 and payload["ceilings"]["matmul_tflops"] > 0
    rows = payload["rows"]
    assert [(r["scheme"], r["tokens"]) for r in rows] == [("bf16", 1), ("bf16", 4), ("int4", 1), ("int4", 4)]
    assert {r["experts"] for r in rows} == {"CpuOneDnnExperts", "CpuInt4Experts"}
    for r in rows:
        assert r["time_ms"] > 0 and r["naive_ms"] > 0 and r["floor_ms"] > 0
        assert abs(r["floor_fraction"] - r["floor_ms"] / r["time_ms"]) < 1e-9
    # tiny: 8 experts of 3 * 128 * 256 params; bf16 stores 2 bytes each, int4 (g64) half a byte + 4 per 64
    bytes_by_scheme = {r["scheme"]: r["bytes_per_expert"] for r in rows}
    assert bytes_by_scheme["bf16"] == 3 * 128 * 256 * 2
    assert bytes_by_scheme["int4"] == 3 * 128 * 256 // 2 + 3 * 128 * 256 // 64 * 4


def test_bench_refuses_a_preset_too_large_before_allocating(tmp_path, capsys):
    deepseek = get_preset("deepseek-v3").config
    assert bench.planned_bytes(deepseek, [unquantized(), int4_w4a16(128)]) > 22 * 2**30
    code = bench.main(_args("--preset", "deepseek-v3", "--scheme", "bf16", "--out", str(tmp_path), "--no-plot",
                            "--repeats", "1"))
    out = capsys.readouterr().out
    assert code == 1 and "deepseek-v3: needs about" in out and "not run" in out
    (result,) = tmp_path.glob("bench-*.json")
    assert json.loads(result.read_text())["refused"][0]["preset"] == "deepseek-v3"


def test_bench_rejects_bad_input(capsys):
    assert bench.main(_args("--preset", "nope")) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().out
    assert bench.main(_args("--preset", "tiny", "--scheme", "int4:100")) == 2
    assert "group size 100 does not divide the hidden size 256" in capsys.readouterr().out
    assert bench.main(_args("--preset", "tiny", "--tokens", "0")) == 2
