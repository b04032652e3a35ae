"""`moe bench`: time whole MoE layers against the machine's own ceilings and a naive per-expert loop,
and the one definition of those ceilings and of the roofline floor (benchmarks/gpu uses them too).

For each preset, scheme and token count it times `FusedMoE` (routing + experts) and reports the
fraction of the roofline floor it reaches (`roofline_floor`):

    floor = max(expected distinct experts * weight bytes per expert / copy bandwidth,
                2 * M * top_k * (R + N) * K / matmul rate)

with the expected number of distinct experts E * (1 - (1 - top_k / E) ** M) for uniform routing and
the weight bytes of the scheme as stored: codes plus scales, zero points and act-order indices
(`expert_weight_bytes`). The ceilings (`measure_ceilings`) are measured in the same run: the copy
bandwidth (bytes read + written of a large copy) and the rate of a large matmul in the layer dtype.
The naive baseline is the loop of transformers' eager MoE blocks: route, then `F.linear` per expert
that got tokens, in the layer dtype.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from moe_core.backends import available_memory_bytes, detect_device, synchronize
from moe_core.config import MoEConfig
from moe_core.layer import FusedMoE
from moe_core.oracle import NoBackendError, select
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
from moe_core.reference import apply_activation
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights

__all__ = ["Ceilings", "Floor", "SmClockSampler", "add_arguments", "expected_distinct_experts", "expert_weight_bytes",
           "main", "measure_ceilings", "planned_bytes", "roofline_floor", "weight_bytes_per_param"]

DEFAULT_PRESETS = ("tiny", "qwen3-30b-a3b")
DEFAULT_TOKENS = (1, 8, 32, 128)
DEFAULT_SCHEMES = ("bf16", "int4")
# Fraction of the available memory a preset may plan to use; the rest is for torch and the OS.
MEMORY_HEADROOM = 0.8


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
    scheme: str
    tokens: int
    experts: str  # the experts class the oracle chose
    time_ms: float  # median
    min_ms: float
    tokens_per_s: float
    floor_ms: float
    floor_bound: str  # "memory" or "compute"
    floor_fraction: float  # floor / median time
    naive_ms: float  # median of the naive per-expert loop
    speedup_vs_naive: float
    bytes_per_expert: int  # the scheme's stored bytes (`expert_weight_bytes`), what the floor reads
    kernel_bytes_per_expert: int  # the experts' packed tensors (a backend may unpack or pad at load)
    expected_distinct_experts: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", action="append", metavar="NAME",
                        help=f"model preset, repeatable (default: {', '.join(DEFAULT_PRESETS)}; "
                             f"available: {', '.join(PRESETS)})")
    parser.add_argument("--tokens", type=int, nargs="+", metavar="M",
                        help=f"token counts per forward (default: {' '.join(map(str, DEFAULT_TOKENS))})")
    parser.add_argument("--scheme", action="append", metavar="SCHEME",
                        help="bf16 (the preset's dtype, unquantized), int4 (the preset's group size) or any "
                             "`moe run` scheme: int4:G[:zp], int8[:G[:zp]], fp8-tensor, fp8-channel, fp8-block, "
                             f"mxfp4; repeatable (default: {', '.join(DEFAULT_SCHEMES)})")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or xpu")
    parser.add_argument("--out", default="benchmarks/results", help="output folder for JSON and PNG")
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats per point (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's own choice, reported in the output)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (matplotlib not needed then)")


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


def planned_bytes(config: MoEConfig, quants: list[MoEQuantConfig]) -> int:
    """Peak memory of benchmarking `config`: the layer-dtype weights (the unquantized layer and the
    naive loop share them) plus the worst quantized scheme, loaded one at a time: its canonical form
    twice (`ExpertWeights.random` concatenates per-expert parts), its kernel layout, and the int64 and
    fp32 temporaries (about 32 bytes per parameter) of dequantizing a few experts at a time."""
    E = config.num_local_experts
    params = E * (config.w13_rows * config.hidden_size + config.hidden_size * config.intermediate_size_per_partition)
    dense = params * weight_bytes_per_param(config, unquantized())
    chunk_temporaries = min(4, E) / E * params * 32
    quantized = [params * (2 * weight_bytes_per_param(config, q) + _packed_bytes_per_param(config, q))
                 + chunk_temporaries for q in quants if q.weight.quantized]
    return int(dense + max(quantized, default=0))


def _packed_bytes_per_param(config: MoEConfig, quant: MoEQuantConfig) -> float:
    """Upper bound of a kernel layout's size: integer codes repack at their own size; other formats
    may be dequantized at load, to the layer dtype, or to fp32 where activations are quantized."""
    if quant.weight.dtype in (QuantDType.INT4, QuantDType.INT8):
        return weight_bytes_per_param(config, quant)
    return 4.0 if quant.activation is not None else weight_bytes_per_param(config, unquantized())


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


def _machine(device: torch.device, threads: int) -> dict:
    info = detect_device(device)
    return {"hostname": platform.node(), "device": str(info), "cpu_model": detect_device("cpu").name,
            "cpu_count": os.cpu_count(), "torch_threads": threads, "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def _bench_preset(preset: Preset, schemes: list[str], tokens: list[int], device: torch.device,
                  ceilings: Ceilings, args: argparse.Namespace) -> list[Row]:
    config = preset.config
    E, K = config.num_experts, config.hidden_size
    gen = torch.Generator().manual_seed(0)
    correction_bias = torch.randn(E, generator=gen).to(device) * 0.1 if config.routing.has_correction_bias else None
    dense = ExpertWeights.random(config, unquantized()).to(device)
    naive = naive_moe(config, dense.w13, dense.w2, dense.w13_bias, dense.w2_bias, correction_bias)
    inputs = {m: (torch.randn(m, K, generator=gen).to(device, config.dtype), torch.randn(m, E, generator=gen).to(device))
              for m in tokens}
    rows = []
    for scheme in schemes:
        rows.extend(_bench_scheme(preset, scheme, dense, correction_bias, inputs, naive, device, ceilings, args))
    return rows


def _bench_scheme(preset: Preset, scheme: str, dense: ExpertWeights, correction_bias: torch.Tensor | None,
                  inputs: dict[int, tuple[torch.Tensor, torch.Tensor]],
                  naive: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  device: torch.device, ceilings: Ceilings, args: argparse.Namespace) -> list[Row]:
    config = preset.config
    quant = _scheme(scheme, preset)
    layer = FusedMoE(config, quant, device)
    layer.load_weights(dense if not quant.weight.quantized else ExpertWeights.random(config, quant).to(device),
                       correction_bias)
    packed = layer.experts.weights
    kernel_bytes = sum(t.numel() * t.element_size() for n, t in packed.tensors.items() if not n.endswith("bias"))
    kernel_bytes_per_expert = kernel_bytes // config.num_local_experts
    rows = []
    with torch.inference_mode():  # the naive loop runs under it too: neither pays for autograd
        for m in inputs:
            samples, naive_samples = _time_interleaved(
                [lambda m=m: layer(*inputs[m]), lambda m=m: naive(*inputs[m])], device, args.warmup, args.repeats)
            median, best = statistics.median(samples), min(samples)
            naive_ms = statistics.median(naive_samples) * 1e3
            floor = roofline_floor(config, quant, m, ceilings)
            row = Row(preset.name, scheme, m, layer.plan.experts_cls.name(), median * 1e3, best * 1e3, m / median,
                      floor.seconds * 1e3, floor.bound, floor.seconds / median, naive_ms, naive_ms / (median * 1e3),
                      round(floor.bytes_per_expert), kernel_bytes_per_expert, floor.expected_distinct_experts)
            rows.append(row)
            print(_format_row(row), flush=True)
    return rows


_HEADER = (f"{'preset':<16} {'scheme':<8} {'M':>5} {'experts':<24} {'ms':>9} {'min ms':>9} {'tok/s':>9} "
           f"{'floor ms':>9} {'bound':<7} {'floor/t':>7} {'naive ms':>9} {'speedup':>7}")


def _format_row(r: Row) -> str:
    return (f"{r.preset:<16} {r.scheme:<8} {r.tokens:>5} {r.experts:<24} {r.time_ms:>9.3f} {r.min_ms:>9.3f} "
            f"{r.tokens_per_s:>9.1f} {r.floor_ms:>9.3f} {r.floor_bound:<7} {r.floor_fraction:>7.2f} "
            f"{r.naive_ms:>9.3f} {r.speedup_vs_naive:>7.2f}")


def _plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(r.preset for r in rows))
    fig, axes = plt.subplots(1, len(presets), figsize=(6 * len(presets), 4.5), squeeze=False)
    for ax, name in zip(axes[0], presets):
        mine = [r for r in rows if r.preset == name]
        for i, scheme in enumerate(dict.fromkeys(r.scheme for r in mine)):
            pts = [r for r in mine if r.scheme == scheme]
            color = f"C{i}"
            ax.plot([r.tokens for r in pts], [r.time_ms for r in pts], "o-", color=color, label=f"{scheme} layer")
            ax.plot([r.tokens for r in pts], [r.floor_ms for r in pts], "--", color=color, label=f"{scheme} floor")
        base = [r for r in mine if r.scheme == mine[0].scheme]
        ax.plot([r.tokens for r in base], [r.naive_ms for r in base], ":", color="gray", label="naive loop (dtype)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per forward")
        ax.set_ylabel("ms per layer (median)")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def main(args: argparse.Namespace) -> int:
    try:
        presets = [get_preset(p) for p in (args.preset or DEFAULT_PRESETS)]
        device = detect_device(args.device).torch_device
    except ValueError as exc:
        print(f"moe bench: {exc}")
        return 2
    tokens = list(args.tokens or DEFAULT_TOKENS)
    schemes = list(args.scheme or DEFAULT_SCHEMES)
    if any(m < 1 for m in tokens) or args.repeats < 1 or args.warmup < 0:
        print(f"moe bench: --tokens must be >= 1 (got {tokens}), --repeats >= 1 (got {args.repeats}), "
              f"--warmup >= 0 (got {args.warmup})")
        return 2
    for preset in presets:
        for scheme in schemes:
            try:  # the plan is made before any weight exists: a scheme no backend serves stops here
                select(preset.config, _scheme(scheme, preset), device)
            except (ValueError, NoBackendError) as exc:
                print(f"moe bench: {preset.name} with --scheme {scheme!r}: {exc}")
                return 2
    if args.threads is not None:
        if args.threads < 1:
            print(f"moe bench: --threads must be >= 1, got {args.threads}")
            return 2
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    machine = _machine(device, threads)
    dtype = presets[0].config.dtype
    ceilings = measure_ceilings(device, dtype, host_samples=max(args.repeats // 2, 5))
    print(f"{machine['device']}, {machine['cpu_count']} cpus, torch {machine['torch']}, {threads} threads")
    print(f"ceilings: copy {ceilings.copy_bytes_per_s / 1e9:.1f} GB/s (read+write), {ceilings.matmul_dtype} matmul "
          f"{ceilings.matmul_flop_per_s / 1e9:.1f} GFLOP/s\n")
    print(_HEADER)

    rows: list[Row] = []
    refused: list[dict] = []
    available = available_memory_bytes(device)
    for preset in presets:
        quants = [_scheme(s, preset) for s in schemes]
        need = planned_bytes(preset.config, quants)
        if need > MEMORY_HEADROOM * available:
            reason = (f"needs about {need / 2**30:.1f} GiB for its weights ({', '.join(schemes)}), "
                      f"{MEMORY_HEADROOM:.0%} of the {available / 2**30:.1f} GiB available is "
                      f"{MEMORY_HEADROOM * available / 2**30:.1f} GiB; not run")
            print(f"{preset.name}: {reason}")
            refused.append({"preset": preset.name, "reason": reason})
            continue
        rows.extend(_bench_preset(preset, schemes, tokens, device, ceilings, args))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = (f"bench-{_slug(machine['device'])}-{machine['cpu_count']}cpu-{threads}t-torch{_slug(torch.__version__)}-"
            f"{datetime.datetime.now(datetime.UTC).strftime('%Y%m%dT%H%M%SZ')}")
    payload = {"machine": machine, "ceilings": asdict(ceilings), "repeats": args.repeats, "warmup": args.warmup,
               "rows": [asdict(r) for r in rows], "refused": refused,
               "method": "median of repeats per point; floor = max(expected distinct experts * the scheme's stored "
                         "bytes per expert / copy bandwidth, flops / matmul rate); naive = per-expert F.linear loop"}
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {out / f'{stem}.json'}")
    if rows and not args.no_plot:
        _plot(rows, out / f"{stem}.png", f"{machine['device']} {threads} threads, torch {torch.__version__}, "
                                         f"{machine['date']}")
        print(f"wrote {out / f'{stem}.png'}")
    return 0 if rows or not presets else 1
