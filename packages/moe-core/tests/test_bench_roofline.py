"""The ceilings and roofline floor of `moe_core.bench.roofline`: the one definition `moe bench` and benchmarks/gpu
use."""

from __future__ import annotations

import math
import os

import pytest
import torch

from moe_core import bench
from moe_core.presets import get_preset
from moe_core.quant import fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16, unquantized

QWEN = get_preset("qwen3-30b-a3b").config  # E=128, k=8, K=2048, N=768, gated: R=1536
PARAMS = (1536 + 768) * 2048  # weight parameters of one qwen3-30b-a3b expert


def _ceilings(copy_bytes_per_s: float, matmul_flop_per_s: float, fp8: float | None = None) -> bench.Ceilings:
    rates = {"bfloat16": matmul_flop_per_s, **({"float8_e4m3fn": fp8} if fp8 else {})}
    return bench.Ceilings(copy_bytes_per_s=copy_bytes_per_s, matmul_flop_per_s=rates, matmul_dtype="bfloat16",
                          copy_bytes=0, matmul_size=0, matmul_sm_clock_mhz=None, method="given")


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


def test_routed_work_counts_the_experts_the_routing_selects():
    tiny = get_preset("tiny").config  # E=8, k=2, softmax top-k
    same = torch.zeros(5, 8)
    same[:, 3], same[:, 6] = 2.0, 1.0  # every token picks experts 3 and 6
    assert bench.routed_work(tiny, [same]) == bench.RoutedWork(experts=2, pairs=10)
    spread = torch.eye(8) * 5 + torch.eye(8).roll(1, 1) * 4  # token i: experts i and i+1 (mod 8)
    assert bench.routed_work(tiny, [spread]) == bench.RoutedWork(experts=8, pairs=16)
    # input sets timed in turn: the work of their mean call (sets of 5 tokens reading 6 and 2 experts)
    assert bench.routed_work(tiny, [spread[:5], same]) == bench.RoutedWork(experts=4, pairs=10)
    with pytest.raises(ValueError, match="no router logits"):
        bench.routed_work(tiny, [])


def test_routed_work_under_expert_parallelism_counts_this_ranks_share():
    import dataclasses

    from moe_core.config import ParallelConfig

    tiny = get_preset("tiny").config
    rank1 = dataclasses.replace(tiny, parallel=ParallelConfig(ep_size=2, ep_rank=1))  # experts 4-7
    logits = (torch.eye(8) * 5 + torch.eye(8).roll(1, 1) * 4)[:5]  # token i: experts i and i+1
    # tokens 3 and 4 reach rank 1, through experts 4 (twice) and 5
    assert bench.routed_work(rank1, [logits]) == bench.RoutedWork(experts=2, pairs=3)


def test_grouped_biased_routing_selects_fewer_experts_than_uniform_routing():
    """Why the floor counts the selected experts: DeepSeek-V3's grouped routing with a correction bias
    (as `moe bench` draws it) touches fewer experts than E(1-(1-k/E)^M), so that expectation put the
    floor above real times (1.19-1.70 of it on an H200)."""
    cfg = get_preset("deepseek-v3").config
    gen = torch.Generator().manual_seed(0)
    bias = torch.randn(cfg.num_experts, generator=gen) * 0.1
    M, E, k = 32, cfg.num_experts, cfg.top_k
    selected = bench.routed_work(cfg, [torch.randn(M, E, generator=gen)], bias).experts
    assert selected < 0.9 * E * (1 - (1 - k / E) ** M)


def test_floor_is_memory_bound_for_one_token():
    tiny = get_preset("tiny").config  # E=8, k=2, K=256, N=128, gated
    per_expert = (256 + 128) * 256 * 2
    floor = bench.roofline_floor(tiny, unquantized(), bench.RoutedWork(2, 2), _ceilings(1e12, 1e15))
    assert floor.distinct_experts == 2 and floor.matmul_dtype == "bfloat16"
    assert floor.bytes_per_expert == per_expert
    assert floor.memory_s == pytest.approx(2 * per_expert / 1e12)
    assert floor.compute_s == pytest.approx(2 * 1 * 2 * (256 + 128) * 256 / 1e15)
    assert floor.bound == "memory" and floor.seconds == floor.memory_s


def test_the_memory_floor_reads_at_the_faster_of_copy_and_read():
    """A layer only reads its weights: where a plain read outruns a copy (CUDA measures both), the
    floor takes the read's bandwidth."""
    import dataclasses

    tiny = get_preset("tiny").config
    work, per_expert = bench.RoutedWork(2, 2), (256 + 128) * 256 * 2
    copy_only = _ceilings(1e12, 1e15)
    faster_read = dataclasses.replace(copy_only, read_bytes_per_s=1.25e12)
    slower_read = dataclasses.replace(copy_only, read_bytes_per_s=0.5e12)
    assert bench.roofline_floor(tiny, unquantized(), work, copy_only).memory_s == pytest.approx(2 * per_expert / 1e12)
    assert bench.roofline_floor(tiny, unquantized(), work, faster_read).memory_s == \
        pytest.approx(2 * per_expert / 1.25e12)
    assert bench.roofline_floor(tiny, unquantized(), work, slower_read).memory_s == pytest.approx(2 * per_expert / 1e12)


def test_floor_is_compute_bound_for_many_tokens():
    tiny = get_preset("tiny").config
    floor = bench.roofline_floor(tiny, unquantized(), bench.RoutedWork(8, 4096 * 2), _ceilings(1e12, 1e12))
    assert floor.compute_s == pytest.approx(2 * 4096 * 2 * 384 * 256 / 1e12)
    assert floor.bound == "compute" and floor.seconds == floor.compute_s


def test_int4_floor_matches_the_gpu_formula():
    """max(distinct * 3NK * bytes per param / bandwidth, 2 M k 3NK / rate) for a gated layer."""
    preset = get_preset("deepseek-v3")
    cfg, g = preset.config, preset.int4_group_size
    E, k, K, N = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    ceilings = _ceilings(3.0e12, 7.0e14)
    for M in (1, 8, 32, 128, 512, 2048, 8192):
        distinct = min(E, M * k)
        floor = bench.roofline_floor(cfg, int4_w4a16(g), bench.RoutedWork(distinct, M * k), ceilings)
        memory = distinct * 3 * N * K * (0.5 + 2 / g) / 3.0e12
        compute = 2 * M * k * 3 * N * K / 7.0e14
        assert math.isclose(floor.seconds, max(memory, compute), rel_tol=1e-12)


@pytest.mark.parametrize(("quant", "expected"), [
    (unquantized(), torch.bfloat16), (int4_w4a16(128), torch.bfloat16), (int8_w8a16(), torch.bfloat16),
    (mxfp4_w4a16(), torch.bfloat16), (fp8_w8a8("block"), torch.float8_e4m3fn),
    (fp8_w8a8("channel"), torch.float8_e4m3fn), (fp8_w8a8("tensor", activation_scales="tensor"), torch.float8_e4m3fn),
])
def test_compute_dtype_is_the_gemm_operand_type(quant, expected):
    assert bench.compute_dtype(QWEN, quant) == expected


def test_fp16_layers_compute_in_fp16():
    import dataclasses

    assert bench.compute_dtype(dataclasses.replace(QWEN, dtype=torch.float16), int4_w4a16(128)) == torch.float16


def test_the_compute_floor_takes_the_rate_of_the_schemes_own_type():
    tiny = get_preset("tiny").config
    work = bench.RoutedWork(8, 4096 * 2)
    flops = 2 * 4096 * 2 * 384 * 256
    ceilings = _ceilings(1e15, 1e12, fp8=2e12)
    fp8 = bench.roofline_floor(tiny, fp8_w8a8("channel"), work, ceilings)
    assert fp8.matmul_dtype == "float8_e4m3fn" and fp8.compute_s == pytest.approx(flops / 2e12)
    for weight_only in (unquantized(), int8_w8a16(), mxfp4_w4a16()):
        floor = bench.roofline_floor(tiny, weight_only, work, ceilings)
        assert floor.matmul_dtype == "bfloat16" and floor.compute_s == pytest.approx(flops / 1e12)
    # where no fp8 rate was measured (CPU, XPU, a GPU without fp8 matmuls) fp8 schemes take the layer dtype's
    fallback = bench.roofline_floor(tiny, fp8_w8a8("channel"), work, _ceilings(1e15, 1e12))
    assert fallback.matmul_dtype == "bfloat16" and fallback.compute_s == pytest.approx(flops / 1e12)


def test_the_fp8_ceiling_matmul_runs_scaled_mm_as_cuda_would():
    """The fp8 matmul `measure_ceilings` times on CUDA (torch._scaled_mm, unit scales), run on the CPU:
    its operands are laid out as _scaled_mm requires and it computes a @ b."""
    from moe_core.bench.roofline import _matmul

    torch.manual_seed(0)
    out = _matmul(64, torch.float8_e4m3fn, torch.device("cpu"))()
    assert out.shape == (64, 64) and out.dtype == torch.bfloat16 and out.float().abs().sum() > 0
    assert _matmul(64, torch.bfloat16, torch.device("cpu"))().dtype == torch.bfloat16


def test_cpu_ceilings_are_positive_and_say_how_they_were_measured():
    c = bench.measure_ceilings("cpu", torch.bfloat16, host_samples=2)
    assert c.copy_bytes_per_s > 0 and list(c.matmul_flop_per_s) == ["bfloat16"] and c.matmul_flop_per_s["bfloat16"] > 0
    assert c.matmul_dtype == "bfloat16" and c.matmul_sm_clock_mhz is None and c.read_bytes_per_s is None
    assert c.copy_bytes == 256 << 20 and c.matmul_size == 2048 and "best of 2" in c.method


def test_the_quick_ceilings_measure_a_copy_and_a_matmul():
    quick = bench.quick_ceilings("cpu", torch.bfloat16)
    assert quick.copy_bytes_per_s > 0 and quick.matmul_flop_per_s > 0


def test_clock_sampler_reports_nothing_off_cuda():
    with bench.SmClockSampler(torch.device("cpu")) as clock:
        pass
    assert clock.median is None


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="on a CPU the Triton readers run under Triton's interpreter only (nox's tests session sets it)")
def test_each_triton_stream_read_reads_every_byte():
    """The read ceiling's Triton readers (`_stream_read`, taken on GPUs): one byte set anywhere in a zero
    buffer, the partial last programs included, shows in exactly one program's xor, in its place."""
    from moe_core.bench._stream_read import SHAPES, stream_readers

    words = 16384 + 4096 + 5  # a partial last program in both shapes
    gen = torch.Generator().manual_seed(5)
    for position in [0, 4 * words - 1, *torch.randint(0, 4 * words, (4,), generator=gen).tolist()]:
        src = torch.zeros(4 * words, dtype=torch.uint8)
        src[position] = 0x5A
        readers = stream_readers(src)
        assert list(readers) == [f"triton read {w * 4 // 1024} KiB" for w, _ in SHAPES]
        for (per_program, _), out in zip(SHAPES, (read() for read in readers.values()), strict=True):
            assert out.numel() == -(-words // per_program)
            expected = torch.zeros_like(out)
            expected[position // 4 // per_program] = 0x5A << 8 * (position % 4)
            assert torch.equal(out, expected), (per_program, position)


def test_each_read_ceiling_kernel_reads_every_byte():
    """The read ceiling's kernels (`read_kernels`) each reduce over the whole buffer: one value set
    anywhere in a zero buffer (the first, the last, and random places) shows in every kernel's result."""
    from moe_core.bench.roofline import read_kernels

    numel = 4 * 2 * 8192
    assert set(read_kernels(torch.zeros(numel, dtype=torch.uint8))) == {"fp32 sum", "bf16 gemv", "bf16 gemm x16"}
    gen = torch.Generator().manual_seed(3)
    # the top byte of a float32 (and of the bf16 in its upper half): 0x3F there makes 0.5 or more
    for position in [3, numel - 1, *(4 * torch.randint(0, numel // 4, (4,), generator=gen) + 3).tolist()]:
        src = torch.zeros(numel, dtype=torch.uint8)
        src[position] = 0x3F
        for name, kernel in read_kernels(src).items():
            assert kernel().float().abs().sum() >= 0.5, (name, position)
