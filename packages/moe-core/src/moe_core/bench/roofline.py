"""The machine's ceilings and the roofline floor of a layer call: the one definition `moe bench`,
benchmarks/gpu and the docs use.

    floor = max(expected distinct experts * weight bytes per expert / copy bandwidth,
                2 * M * top_k * (R + N) * K / matmul rate)

with the expected number of distinct experts E * (1 - (1 - top_k / E) ** M) for uniform routing and
the weight bytes of the scheme as stored: codes plus scales, zero points and act-order indices
(`expert_weight_bytes`). The ceilings (`measure_ceilings`) are measured in the same run: the copy
bandwidth (bytes read + written of a large copy) and the rate of a large matmul in the layer dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_core.bench.timing import CUDA_DROPPED, CUDA_SAMPLES, SmClockSampler, _cuda_median_seconds, _time
from moe_core.config import MoEConfig
from moe_core.quant import Granularity, MoEQuantConfig, QuantKey, ZeroPoint


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float  # bytes read + written per second by a large copy on the device
    matmul_flop_per_s: float  # a large square matmul in `matmul_dtype`
    matmul_dtype: str
    copy_bytes: int  # size of the copied tensor
    matmul_size: int  # n of the n x n x n matmul
    matmul_sm_clock_mhz: float | None  # median SM clock while the matmul ran (CUDA with NVML), else None
    method: str


@dataclass(frozen=True)
class Floor:
    seconds: float  # max(memory_s, compute_s)
    bound: str  # "memory" or "compute"
    memory_s: float
    compute_s: float
    expected_distinct_experts: float
    bytes_per_expert: float


CUDA_COPY_BYTES = 2 << 30
CUDA_MATMUL_SIZE = 8192


def _cuda_copy_seconds(device: torch.device) -> float:
    src = torch.randn(CUDA_COPY_BYTES // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return _cuda_median_seconds(lambda: dst.copy_(src))


def _cuda_matmul_seconds(device: torch.device, dtype: torch.dtype, clock: SmClockSampler) -> float:
    a = torch.randn(CUDA_MATMUL_SIZE, CUDA_MATMUL_SIZE, device=device, dtype=dtype)
    b = torch.randn(CUDA_MATMUL_SIZE, CUDA_MATMUL_SIZE, device=device, dtype=dtype)
    with clock:
        return _cuda_median_seconds(lambda: a @ b)


def _measure_cuda_ceilings(device: torch.device, dtype: torch.dtype) -> Ceilings:
    copy_s = _cuda_copy_seconds(device)
    clock = SmClockSampler(device)
    matmul_s = _cuda_matmul_seconds(device, dtype, clock)
    torch.cuda.empty_cache()
    n = CUDA_MATMUL_SIZE
    return Ceilings(copy_bytes_per_s=2 * CUDA_COPY_BYTES / copy_s, matmul_flop_per_s=2 * n**3 / matmul_s,
                    matmul_dtype=str(dtype).removeprefix("torch."), copy_bytes=CUDA_COPY_BYTES, matmul_size=n,
                    matmul_sm_clock_mhz=clock.median,
                    method=f"CUDA events, median of {CUDA_SAMPLES} samples after dropping the first {CUDA_DROPPED}")


def _measure_host_timed_ceilings(device: torch.device, dtype: torch.dtype, samples: int) -> Ceilings:
    copy_bytes = 256 << 20
    n = 2048 if device.type == "cpu" else 8192
    src = torch.ones(copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    threads = torch.get_num_threads()
    copy_s, mm_s = float("inf"), float("inf")
    try:
        for t in sorted({1, threads}) if device.type == "cpu" else [threads]:
            torch.set_num_threads(t)
            copy_s = min(copy_s, min(_time(lambda: dst.copy_(src), device, 2, samples)))
            mm_s = min(mm_s, min(_time(lambda: torch.matmul(a, b), device, 2, samples)))
    finally:
        torch.set_num_threads(threads)
    threads_note = " at 1 thread and at the configured count" if device.type == "cpu" else ""
    return Ceilings(copy_bytes_per_s=2 * copy_bytes / copy_s, matmul_flop_per_s=2 * n**3 / mm_s,
                    matmul_dtype=str(dtype).removeprefix("torch."), copy_bytes=copy_bytes, matmul_size=n,
                    matmul_sm_clock_mhz=None, method=f"wall clock, best of {samples} samples{threads_note}")


def measure_ceilings(device: torch.device | str, dtype: torch.dtype, host_samples: int = 10) -> Ceilings:
    """The copy bandwidth (bytes read + written) and matmul rate of `device`: the ceilings of `roofline_floor`.

    CUDA: a 2 GiB device-to-device copy and an 8192^3 matmul in `dtype`, timed with CUDA events,
    median of 23 samples after dropping the first 3; the SM clock is sampled while the matmul runs.
    CPU and XPU: a 256 MiB copy and a 2048^3 (XPU: 8192^3) matmul timed by the wall clock, the best
    of `host_samples` samples (ceilings are peaks); on the CPU the best of one thread and the
    configured thread count (on small shared machines one thread often copies faster than two).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return _measure_cuda_ceilings(device, dtype)
    return _measure_host_timed_ceilings(device, dtype, host_samples)


_SCALE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "e8m0": 1}


def _matrix_bytes(rows: int, cols: int, key: QuantKey, dtype: torch.dtype) -> float:
    """Stored bytes of one expert's [rows, cols] weight under `key`, as `moe_core.weights.canonical`
    lays it out: codes, scales, zero points and act-order indices."""
    if not key.quantized:
        return rows * cols * torch.empty((), dtype=dtype).element_size()
    spec = key.scale
    if spec.granularity is Granularity.TENSOR:
        scales = 1
    elif spec.granularity is Granularity.CHANNEL:
        scales = rows
    elif spec.granularity is Granularity.GROUP:
        scales = rows * cols / spec.group_size
    else:
        br, bc = spec.block_shape
        scales = -(-rows // br) * -(-cols // bc)
    zero_bytes = {ZeroPoint.NONE: 0, ZeroPoint.INTEGER: 1, ZeroPoint.FLOAT: _SCALE_BYTES[spec.dtype]}[key.zero_point]
    g_idx_bytes = 4 * cols if key.act_order else 0
    return rows * cols * key.bits / 8 + scales * (_SCALE_BYTES[spec.dtype] + zero_bytes) + g_idx_bytes


def expert_weight_bytes(config: MoEConfig, quant: MoEQuantConfig) -> float:
    """Bytes of one expert's w13 and w2 as `quant` stores them, scales and zero points included
    (biases left out); unquantized weights at `config.dtype`."""
    R, K, N = config.w13_rows, config.hidden_size, config.intermediate_size_per_partition
    return _matrix_bytes(R, K, quant.weight, config.dtype) + _matrix_bytes(K, N, quant.weight, config.dtype)


def weight_bytes_per_param(config: MoEConfig, quant: MoEQuantConfig) -> float:
    """`expert_weight_bytes` per weight parameter: 2 for bf16, 0.5 + 2 / g for int4 with bf16 scales
    per group of g, 0.5 + 3 / g with uint8 zero points too, 0.5 + 1 / 32 for MXFP4."""
    R, K, N = config.w13_rows, config.hidden_size, config.intermediate_size_per_partition
    return expert_weight_bytes(config, quant) / ((R + N) * K)


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Experts that `tokens` tokens touch on average when each picks `top_k` of `num_experts` uniformly."""
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def roofline_floor(config: MoEConfig, quant: MoEQuantConfig, tokens: int, ceilings: Ceilings) -> Floor:
    """The least time one layer call of `tokens` tokens can take under `ceilings`: reading the weights
    of the experts it touches (`expected_distinct_experts`, at `expert_weight_bytes` each) or the
    GEMMs' 2 * M * top_k * (R + N) * K flops, whichever takes longer."""
    R, K, N = config.w13_rows, config.hidden_size, config.intermediate_size_per_partition
    # Under expert parallelism only the local share of the touched experts is read here.
    local_share = config.num_local_experts / config.num_experts
    distinct = local_share * expected_distinct_experts(config.num_experts, config.top_k, tokens)
    per_expert = expert_weight_bytes(config, quant)
    memory_s = distinct * per_expert / ceilings.copy_bytes_per_s
    compute_s = 2 * tokens * config.top_k * (R + N) * K / ceilings.matmul_flop_per_s
    return Floor(max(memory_s, compute_s), "memory" if memory_s >= compute_s else "compute", memory_s, compute_s,
                 distinct, per_expert)
