"""Timing for `moe bench` and `moe run`: thread pinning, progress on stderr, sample statistics,
and the CUDA protocol (`time_cuda_layer`: CUDA graphs over rotating input sets, the L2 flushed before
every replay, CUDA events around each) that benchmarks/gpu uses too."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from moe_core.backends import synchronize

# (p90 - min) / min of a cell's samples above which its timings are flagged as unsteady.
SPREAD_WARNING = 0.5


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


def mean_call_seconds(samples: list[float], sets: int) -> float:
    """The mean call over `sets` input sets timed in turn (sample i on set i % sets): each set's
    median, averaged; with one set, the median. Sets of a few tokens route to different numbers of
    experts, so the median of all samples would be one set's time, not the mean call the floor of
    their mean work (`routed_work`) bounds."""
    if not 1 <= sets <= len(samples):
        raise ValueError(f"{len(samples)} timing samples cannot cover {sets} input sets")
    return statistics.fmean(statistics.median(samples[s::sets]) for s in range(sets))


def warn_if_unsteady(what: str, timing: TimingSummary) -> None:
    if timing.spread > SPREAD_WARNING:
        _note(f"warning: {what}: timings spread {timing.spread:.0%} above their minimum (p90 "
              f"{timing.p90 * 1e3:.3f} ms, min {timing.min * 1e3:.3f} ms): the machine is busy or has fewer "
              "free cores than threads; compare min times, or lower --threads")


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


def _cuda_seconds(fn: Callable[[], object]) -> list[float]:
    """Seconds of CUDA_SAMPLES calls of `fn` (CUDA events around each), the first CUDA_DROPPED left out."""
    times = []
    for _ in range(CUDA_SAMPLES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times[CUDA_DROPPED:]


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
