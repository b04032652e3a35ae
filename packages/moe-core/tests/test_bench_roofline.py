"""The ceilings and roofline floor of `moe_core.bench`: the one definition `moe bench` and benchmarks/gpu use."""

from __future__ import annotations

import math

import pytest
import torch

from moe_core import bench
from moe_core.presets import get_preset
from moe_core.quant import fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16, unquantized

QWEN = get_preset("qwen3-30b-a3b").config  # E=128, k=8, K=2048, N=768, gated: R=1536
PARAMS = (1536 + 768) * 2048  # weight parameters of one qwen3-30b-a3b expert


def _ceilings(copy_bytes_per_s: float, matmul_flop_per_s: float) -> bench.Ceilings:
    return bench.Ceilings(copy_bytes_per_s=copy_bytes_per_s, matmul_flop_per_s=matmul_flop_per_s,
                          matmul_dtype="bfloat16", copy_bytes=0, matmul_size=0, matmul_sm_clock_mhz=None,
                          method="given")


@pytest.mark.parametrize(("quant", "expected"), [
    (unquantized(), 2.0),
    (int4_w4a16(128), 0.5 + 2 / 128),  # bf16 scale per 128 codes
    (int4_w4a16(128, zero_point=True), 0.5 + 3 / 128),  # plus a uint8 zero point per group
    (int4_w4a16(128, act_order=True), 0.5 + 2 / 128 + 4 * (2048 + 768) / PARAMS),  # int32 group per input
    (int8_w8a16(), 1 + 2 * (1536 + 2048) / PARAMS),  # bf16 scale per output row of w13 and w2
    (int8_w8a16(128), 1 + 2 / 128),
    (fp8_w8a8("tensor"), 1 + 2 * 4 / PARAMS),  # one fp32 scale per tensor
    (fp8_w8a8("channel"), 1 + 4 * (1536 + 2048) / PARAMS),
    (fp8_w8a8("block"), 1 + 4 * (12 * 16 + 16 * 6) / PARAMS),  # fp32 per 128x128 block
    (mxfp4_w4a16(), 0.5 + 1 / 32),  # e8m0 byte per 32 codes
])
def test_weight_bytes_per_param_counts_codes_scales_and_zero_points(quant, expected):
    assert bench.weight_bytes_per_param(QWEN, quant) == pytest.approx(expected, rel=1e-12)
    assert bench.expert_weight_bytes(QWEN, quant) == pytest.approx(expected * PARAMS, rel=1e-12)


def test_unquantized_bytes_follow_the_layer_dtype():
    import dataclasses

    fp32 = dataclasses.replace(QWEN, dtype=torch.float32)
    assert bench.weight_bytes_per_param(fp32, unquantized()) == 4.0


def test_expected_distinct_experts():
    assert bench.expected_distinct_experts(8, 2, 1) == pytest.approx(2.0)
    assert bench.expected_distinct_experts(128, 8, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))
    assert bench.expected_distinct_experts(8, 2, 10_000) == pytest.approx(8.0)


def test_floor_is_memory_bound_for_one_token():
    tiny = get_preset("tiny").config  # E=8, k=2, K=256, N=128, gated
    per_expert = (256 + 128) * 256 * 2
    floor = bench.roofline_floor(tiny, unquantized(), 1, _ceilings(1e12, 1e15))
    assert floor.expected_distinct_experts == pytest.approx(2.0)
    assert floor.bytes_per_expert == per_expert
    assert floor.memory_s == pytest.approx(2 * per_expert / 1e12)
    assert floor.compute_s == pytest.approx(2 * 1 * 2 * (256 + 128) * 256 / 1e15)
    assert floor.bound == "memory" and floor.seconds == floor.memory_s


def test_floor_is_compute_bound_for_many_tokens():
    tiny = get_preset("tiny").config
    floor = bench.roofline_floor(tiny, unquantized(), 4096, _ceilings(1e12, 1e12))
    assert floor.compute_s == pytest.approx(2 * 4096 * 2 * 384 * 256 / 1e12)
    assert floor.bound == "compute" and floor.seconds == floor.compute_s


def test_int4_floor_matches_the_gpu_formula():
    """max(E(1-(1-k/E)^M) * 3NK * bytes per param / bandwidth, 2 M k 3NK / rate) for a gated layer."""
    preset = get_preset("deepseek-v3")
    cfg, g = preset.config, preset.int4_group_size
    E, k, K, N = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    ceilings = _ceilings(3.0e12, 7.0e14)
    for M in (1, 8, 32, 128, 512, 2048, 8192):
        floor = bench.roofline_floor(cfg, int4_w4a16(g), M, ceilings)
        memory = E * (1 - (1 - k / E) ** M) * 3 * N * K * (0.5 + 2 / g) / 3.0e12
        compute = 2 * M * k * 3 * N * K / 7.0e14
        assert math.isclose(floor.seconds, max(memory, compute), rel_tol=1e-12)


def test_cpu_ceilings_are_positive_and_say_how_they_were_measured():
    c = bench.measure_ceilings("cpu", torch.bfloat16, host_samples=2)
    assert c.copy_bytes_per_s > 0 and c.matmul_flop_per_s > 0
    assert c.matmul_dtype == "bfloat16" and c.matmul_sm_clock_mhz is None
    assert c.copy_bytes == 256 << 20 and c.matmul_size == 2048 and "best of 2" in c.method


def test_clock_sampler_reports_nothing_off_cuda():
    with bench.SmClockSampler(torch.device("cpu")) as clock:
        pass
    assert clock.median is None
