"""Measured rankings: the file format, how `select()` orders backends by them, and `moe bench
--backends all` writing one that `select()` then reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import _fake_backends as fb
from moe_core import DeviceInfo, MoEConfig, Platform, int4_w4a16, int8_w8a16, select, unquantized
from moe_core.backends import REFERENCE_BACKEND
from moe_core.cli import main as moe_main
from moe_core.config import ActivationKind
from moe_core.experts import UNQUANTIZED, Capability, SchemeSupport
from moe_core.plugins import BackendSpec, ExpertsRef, Priority, registry, reset_registry
from moe_core.quant import Granularity, QuantDType
from moe_core.rankings import (
    ENV_RANKINGS,
    TOKEN_BUCKETS,
    find_ranking,
    load_ranking,
    ranking_from_rows,
    shape_key,
    token_bucket,
)

CFG = MoEConfig(8, 2, 256, 128, max_num_tokens=64)
OTHER_SHAPE = MoEConfig(16, 4, 512, 256, max_num_tokens=64)
H100 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H100", (9, 0))


class WeightOnlyGpuExperts(fb.FakeGpuExperts):
    """Serves unquantized and int4/int8 weight-only layers: rankings order it by measurement alone."""

    capability = Capability(platforms=frozenset({Platform.CUDA}), schemes=(
        UNQUANTIZED, SchemeSupport(QuantDType.INT4, frozenset({Granularity.GROUP}), group_sizes=frozenset({64, 128})),
        SchemeSupport(QuantDType.INT8, frozenset({Granularity.CHANNEL}))), activations=frozenset(ActivationKind))


@pytest.fixture
def three_backends():
    """Three CUDA backends serving the same layers: static order fast_static > mid > slow_static."""

    def plugin(name: str, rank: int) -> fb.FakeEntryPoint:
        spec = BackendSpec(name, (1, 1), (Platform.CUDA,), (ExpertsRef(name, "test_rankings:WeightOnlyGpuExperts"),),
                           priorities=(Priority(name, Platform.CUDA, rank),))
        return fb.FakeEntryPoint(name, spec, fb.FakeDist(f"moe-{name}", requires=("moe-core>=0.2,<0.3",)))

    registry(fb.entry_points(plugin("fast_static", 100), plugin("mid", 50), plugin("slow_static", 10)))
    yield
    reset_registry()


def _ranking_file(tmp_path, entries, device="NVIDIA H100", name="ranking-h100.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"device": device, "measured": {"date": "2000-01-01"}, "protocol": "test",
                                "entries": entries}))
    return path


def _entry(us: dict, tokens: int = 1, scheme: str = "unquantized", shape: str | None = None,
           family: str = "unquantized") -> dict:
    return {"scheme": scheme, "family": family, "shape": shape or shape_key(CFG), "tokens": tokens, "us": us}


@pytest.fixture
def rankings_env(monkeypatch, tmp_path):
    """Point MOE_RANKINGS at `tmp_path` and keep the user's folder out of the test."""
    monkeypatch.setenv(ENV_RANKINGS, str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_token_buckets():
    assert [token_bucket(m) for m in (1, 2, 8, 9, 512, 513, 8192, 100_000)] == [1, 8, 8, 32, 512, 2048, 8192, 8192]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_tokens must be an int >= 1"):
            token_bucket(bad)


def test_static_order_without_a_ranking(three_backends, rankings_env):
    plan = select(CFG, unquantized(), H100)
    assert plan.backend == "fast_static" and plan.ranking is None
    assert "static plugin priorities" in plan.explain()


def test_measured_order_beats_static_priorities(three_backends, rankings_env):
    _ranking_file(rankings_env, [_entry({"fast_static": 30.0, "mid": 20.0, "slow_static": 10.0})])
    plan = select(CFG, unquantized(), H100)
    assert plan.backend == "slow_static"
    assert [c.backend for c in plan.candidates] == ["slow_static", "mid", "fast_static", REFERENCE_BACKEND]
    text = plan.explain()
    assert "the fastest measured backend" in text and "slow_static 10.0 us" in text and "ranking-h100.json" in text
    chosen = next(c for c in plan.candidates if c.chosen)
    assert "measured 10.0 us" in chosen.reason
    assert plan.to_dict()["ranking"]["us"] == {"slow_static": 10.0, "mid": 20.0, "fast_static": 30.0}


def test_forced_backend_ignores_the_ranking(three_backends, rankings_env):
    _ranking_file(rankings_env, [_entry({"fast_static": 30.0, "slow_static": 10.0})])
    plan = select(CFG, unquantized(), H100, prefer="fast_static")
    assert plan.backend == "fast_static" and plan.forced and plan.ranking is None


def test_unmeasured_backends_follow_in_static_order(three_backends, rankings_env):
    _ranking_file(rankings_env, [_entry({"slow_static": 10.0})])
    order = [c.backend for c in select(CFG, unquantized(), H100).candidates]
    assert order == ["slow_static", "fast_static", "mid", REFERENCE_BACKEND]


def test_token_bucket_decides(three_backends, rankings_env):
    _ranking_file(rankings_env, [_entry({"mid": 5.0, "slow_static": 6.0}, tokens=1),
                                 _entry({"mid": 90.0, "slow_static": 40.0}, tokens=32)])
    assert select(CFG, unquantized(), H100, num_tokens=1).backend == "mid"
    assert select(CFG, unquantized(), H100, num_tokens=20).backend == "slow_static"  # bucket 32
    # No count: every measured count together (mid: 1.0 and 2.25 of the fastest; slow: 1.2 and 1.0).
    assert select(CFG, unquantized(), H100).backend == "slow_static"
    # A bucket nobody measured for this scheme falls back to nothing: the static order.
    assert select(CFG, unquantized(), H100, num_tokens=2048).backend == "fast_static"


def test_scheme_then_family_fallbacks(three_backends, rankings_env):
    _ranking_file(rankings_env, [
        _entry({"mid": 10.0, "fast_static": 20.0}, scheme="int4_w4a16_g128", family="wna16",
               shape=shape_key(OTHER_SHAPE)),
        _entry({"slow_static": 10.0, "fast_static": 20.0}, scheme="int8_w8a16_gchannel", family="wna16",
               shape=shape_key(OTHER_SHAPE))])
    int4 = select(CFG, int4_w4a16(128), H100, num_tokens=1)  # same scheme, another shape
    assert int4.backend == "mid" and "scheme int4_w4a16_g128" in int4.ranking.basis
    int4_g64 = select(CFG, int4_w4a16(64), H100, num_tokens=1)  # family only: both entries, geometric means
    assert int4_g64.ranking.basis.startswith("family wna16")
    assert int4_g64.backend == "fast_static"  # the only backend measured in both entries
    assert int4_g64.ranking.relative and "fast_static 2.00x the fastest" in int4_g64.explain()
    assert select(CFG, int8_w8a16(), H100, num_tokens=1).backend == "slow_static"


def test_other_devices_and_off_switch(three_backends, rankings_env, monkeypatch):
    _ranking_file(rankings_env, [_entry({"slow_static": 10.0})], device="NVIDIA H200")
    assert select(CFG, unquantized(), H100).backend == "fast_static"
    _ranking_file(rankings_env, [_entry({"slow_static": 10.0})], name="ranking-h100.json")
    assert select(CFG, unquantized(), H100).backend == "slow_static"
    monkeypatch.setenv(ENV_RANKINGS, "off")
    assert select(CFG, unquantized(), H100).backend == "fast_static"


@pytest.mark.parametrize(("content", "fragment"), [
    ("not json", "cannot be read as JSON"),
    ("[]", "not a JSON object"),
    ('{"device": "x"}', "missing field 'entries'"),
    ('{"device": "x", "entries": [{"scheme": "s", "family": "f", "shape": "s", "tokens": 3, "us": {"a": 1}}]}',
     "not one of"),
    ('{"device": "x", "entries": [{"scheme": "s", "family": "f", "shape": "s", "tokens": 1, "us": {"a": -1}}]}',
     "positive finite"),
])
def test_broken_ranking_file_names_itself(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=fragment) as info:
        load_ranking(path)
    assert str(path) in str(info.value)


def test_ranking_from_rows_keeps_each_backends_best_per_bucket():
    rows = [{"quant": "unquantized", "family": "unquantized", "shape": "S", "tokens": t, "backend": b, "time_ms": ms}
            for t, b, ms in [(1, "a", 0.02), (1, "b", 0.01), (6, "a", 0.05), (8, "a", 0.04)]]
    ranking = ranking_from_rows(rows, "dev", {"date": "d"}, "p")
    assert [(e["tokens"], e["us"]) for e in ranking["entries"]] == [(1, {"b": 10.0, "a": 20.0}), (8, {"a": 40.0})]
    assert set(TOKEN_BUCKETS) >= {e["tokens"] for e in ranking["entries"]}


def test_bench_all_backends_writes_a_ranking_select_reads(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv(ENV_RANKINGS, raising=False)
    out = tmp_path / "out"
    rc = moe_main(["bench", "--preset", "tiny", "--scheme", "bf16", "--tokens", "1", "4", "--backends", "all",
                   "--repeats", "2", "--warmup", "1", "--out", str(out), "--no-plot", "--save-ranking"])
    assert rc == 0
    written = list(out.glob("ranking-*.json"))
    assert len(written) == 1
    ranking = load_ranking(written[0])
    assert {e.tokens for e in ranking.entries} == {1, 8} and all(e.us for e in ranking.entries)
    saved = list((cache / "moe" / "rankings").glob("*.json"))
    assert len(saved) == 1 and load_ranking(saved[0]).device == ranking.device
    from moe_core.presets import get_preset

    config = get_preset("tiny").config
    match = find_ranking(ranking.device, config, unquantized(), 1)
    assert match is not None and match.ranking.source == str(saved[0])
    plan = select(config, unquantized(), "cpu", num_tokens=1)
    assert plan.ranking is not None and plan.backend == match.order[0]
    capsys.readouterr()
    assert moe_main(["explain", "--preset", "tiny", "--device", "cpu", "--tokens", "1"]) == 0
    assert "measured ranking" in capsys.readouterr().out
    capsys.readouterr()
    assert moe_main(["doctor", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["rankings"]
    assert {"path": str(saved[0]), "device": ranking.device, "date": ranking.measured["date"], "entries": 2} in listed


def test_doctor_names_a_broken_ranking_file(rankings_env, capsys):
    (rankings_env / "ranking-broken.json").write_text("{")
    (rankings_env / "bench-results.json").write_text("{}")  # not a ranking file: not read
    assert moe_main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "ranking-broken.json  ERROR ranking file" in out and "bench-results" not in out


def test_bench_records_a_backend_that_fails_and_goes_on(tmp_path, monkeypatch, rankings_env):
    from moe_core.reference import ReferenceExperts

    def broken(self, weights):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(ReferenceExperts, "load_weights", broken)
    rc = moe_main(["bench", "--preset", "tiny", "--scheme", "bf16", "--tokens", "1", "--backends", "reference,cpu",
                   "--repeats", "1", "--warmup", "0", "--out", str(tmp_path), "--no-plot"])
    assert rc == 0
    payload = json.loads(next(tmp_path.glob("bench-*.json")).read_text())
    assert [r["backend"] for r in payload["rows"]] == ["cpu"]
    assert any(r["backend"] == "reference" and "reference failed: RuntimeError: CUDA out of memory" in r["reason"]
               for r in payload["refused"])


def test_an_interrupted_bench_ranks_only_schemes_every_backend_finished(tmp_path, monkeypatch, rankings_env):
    """Backends are timed one after the other: a run stopped after the first backend of a scheme
    (a deadline) keeps that backend's rows in its results but ranks none of that scheme's cells."""
    import moe_core.bench.cli as bench_cli

    timed = []
    real = bench_cli._bench_layer

    def stop_at_the_second_scheme_s_second_backend(preset, scheme, quant, layer, *args):
        if scheme == "int8" and layer.plan.backend == "cpu":
            raise KeyboardInterrupt  # not a backend's failure: the run ends here
        timed.append((scheme, layer.plan.backend))
        return real(preset, scheme, quant, layer, *args)

    monkeypatch.setattr(bench_cli, "_bench_layer", stop_at_the_second_scheme_s_second_backend)
    rc = moe_main(["bench", "--preset", "tiny", "--scheme", "bf16", "--scheme", "int8", "--tokens", "1", "4",
                   "--backends", "reference,cpu", "--repeats", "1", "--warmup", "0", "--out", str(tmp_path),
                   "--no-plot", "--save-ranking"])
    assert rc == 130
    assert timed == [("bf16", "reference"), ("bf16", "cpu"), ("int8", "reference")]
    payload = json.loads(next(tmp_path.glob("bench-*.json")).read_text())
    assert {(r["scheme"], r["backend"]) for r in payload["rows"]} == set(timed)
    # --out's ranking file and the user's (--save-ranking); 4 tokens fall in the bucket of 8
    for folder in (tmp_path, rankings_env / "cache" / "moe" / "rankings"):
        entries = json.loads(next(folder.glob("ranking-*.json")).read_text())["entries"]
        assert [(e["scheme"], e["tokens"], set(e["us"])) for e in entries] == [
            ("unquantized", 1, {"reference", "cpu"}), ("unquantized", 8, {"reference", "cpu"})]


def test_shipped_rankings_load_and_name_known_backends():
    from pathlib import Path

    import moe_core.rankings as rankings

    shipped = sorted(Path(rankings.__file__).with_name("rankings_data").glob("ranking-*.json"))
    assert shipped, "moe-core ships at least one measured ranking"
    known = {"triton", "marlin", "torch_grouped_mm", "sglang_fp8_block", "flashinfer_cutlass", "flashinfer_trtllm",
             "aiter", "xpu", "cpu"}
    for path in shipped:
        ranking = load_ranking(path)
        assert ranking.device and ranking.measured.get("date") and ranking.entries
        for entry in ranking.entries:
            assert set(entry.backends) <= known, entry
            assert entry.us == tuple(sorted(entry.us, key=lambda bt: bt[1]))


def test_shipped_h200_ranking_serves_the_measured_fastest_in_every_cell(rankings_env):
    """The shipped H200 file (every backend measured side by side: benchmarks/results/README.md says
    where): each entry resolves for its preset and `moe bench` scheme to its own cell, whose first
    backend was the fastest there; vendor kernels lead where they were faster (SGLang's fp8 blocks at
    2048+ tokens, FlashInfer's at 8-512 tokens on mixtral-8x7b), moe-triton elsewhere. It covers the
    whole matrix: six schemes x five presets x seven token counts, less gpt-oss-120b's fp8 blocks
    (K = N = 2880 takes no 128 x 128 blocks)."""
    import moe_core.rankings as rankings
    from moe_core.bench.cli import _scheme
    from moe_core.presets import get_preset
    from moe_core.quant import fp8_w8a8

    path = Path(rankings.__file__).with_name("rankings_data") / "ranking-nvidia-h200.json"
    measured = {(e.scheme, e.shape, e.tokens): e for e in load_ranking(path).entries}
    device = "NVIDIA H200"
    resolved = set()
    for preset_name in ("deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x7b", "qwen3-30b-a3b"):
        preset = get_preset(preset_name)
        for quant in (_scheme(s, preset) for s in ("bf16", "fp8-block", "fp8-channel", "int8", "int4", "mxfp4")):
            for tokens in TOKEN_BUCKETS:
                key = (quant.name, shape_key(preset.config), tokens)
                if key not in measured:
                    continue
                match = find_ranking(device, preset.config, quant, tokens)
                assert match.basis.startswith("scheme and shape"), (preset_name, quant.name, tokens, match.basis)
                assert match.order[0] == min(measured[key].us, key=lambda bt: bt[1])[0]
                resolved.add(key)
    assert resolved == set(measured)  # no entry the presets' layers cannot reach
    assert len(resolved) == 6 * 5 * 7 - 7

    def first(preset_name: str, quant, tokens: int) -> str:
        return find_ranking(device, get_preset(preset_name).config, quant, tokens).order[0]

    assert first("qwen3-30b-a3b", fp8_w8a8("block"), 8192) == "sglang_fp8_block"
    assert first("qwen3-30b-a3b", fp8_w8a8("block"), 512) == "triton"
    assert first("mixtral-8x7b", fp8_w8a8("block"), 512) == "flashinfer_cutlass"
    assert first("qwen3-30b-a3b", int8_w8a16(), 512) == "triton"
    assert first("qwen3-30b-a3b", int8_w8a16(), 2048) == "triton"
    assert first("mixtral-8x7b", int4_w4a16(128), 1) == "triton"


def test_shipped_h100_ranking_orders_the_measured_fastest_first(rankings_env):
    """The shipped H100 file's cells as measured side by side: FlashInfer's
    fp8 blocks lead mixtral-8x7b at 512 tokens, moe-triton leads qwen3-30b-a3b there and mixtral at 32."""
    from moe_core.presets import get_preset
    from moe_core.quant import fp8_w8a8

    def order(preset: str, tokens: int) -> tuple[str, ...]:
        match = find_ranking("NVIDIA H100 80GB HBM3", get_preset(preset).config, fp8_w8a8("block"), tokens)
        assert match is not None and match.basis.startswith("scheme and shape"), match
        return match.order

    assert order("mixtral-8x7b", 512) == ("flashinfer_cutlass", "triton", "sglang_fp8_block")
    assert order("mixtral-8x7b", 32)[0] == "triton"
    assert order("qwen3-30b-a3b", 512) == ("triton", "flashinfer_cutlass", "sglang_fp8_block")
