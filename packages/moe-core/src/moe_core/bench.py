"""`moe bench`: time whole MoE layers against the machine's own ceilings and a naive per-expert loop,
and the one definition of those ceilings and of the roofline floor (benchmarks/gpu uses them too).

For each preset, scheme and token count it times `FusedMoE` (routing + experts) on the backend the
oracle chooses, or on every installed backend (`--backends all`, which also writes the measured
ranking `select()` reads: `moe_core.rankings`), and reports the fraction of the roofline floor it
reaches (`roofline_floor`):

    floor = max(expected distinct experts * weight bytes per expert / copy bandwidth,
                2 * M * top_k * (R + N) * K / matmul rate)

with the expected number of distinct experts E * (1 - (1 - top_k / E) ** M) for uniform routing and
the weight bytes of the scheme as stored: codes plus scales, zero points and act-order indices
(`expert_weight_bytes`). The ceilings (`measure_ceilings`) are measured in the same run: the copy
bandwidth (bytes read + written of a large copy) and the rate of a large matmul in the layer dtype.
The naive baseline is the loop of transformers' eager MoE blocks: route, then `F.linear` per expert
that got tokens, in the layer dtype.

On CUDA a layer is timed as engines run it: captured in CUDA graphs over rotating input sets (8,
2 above 512 tokens), the L2 cache flushed before every replay, CUDA events around each replay
(`time_cuda_layer`); a layer that cannot be captured is timed eagerly the same way, and the row says
so. Elsewhere calls are timed by the wall clock, interleaved with the naive loop.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from moe_core.backends import REFERENCE_BACKEND, available_memory_bytes, detect_device, synchronize
from moe_core.config import MoEConfig
from moe_core.layer import FusedMoE
from moe_core.oracle import BackendUnavailableError, NoBackendError, select
from moe_core.plugins import PluginState, registry
from moe_core.presets import PRESETS, Preset, get_preset
from moe_core.quant import (
    Granularity,
    MoEQuantConfig,
    QuantDType,
    QuantKey,
    ZeroPoint,
    int4_w4a16,
    parse_scheme,
    unquantized,
)
from moe_core.rankings import load_ranking, ranking_from_rows, shape_key, user_rankings_dir
from moe_core.reference import apply_activation
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights

__all__ = ["Ceilings", "Floor", "Progress", "SmClockSampler", "TimingSummary", "add_arguments", "default_threads",
           "estimate_peak_bytes", "expected_distinct_experts", "expert_weight_bytes", "main", "measure_ceilings",
           "pin_threads", "planned_bytes", "prepare_out_dir", "roofline_floor", "save_ranking", "step",
           "summarize_timings", "time_cuda_layer", "triton_version", "weight_bytes_per_param", "write_json_atomic"]

DEFAULT_PRESETS = ("tiny", "qwen3-30b-a3b")
DEFAULT_TOKENS = (1, 8, 32, 128)
DEFAULT_SCHEMES = ("bf16", "int4")
# In the current directory, not the repository's committed benchmarks/results/: a run's output is the
# user's until they decide to publish it.
DEFAULT_OUT = "moe-bench-results"
# Fraction of the available memory a preset may plan to use; the rest is for torch and the OS.
MEMORY_HEADROOM = 0.8
# (p90 - min) / min of a cell's samples above which its timings are flagged as unsteady.
SPREAD_WARNING = 0.5


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


@dataclass(frozen=True)
class Row:
    preset: str
    scheme: str  # as given on the command line
    tokens: int
    backend: str  # the backend timed: the oracle's choice, or each of --backends
    experts: str  # its experts class
    quant: str  # MoEQuantConfig.name of the scheme, the key of ranking entries
    family: str  # QuantFamily of the scheme
    shape: str  # moe_core.rankings.shape_key of the layer
    timing: str  # "cuda-graph", "cuda-events (eager: ...)" or "wall-clock"
    time_ms: float  # median
    min_ms: float
    p90_ms: float
    spread: float  # (p90 - min) / min; above SPREAD_WARNING the timings are unsteady
    tokens_per_s: float
    floor_ms: float
    floor_bound: str  # "memory" or "compute"
    floor_fraction: float  # floor / median time
    naive_ms: float  # median of the naive per-expert loop
    speedup_vs_naive: float
    bytes_per_expert: int  # the scheme's stored bytes (`expert_weight_bytes`), what the floor reads
    kernel_bytes_per_expert: int  # the experts' packed tensors (a backend may unpack or pad at load)
    expected_distinct_experts: float
    # Relative L2 difference of this backend's output from the first backend timed on the same cell
    # and inputs (None for that one): a cross-check of the kernels at the real shape.
    compared_with: str | None = None
    rel_diff: float | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", action="append", metavar="NAME",
                        help=f"model preset, repeatable (default: {', '.join(DEFAULT_PRESETS)}; "
                             f"available: {', '.join(PRESETS)})")
    parser.add_argument("--tokens", type=int, nargs="+", metavar="M",
                        help=f"token counts per forward (default: {' '.join(map(str, DEFAULT_TOKENS))})")
    parser.add_argument("--scheme", action="append", metavar="SCHEME",
                        help="bf16 (the preset's dtype, unquantized), int4 (the preset's group size) or any "
                             "`moe run` scheme: int4:G[:zp], int8 (per channel, as int8_w8a16()), int8:G[:zp], "
                             "fp8-tensor[:token|:tensor], fp8-channel[:token|:tensor], fp8-block, mxfp4; "
                             f"repeatable (default: {', '.join(DEFAULT_SCHEMES)})")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or xpu")
    parser.add_argument("--backends", default="chosen", metavar="chosen|all|B1,B2",
                        help="which backends to time: the one the oracle chooses (default), every installed "
                             "backend but the reference (all), or a comma-separated list; each forced backend is "
                             "timed where it serves the layer and its refusal is recorded otherwise. The run "
                             "writes the measured ranking (ranking-<device>.json) next to its results")
    parser.add_argument("--save-ranking", action="store_true",
                        help="also merge the measured ranking into the user's rankings folder "
                             "(~/.cache/moe/rankings), where select() and `moe explain` find it")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"output folder for JSON and PNG (default: ./{DEFAULT_OUT}; created if missing, "
                             "checked for writing before anything is measured; the JSON is rewritten after "
                             "every measured point)")
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats per point (median and min reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    add_threads_argument(parser)
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (matplotlib not needed then)")


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: the physical cores this process may use, "
                             "bounded by its CPU affinity and cgroup CPU quota; reported in the output)")


# ---- helpers `moe run` shares: threads, progress, timing statistics, output files ---------------


def default_threads() -> int:
    """The intra-op threads a timing run should use: torch's default (the physical cores, or
    OMP_NUM_THREADS), bounded by the CPUs of this process's affinity mask and by a cgroup v2 CPU
    quota. More threads than the CPUs really available make every parallel region wait for
    descheduled threads: timings then jump by orders of magnitude from run to run."""
    limits = [torch.get_num_threads()]
    if hasattr(os, "sched_getaffinity"):
        limits.append(len(os.sched_getaffinity(0)))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            limits.append(math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, min(limits))


def pin_threads(requested: int | None) -> int:
    """Set torch's intra-op threads to `requested` (validated >= 1) or `default_threads()`; return it."""
    threads = default_threads() if requested is None else requested
    torch.set_num_threads(threads)
    return threads


def validate_threads(requested: int | None) -> None:
    """More threads than CPUs only oversubscribe them (and torch crashes on absurd counts)."""
    cpus = os.cpu_count() or 1
    if requested is not None and not 1 <= requested <= cpus:
        raise ValueError(f"--threads must be between 1 and {cpus} (the CPUs of this machine), got {requested}")


def _note(text: str) -> None:
    """Progress and warnings go to stderr, so that stdout holds only results."""
    print(text, file=sys.stderr, flush=True)


class Progress:
    """Progress of a loop on stderr: a redrawn bar on a terminal, a line per quarter in logs."""

    def __init__(self, label: str) -> None:
        self.label, self.start, self.tty = label, time.perf_counter(), sys.stderr.isatty()
        self.quarter = 0

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.perf_counter() - self.start
        if self.tty:
            width = 30
            filled = width * done // total
            end = "\n" if done == total else ""
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                             f"({elapsed:.1f}s){end}")
        elif 4 * done // total > self.quarter:
            self.quarter = 4 * done // total
            sys.stderr.write(f"{self.label}: {done}/{total} ({elapsed:.1f}s)\n")
        sys.stderr.flush()


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """Say on stderr that `what` starts and how long it took."""
    _note(f"{what} ...")
    start = time.perf_counter()
    yield
    _note(f"{what}: done in {time.perf_counter() - start:.1f}s")


@dataclass(frozen=True)
class TimingSummary:
    median: float
    min: float
    p90: float

    @property
    def spread(self) -> float:
        """(p90 - min) / min: 0 for steady timings; large on a busy or oversubscribed machine."""
        return (self.p90 - self.min) / self.min if self.min > 0 else 0.0


def summarize_timings(samples: list[float]) -> TimingSummary:
    if not samples:
        raise ValueError("no timing samples: --repeats must be >= 1")
    ordered = sorted(samples)
    return TimingSummary(statistics.median(ordered), ordered[0], ordered[math.ceil(0.9 * len(ordered)) - 1])


def warn_if_unsteady(what: str, timing: TimingSummary) -> None:
    if timing.spread > SPREAD_WARNING:
        _note(f"warning: {what}: timings spread {timing.spread:.0%} above their minimum (p90 "
              f"{timing.p90 * 1e3:.3f} ms, min {timing.min * 1e3:.3f} ms): the machine is busy or has fewer "
              "free cores than threads; compare min times, or lower --threads")


def prepare_out_dir(path: str | os.PathLike) -> Path:
    """Create `path` and check that files can be written in it, before anything is measured."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".moe-write-check-"):
            pass
    except OSError as exc:
        raise ValueError(f"--out {os.fspath(path)!r} is not a writable folder: {exc.strerror or exc}") from None
    return out


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write `payload` to a temporary file next to `path` and rename it over `path`: a reader (or a
    run killed mid-write) sees the previous complete file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # created with the umask's mode, as `path` would be
    try:
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _scheme(text: str, preset: Preset) -> MoEQuantConfig:
    if text == "bf16":
        return unquantized()
    if text == "int4":
        return int4_w4a16(preset.int4_group_size)
    return parse_scheme(text)


def _time(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> list[float]:
    """Seconds per call, one sample per call."""
    return _time_interleaved([fn], device, warmup, repeats)[0]


def _time_interleaved(fns: list[Callable[[], object]], device: torch.device, warmup: int, repeats: int
                      ) -> list[list[float]]:
    """Samples of several functions taken in turn, so that load from other processes on a shared
    machine falls on all of them alike instead of on whichever ran during the busy spell."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    synchronize(device)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, samples):
            start = time.perf_counter()
            fn()
            synchronize(device)
            out.append(time.perf_counter() - start)
    return samples


# The GPU protocol: CUDA events around each call, the first samples (clock ramp-up, allocator) dropped.
CUDA_SAMPLES = 23
CUDA_DROPPED = 3
CUDA_COPY_BYTES = 2 << 30
CUDA_MATMUL_SIZE = 8192


class SmClockSampler:
    """Median SM clock (MHz) over a block, sampled every 5 ms from NVML (`torch.cuda.clock_rate`) on a
    thread; `median` is None where NVML cannot be read (no pynvml, or not an NVIDIA GPU). Heavy
    layers reach the board's power limit and run below the clock of short synchronized matmuls."""

    PERIOD_S = 0.005

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.PERIOD_S):
            self.samples.append(torch.cuda.clock_rate(self.device))

    def __enter__(self) -> SmClockSampler:
        if self.device.type != "cuda":
            return self
        try:
            self.samples.append(torch.cuda.clock_rate(self.device))
        except Exception:  # no NVML here: run without clocks
            return self
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self._thread is not None else None


def _cuda_median_seconds(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(CUDA_SAMPLES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times[CUDA_DROPPED:])


# The CUDA layer protocol: the L2 cache is flushed by writing this many bytes before every replay.
CUDA_L2_FLUSH_BYTES = 256 << 20
# Replays per timed layer: enough for about CUDA_LAYER_BUDGET_S of timed calls, within these bounds.
CUDA_LAYER_REPLAYS = (10, 1000)
CUDA_LAYER_BUDGET_S = 0.06


def _cuda_graphs(layer: Callable, inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[Callable[[], None]]:
    """One CUDA graph per input set, each returned as its replay; warmed up (and compiled) first on a
    side stream, as capture requires."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(*inputs[0])
    torch.cuda.current_stream().wait_stream(stream)
    graphs = []
    for x, logits in inputs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer(x, logits)
        graphs.append(graph)
    return [g.replay for g in graphs]


def time_cuda_layer(layer: Callable, inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[float], str]:
    """(seconds per call samples, method) of `layer` over the input sets taken in turn: replayed from
    CUDA graphs ("cuda-graph"), or called eagerly where capture fails ("cuda-events (eager: why)");
    the L2 cache flushed before every call, CUDA events around it."""
    try:
        calls, method = _cuda_graphs(layer, inputs), "cuda-graph"
    except Exception as exc:  # a layer that cannot be captured is still timed, as it would run
        torch.cuda.synchronize()
        calls = [lambda x=x, lg=lg: layer(x, lg) for x, lg in inputs]
        method = f"cuda-events (eager: capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    flush = torch.empty(CUDA_L2_FLUSH_BYTES, dtype=torch.uint8, device=inputs[0][0].device)
    for i in range(10):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(5):
        calls[i % len(calls)]()
    end.record()
    end.synchronize()
    estimate_s = start.elapsed_time(end) / 5e3
    low, high = CUDA_LAYER_REPLAYS
    replays = max(low, min(high, int(CUDA_LAYER_BUDGET_S / max(estimate_s, 1e-7))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for i, (before, after) in enumerate(events):
        flush.zero_()
        before.record()
        calls[i % len(calls)]()
        after.record()
    torch.cuda.synchronize()
    return [before.elapsed_time(after) / 1e3 for before, after in events], method


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


# Temporaries per parameter of the one expert being drawn, quantized or checked against the fp32
# reference at a time: its fp32 draw and scaled copy, and the fp32/int64 temporaries of quantizing and
# dequantizing it (measured on the CPU: about 9 bytes unquantized, 13 to 21 quantized).
_EXPERT_TEMPORARY_BYTES = {False: 12, True: 24}
# Weights dequantized at load are converted a few experts at a time (7 to 15 bytes per parameter of
# those experts measured, fp8 blocks and mxfp4 the most).
_DEQUANTIZED_CHUNK_EXPERTS = 4
_DEQUANTIZED_CHUNK_BYTES = 16
# Packing integer codes into a kernel layout makes whole-tensor temporaries (moe-cpu: an unpacked uint8
# copy of int4 codes, int16 copies of int8 codes), per parameter of the larger weight tensor.
_PACKING_BYTES = {QuantDType.INT4: 2, QuantDType.INT8: 4}
# What the allocator keeps of freed temporaries and the libraries' workspaces (oneDNN, the reference):
# measured up to about 50 MiB above the terms above on layers of 50M parameters.
_FIXED_OVERHEAD_BYTES = 64 << 20
# Per token and top-k slot, in fp32 elements: the routed input, the gate/up and activated rows, the
# expert output, and their copies in the reference and the naive loop.
_ACTIVATION_COPIES = 4


def _activation_bytes(config: MoEConfig, tokens: int) -> int:
    R, K, N = config.w13_rows, config.hidden_size, config.intermediate_size_per_partition
    return tokens * (config.top_k * _ACTIVATION_COPIES * (R + N + K) + config.num_experts) * 4


def estimate_peak_bytes(config: MoEConfig, quants: list[MoEQuantConfig], tokens: int = 0,
                        dense_baseline: bool = False, accelerator: bool = False) -> int:
    """Peak memory, above what the process held before, of building and running `config` under each
    of `quants` in turn (`moe run`: one scheme; `moe bench`: several, one at a time) for up to
    `tokens` tokens per call.

    Per scheme, the larger of drawing its weights (`ExpertWeights.random` holds the per-expert parts
    and their concatenation: the canonical form twice) and running them (the canonical form and the
    kernel layout, `_packed_bytes_per_param`, with the temporaries of packing integer codes), plus the
    temporaries of one expert (or of the chunk of experts dequantized at once), the activations and a
    fixed allowance for the allocator and libraries. `dense_baseline`: the layer-dtype weights of the
    naive loop stay loaded throughout, and unquantized layers load those (`moe bench`). `accelerator`:
    the layer runs on a GPU, whose kernels keep every scheme's codes (`_packed_bytes_per_param`).
    """
    E = config.num_local_experts
    params = E * (config.w13_rows * config.hidden_size + config.hidden_size * config.intermediate_size_per_partition)
    dense = params * weight_bytes_per_param(config, unquantized())
    activations = _activation_bytes(config, tokens)
    per_scheme = []
    for q in quants:
        canonical = params * weight_bytes_per_param(config, q)
        packed = params * _packed_bytes_per_param(config, q, accelerator)
        if dense_baseline and not q.weight.quantized:  # the layer loads the naive loop's weights
            per_scheme.append(packed + activations)
            continue
        temporaries = params / E * _EXPERT_TEMPORARY_BYTES[q.weight.quantized]
        packing = 0
        if _packs_codes(q) and not accelerator:  # the CPU's ATen packing temporaries
            larger = max(config.w13_rows, config.intermediate_size_per_partition) * config.hidden_size
            packing = E * larger * _PACKING_BYTES[q.weight.dtype]
        if packed > canonical:
            chunk = min(_DEQUANTIZED_CHUNK_EXPERTS, E) / E * params * _DEQUANTIZED_CHUNK_BYTES
            temporaries = max(temporaries, chunk)
        per_scheme.append(max(2 * canonical, canonical + packed + packing) + temporaries + activations)
    if dense_baseline:
        # drawing the dense weights themselves, before they are held
        per_scheme.append(dense + params / E * _EXPERT_TEMPORARY_BYTES[False])
    return int((dense if dense_baseline else 0) + max(per_scheme, default=0) + _FIXED_OVERHEAD_BYTES)


def planned_bytes(config: MoEConfig, quants: list[MoEQuantConfig], tokens: int = 0, accelerator: bool = False) -> int:
    """Peak memory of `moe bench` on `config`: `estimate_peak_bytes` with the naive loop's dense weights."""
    return estimate_peak_bytes(config, quants, tokens, dense_baseline=True, accelerator=accelerator)


# GPU layouts keep the codes but may pad them (K to whole tiles, e.g. gpt-oss's 2880 to 2944).
_ACCELERATOR_PADDING = 1.1


def _packed_bytes_per_param(config: MoEConfig, quant: MoEQuantConfig, accelerator: bool = False) -> float:
    """Upper bound of a kernel layout's size per parameter: on GPUs the codes, padded; on the CPU,
    grouped int4 and per-channel int8 codes repack at their own size and every other format may be
    dequantized at load (where no packed kernel serves it), to the layer dtype, or to fp32 where
    activations are quantized."""
    own = weight_bytes_per_param(config, quant)
    if accelerator:
        return own * _ACCELERATOR_PADDING
    if not quant.weight.quantized or _packs_codes(quant):
        return own
    return max(own, 4.0 if quant.activation is not None else weight_bytes_per_param(config, unquantized()))


def _packs_codes(quant: MoEQuantConfig) -> bool:
    """Whether packed kernels keep the integer codes (grouped int4, per-channel int8) rather than
    dequantizing them at load."""
    key = quant.weight
    return key.quantized and (
        (key.dtype is QuantDType.INT4 and key.scale.granularity is Granularity.GROUP)
        or (key.dtype is QuantDType.INT8 and key.scale.granularity is Granularity.CHANNEL))


def naive_moe(config: MoEConfig, w13: torch.Tensor, w2: torch.Tensor, b13: torch.Tensor | None,
              b2: torch.Tensor | None, correction_bias: torch.Tensor | None
              ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """transformers' eager MoE block: route, then one F.linear pair per expert that got tokens."""

    def forward(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        weights, ids = route_torch(logits, config.routing, config.top_k, correction_bias)
        out = torch.zeros_like(x)
        mask = F.one_hot(ids.long(), config.num_experts).permute(2, 1, 0)  # [E, k, M]
        for e in (mask.sum(dim=(1, 2)) > 0).nonzero().flatten().tolist():
            slot, token = torch.where(mask[e])
            h = F.linear(x[token], w13[e], None if b13 is None else b13[e])
            y = F.linear(apply_activation(h, config.activation), w2[e], None if b2 is None else b2[e])
            out.index_add_(0, token, (y * weights[token, slot, None]).to(x.dtype))
        return out

    return forward


def triton_version() -> str | None:
    """The installed triton's version ("unknown" without metadata), or None where it is not installed."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _distribution_versions() -> dict[str, str]:
    """Versions of moe-core, the installed plugins' distributions and triton."""
    versions = registry().distribution_versions()
    if (triton := triton_version()) is not None:
        versions["triton"] = triton
    return versions


def _machine(device: torch.device, threads: int) -> dict:
    info = detect_device(device)
    return {"device": str(info), "device_name": info.name, "cpu_model": detect_device("cpu").name,
            "cpu_count": os.cpu_count(), "torch_threads": threads, "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "distributions": _distribution_versions(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


class _Results:
    """The run's JSON and the ranking its rows make, rewritten (atomically) after every measured
    point: an interrupted run keeps what it measured."""

    def __init__(self, path: Path, ranking_path: Path, payload: dict) -> None:
        self.path, self.ranking_path = path, ranking_path
        self.payload = {**payload, "complete": False, "rows": [], "refused": []}
        self.save()

    def save(self) -> None:
        write_json_atomic(self.path, self.payload)

    def add_row(self, row: Row) -> None:
        self.payload["rows"].append(asdict(row))
        self.save()
        write_json_atomic(self.ranking_path, self.ranking())

    def ranking(self) -> dict:
        machine = self.payload["machine"]
        return ranking_from_rows(self.payload["rows"], machine["device_name"],
                                 {"date": machine["date"], "torch": machine["torch"],
                                  "distributions": machine["distributions"]}, self.payload["method"])

    def refuse(self, preset: str, reason: str, scheme: str | None = None, backend: str | None = None) -> None:
        self.payload["refused"].append({"preset": preset, "scheme": scheme, "backend": backend, "reason": reason})
        self.save()

    def finish(self) -> None:
        self.payload["complete"] = True
        self.save()

    @property
    def rows(self) -> list[Row]:
        return [Row(**r) for r in self.payload["rows"]]


def _input_sets(config: MoEConfig, tokens: int, device: torch.device, gen: torch.Generator
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(hidden states, router logits) sets of `tokens` tokens: one, or on CUDA the rotating sets the
    graph protocol replays in turn (8, 2 above 512 tokens), so consecutive calls read other activations."""
    sets = 1 if device.type != "cuda" else (8 if tokens <= 512 else 2)
    return [(torch.randn(tokens, config.hidden_size, generator=gen).to(device, config.dtype),
             torch.randn(tokens, config.num_experts, generator=gen).to(device)) for _ in range(sets)]


def _bench_preset(preset: Preset, schemes: list[str], tokens: list[int], backends: list[str | None],
                  device: torch.device, ceilings: Ceilings, args: argparse.Namespace, results: _Results) -> None:
    config = preset.config
    gen = torch.Generator().manual_seed(0)
    correction_bias = (torch.randn(config.num_experts, generator=gen).to(device) * 0.1
                       if config.routing.has_correction_bias else None)
    dtype_name = str(config.dtype).removeprefix("torch.")
    # Drawn where they run: a GPU draws a real-shape layer in a fraction of the CPU's time.
    dense = ExpertWeights.random(config, unquantized(), progress=Progress(f"{preset.name}: {dtype_name} weights"),
                                 device=device)
    naive = naive_moe(config, dense.w13, dense.w2, dense.w13_bias, dense.w2_bias, correction_bias)
    inputs = {m: _input_sets(config, m, device, gen) for m in tokens}
    naive_ms: dict[int, float] = {}  # per token count, timed once per preset on the dense weights
    for scheme in schemes:
        first_outputs: dict[int, tuple[str, torch.Tensor]] = {}  # per token count: (backend, output)
        quant = _scheme(scheme, preset)
        weights = dense
        if quant.weight.quantized:
            weights = ExpertWeights.random(config, quant, progress=Progress(f"{preset.name}: {scheme} weights"),
                                           device=device)
        for backend in backends:
            try:
                layer = FusedMoE(config, quant, device, prefer=backend)
            except BackendUnavailableError as exc:
                reason = str(exc).split("\n\n")[0]
                _note(f"{preset.name}: {scheme}: {reason}")
                results.refuse(preset.name, reason, scheme, backend)
                continue
            try:
                _bench_layer(preset, scheme, quant, layer, weights, correction_bias, inputs, naive, naive_ms,
                             first_outputs, device, ceilings, args, results)
            except (RuntimeError, ValueError, MemoryError) as exc:
                if backend is None:  # the oracle's own choice failing is the user's error to see
                    raise
                # one backend failing to load or run (out of memory, a kernel's own refusal) is its result
                reason = f"{backend} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                _note(f"{preset.name}: {scheme}: {reason}")
                results.refuse(preset.name, reason, scheme, backend)
            del layer
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del weights


def _stored_bytes(value: object) -> int:
    """Bytes of a packed tensor, or of the tensors of canonical weights a backend keeps as they are."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, ExpertWeights):
        return sum(_stored_bytes(t) for n, t in value.tensors().items() if not n.endswith("bias"))
    raise TypeError(f"packed weights hold a {type(value).__name__}, expected tensors")


def _bench_layer(preset: Preset, scheme: str, quant: MoEQuantConfig, layer: FusedMoE, weights: ExpertWeights,
                 correction_bias: torch.Tensor | None, inputs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]],
                 naive: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], naive_ms: dict[int, float],
                 first_outputs: dict[int, tuple[str, torch.Tensor]], device: torch.device, ceilings: Ceilings,
                 args: argparse.Namespace, results: _Results) -> None:
    config, name = preset.config, layer.plan.experts_cls.name()
    with step(f"{preset.name}: {scheme}: converting the weights for {layer.plan.backend} / {name}"):
        layer.load_weights(weights, correction_bias)
    packed = layer.experts.weights
    kernel_bytes = sum(_stored_bytes(t) for n, t in packed.tensors.items() if not n.endswith("bias"))
    kernel_bytes_per_expert = kernel_bytes // config.num_local_experts
    with torch.inference_mode():  # the naive loop runs under it too: neither pays for autograd
        for m, sets in inputs.items():
            output = layer(*sets[0]).float()
            compared_with, rel_diff = first_outputs.setdefault(m, (layer.plan.backend, output))[0], None
            if compared_with != layer.plan.backend:
                reference = first_outputs[m][1]
                rel_diff = float((output - reference).norm() / reference.norm().clamp_min(1e-30))
            else:
                compared_with = None
            del output
            what = f"{preset.name}: {scheme}: {layer.plan.backend}: timing {m} tokens"
            if device.type == "cuda":
                _note(f"{what} (CUDA graphs, L2 flushed before every replay)")
                samples, method = time_cuda_layer(layer, sets)
                if m not in naive_ms:
                    naive_ms[m] = statistics.median(_time(lambda m=m: naive(*inputs[m][0]), device, args.warmup,
                                                          args.repeats)) * 1e3
            else:
                _note(f"{what} ({args.warmup} warmup + {args.repeats} repeats, layer and naive loop in turn)")
                x, logits = sets[0]
                samples, naive_samples = _time_interleaved(
                    [lambda x=x, lg=logits: layer(x, lg), lambda x=x, lg=logits: naive(x, lg)], device, args.warmup,
                    args.repeats)
                naive_ms.setdefault(m, statistics.median(naive_samples) * 1e3)
                method = "wall-clock"
            timing = summarize_timings(samples)
            warn_if_unsteady(f"{preset.name} {scheme} {layer.plan.backend} {m} tokens", timing)
            median = timing.median
            floor = roofline_floor(config, quant, m, ceilings)
            row = Row(preset.name, scheme, m, layer.plan.backend, name, quant.name, quant.family.value,
                      shape_key(config), method, median * 1e3, timing.min * 1e3, timing.p90 * 1e3, timing.spread,
                      m / median, floor.seconds * 1e3, floor.bound, floor.seconds / median, naive_ms[m],
                      naive_ms[m] / (median * 1e3), round(floor.bytes_per_expert), kernel_bytes_per_expert,
                      floor.expected_distinct_experts, compared_with, rel_diff)
            results.add_row(row)
            print(_format_row(row), flush=True)


_HEADER = (f"{'preset':<16} {'scheme':<8} {'M':>5} {'backend':<16} {'ms':>9} {'min ms':>9} {'spread':>6} "
           f"{'tok/s':>9} {'floor ms':>9} {'bound':<7} {'floor/t':>7} {'naive ms':>9} {'speedup':>7} {'diff':>8}")


def _format_row(r: Row) -> str:
    return (f"{r.preset:<16} {r.scheme:<8} {r.tokens:>5} {r.backend:<16} {r.time_ms:>9.3f} {r.min_ms:>9.3f} "
            f"{r.spread:>6.0%} {r.tokens_per_s:>9.1f} {r.floor_ms:>9.3f} {r.floor_bound:<7} {r.floor_fraction:>7.2f} "
            f"{r.naive_ms:>9.3f} {r.speedup_vs_naive:>7.2f} "
            f"{'' if r.rel_diff is None else f'{r.rel_diff:.1e}':>8}")


def _figure(rows: list[Row], title: str):
    """The plot of `rows`: one panel per preset, time and floor per scheme against tokens, under `title`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(r.preset for r in rows))
    fig, axes = plt.subplots(1, len(presets), figsize=(6 * len(presets), 4.5), squeeze=False)
    for ax, name in zip(axes[0], presets):
        mine = [r for r in rows if r.preset == name]
        series = list(dict.fromkeys((r.scheme, r.backend) for r in mine))
        several = len({b for _, b in series}) > 1
        for i, (scheme, backend) in enumerate(series):
            pts = [r for r in mine if (r.scheme, r.backend) == (scheme, backend)]
            color, label = f"C{i % 10}", f"{scheme} {backend}" if several else scheme
            ax.plot([r.tokens for r in pts], [r.time_ms for r in pts], "o-", color=color, label=f"{label} layer")
            if pts[0].backend == next(b for s, b in series if s == scheme):  # one floor per scheme
                ax.plot([r.tokens for r in pts], [r.floor_ms for r in pts], "--", color=color,
                        label=f"{scheme} floor")
        base = [r for r in mine if (r.scheme, r.backend) == series[0]]
        ax.plot([r.tokens for r in base], [r.naive_ms for r in base], ":", color="gray", label="naive loop (dtype)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per forward")
        ax.set_ylabel("ms per layer (median)")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    # A one-preset figure is narrower than a long device name: the title wraps to the figure's width
    # and the panels are laid out below it.
    fig.suptitle(title, fontsize=9, wrap=True)
    fig.tight_layout()
    return fig


def _plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    fig = _figure(rows, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save_ranking(ranking: dict, folder: Path | None = None) -> Path:
    """Merge `ranking` into the device's file in `folder` (default: the user's rankings folder):
    entries measured now replace those of the same scheme, shape and token bucket."""
    folder = folder if folder is not None else user_rankings_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ranking-{_slug(ranking['device'])}.json"
    merged = {(e["scheme"], e["shape"], e["tokens"]): e for e in ranking["entries"]}
    if path.exists():
        load_ranking(path)  # a broken file is reported, not overwritten
        old = json.loads(path.read_text())
        merged = {**{(e["scheme"], e["shape"], e["tokens"]): e for e in old["entries"]}, **merged}
    write_json_atomic(path, {**ranking, "entries": [merged[k] for k in sorted(merged)]})
    return path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _unique(values: list) -> list:
    return list(dict.fromkeys(values))


def _backends(text: str) -> list[str | None]:
    """--backends as FusedMoE's `prefer` values: [None] for the oracle's choice."""
    text = text.strip().lower()
    if text == "chosen":
        return [None]
    reg = registry()
    installed = sorted(reg.backends() - {REFERENCE_BACKEND})
    if text == "all":  # the backends of plugins that can run here; the others are listed, not timed
        not_ready = {s.name: f"{s.state.value}: {s.reason}" for s in reg.statuses.values()
                     if s.state is not PluginState.READY}
        if not_ready:
            _note("--backends all: not timed (plugin not ready here): "
                  + "; ".join(f"{name} ({why})" for name, why in sorted(not_ready.items())))
        return sorted({r.backend for s in reg.statuses.values() if s.state is PluginState.READY and s.spec
                       for r in s.spec.experts} - {REFERENCE_BACKEND})
    named = _unique([b.strip() for b in text.split(",") if b.strip()])
    unknown = [b for b in named if b not in installed and b != REFERENCE_BACKEND]
    if unknown or not named:
        raise ValueError(f"--backends {text!r}: {', '.join(unknown) or 'no backend'} not installed; expected chosen, "
                         f"all, or a comma-separated list of {', '.join([*installed, REFERENCE_BACKEND])}")
    return list(named)


def _validated(args: argparse.Namespace
               ) -> tuple[list[Preset], torch.device, list[int], list[str], list[str | None]]:
    """Every argument checked before anything is measured or allocated; ValueError says what is wrong."""
    presets = [get_preset(p) for p in _unique(args.preset or DEFAULT_PRESETS)]
    device = detect_device(args.device).torch_device
    backends = _backends(args.backends)
    tokens = _unique(args.tokens or DEFAULT_TOKENS)
    schemes = _unique(args.scheme or DEFAULT_SCHEMES)
    bad = [m for m in tokens if m < 1]
    if bad:
        raise ValueError(f"--tokens must be >= 1, got {bad}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1 (the median of no samples is undefined), got {args.repeats}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    validate_threads(args.threads)
    for preset in presets:
        too_many = [m for m in tokens if m > preset.config.max_num_tokens]
        if too_many:
            raise ValueError(f"--tokens {too_many} exceed the {preset.name} layer's max_num_tokens "
                             f"({preset.config.max_num_tokens})")
        for scheme in schemes:
            refusals = []
            for backend in backends:  # the plans are made before any weight exists
                try:
                    select(preset.config, _scheme(scheme, preset), device, backend)
                except (ValueError, NoBackendError, BackendUnavailableError) as exc:
                    refusals.append(str(exc))
            # a scheme that none of several backends serves is that cell's result, recorded when run
            if refusals and backends == [None]:
                raise ValueError(f"{preset.name} with --scheme {scheme!r}: {refusals[0]}")
    return presets, device, tokens, schemes, backends


def main(args: argparse.Namespace) -> int:
    """`moe bench`: 0 when every preset ran, 1 when one was refused for memory, 2 on bad arguments
    (the message on stderr), 130 when interrupted (the points measured so far are in the JSON)."""
    try:
        presets, device, tokens, schemes, backends = _validated(args)
        out = prepare_out_dir(args.out)
    except ValueError as exc:
        print(f"moe bench: error: {exc}", file=sys.stderr)
        return 2
    threads = pin_threads(args.threads)
    machine = _machine(device, threads)
    stem = (f"bench-{_slug(machine['device'])}-{machine['cpu_count']}cpu-{threads}t-torch{_slug(torch.__version__)}-"
            f"{datetime.datetime.now(datetime.UTC).strftime('%Y%m%dT%H%M%SZ')}")
    json_path, png_path = out / f"{stem}.json", out / f"{stem}.png"
    ranking_path = out / f"ranking-{_slug(machine['device_name'] or machine['device'])}.json"
    _note(f"{machine['device']}, {machine['cpu_count']} cpus, torch {machine['torch']}, {threads} threads "
          f"({'--threads' if args.threads else 'default: physical cores available to this process'}); "
          f"results: {json_path}")
    results = _Results(json_path, ranking_path, {
        "machine": machine, "repeats": args.repeats, "warmup": args.warmup,
        "method": ("CUDA graphs over rotating input sets, L2 flushed before every replay, CUDA events"
                   if device.type == "cuda" else "wall clock") +
                  "; median, min and p90 of the samples per point; floor = max(expected distinct experts * the "
                  "scheme's stored bytes per expert / copy bandwidth, flops / matmul rate); naive = per-expert "
                  "F.linear loop"})
    try:
        with step("measuring the copy bandwidth and matmul rate"):
            ceilings = measure_ceilings(device, presets[0].config.dtype, host_samples=max(args.repeats // 2, 5))
        results.payload["ceilings"] = asdict(ceilings)
        results.save()
        print(f"{machine['device']}, {machine['cpu_count']} cpus, torch {machine['torch']}, {threads} threads")
        print(f"ceilings: copy {ceilings.copy_bytes_per_s / 1e9:.1f} GB/s (read+write), {ceilings.matmul_dtype} "
              f"matmul {ceilings.matmul_flop_per_s / 1e9:.1f} GFLOP/s\n")
        print(_HEADER, flush=True)
        available = available_memory_bytes(device)
        for preset in presets:
            quants = [_scheme(s, preset) for s in schemes]
            need = planned_bytes(preset.config, quants, max(tokens), accelerator=device.type != "cpu")
            if need > MEMORY_HEADROOM * available:
                reason = (f"needs about {need / 2**30:.1f} GiB ({', '.join(schemes)}, up to {max(tokens)} tokens), "
                          f"{MEMORY_HEADROOM:.0%} of the {available / 2**30:.1f} GiB available is "
                          f"{MEMORY_HEADROOM * available / 2**30:.1f} GiB; not run")
                print(f"{preset.name}: {reason}", flush=True)
                results.refuse(preset.name, reason)
                continue
            _bench_preset(preset, schemes, tokens, backends, device, ceilings, args, results)
        results.finish()
    except KeyboardInterrupt:
        _note(f"moe bench: interrupted; the {len(results.payload['rows'])} points measured are in {json_path}")
        return 130
    finally:
        if args.save_ranking and results.payload["rows"]:
            _note(f"merged the measured ranking into {save_ranking(results.ranking())}")
    _note(f"wrote {json_path} and {ranking_path}")
    rows = results.rows
    if rows and not args.no_plot:
        _plot(rows, png_path, f"{machine['device']}, {threads} threads, torch {torch.__version__}, {machine['date']}")
        _note(f"wrote {png_path}")
    return 0 if rows or not presets else 1
