"""The machine's ceilings and the roofline floor of a layer call: the one definition `moe bench`,
benchmarks/gpu and the docs use.

    floor = max(distinct experts * weight bytes per expert / memory bandwidth,
                2 * routed pairs * (R + N) * K / matmul rate of the scheme's compute type)

- distinct experts: the experts the timed calls' routing really selects (`routed_work`: the
  reference router on the very router logits timed; over input sets timed in turn, their mean, as
  the layer's time is the mean of each set's median call), never an expectation for uniform routing,
  which grouped or biased routings (DeepSeek-V3) undercut;
- weight bytes per expert: the scheme as stored, codes plus scales, zero points and act-order
  indices (`expert_weight_bytes`);
- routed pairs: tokens x top_k (under expert parallelism, the pairs sent to this rank's experts);
- the ceilings (`measure_ceilings`), measured in the same run: the bandwidth (bytes read + written
  of a large copy; on CUDA the faster of that and a plain read of the same bytes, since a layer only
  reads its weights) and large-matmul rates. On CUDA the rate of each compute type a scheme
  uses (`compute_dtype`): the layer dtype for 16-bit and weight-only schemes, which multiply in it,
  fp8 for fp8 W8A8; on the CPU and XPU the layer dtype's rate serves every scheme.

A layer cannot beat its floor: a measured time below it by more than 2% (`IMPOSSIBLE_FRACTION`)
means the floor or the timing is wrong.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from moe_core.bench.timing import CUDA_DROPPED, CUDA_SAMPLES, SmClockSampler, _cuda_seconds, _time
from moe_core.config import MoEConfig
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType, QuantKey, ZeroPoint
from moe_core.routing import route_torch

# floor / time above this is impossible; the 2% allow for the ceilings' own run-to-run noise.
IMPOSSIBLE_FRACTION = 1.02


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float  # bytes read + written per second by a large copy on the device
    # Large square matmuls, per operand dtype name ("bfloat16", "float8_e4m3fn"): the layer dtype
    # everywhere, and on CUDA fp8 where the GPU multiplies it (torch._scaled_mm).
    matmul_flop_per_s: dict[str, float]
    matmul_dtype: str  # the layer dtype: the rate of a compute type with none of its own measured here
    copy_bytes: int  # size of the copied tensor
    matmul_size: int  # n of the n x n x n matmuls
    matmul_sm_clock_mhz: float | None  # median SM clock while the matmuls ran (CUDA with NVML), else None
    method: str
    # Bytes per second of the fastest plain read of the copied tensor (`read_kernels`; `method` names
    # it): CUDA only, else None.
    read_bytes_per_s: float | None = None

    @property
    def memory_bytes_per_s(self) -> float:
        """The memory floor's bandwidth: the faster of the copy and the plain read. A layer only reads
        its weights, and a GPU may read faster than it copies (an H200 ran mixtral-8x7b at 32 tokens,
        which reads all 8 experts, at 1.03 of a copy-based floor)."""
        return max(self.copy_bytes_per_s, self.read_bytes_per_s or 0.0)

    def matmul_rate(self, dtype: torch.dtype) -> tuple[str, float]:
        """(dtype name, flop/s) of GEMMs with `dtype` operands: its own measured rate, else the layer
        dtype's (the CPU and XPU measure that one only; a GPU without fp8 matmuls computes fp8
        schemes in it)."""
        name = _dtype_name(dtype)
        if name in self.matmul_flop_per_s:
            return name, self.matmul_flop_per_s[name]
        return self.matmul_dtype, self.matmul_flop_per_s[self.matmul_dtype]


@dataclass(frozen=True)
class RoutedWork:
    """What a layer call does on this rank under a given routing."""

    experts: float  # distinct experts selected: the experts whose weights the call reads (a mean over sets)
    pairs: float  # (token, expert) pairs: the rows the GEMMs multiply (a mean over sets)


@dataclass(frozen=True)
class Floor:
    seconds: float  # max(memory_s, compute_s)
    bound: str  # "memory" or "compute"
    memory_s: float
    compute_s: float
    distinct_experts: float  # `RoutedWork.experts` the memory floor counts
    bytes_per_expert: float
    matmul_dtype: str  # the rate the compute floor uses (`Ceilings.matmul_rate`)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---- ceilings ---------------------------------------------------------------------------------------

CUDA_COPY_BYTES = 2 << 30
CUDA_MATMUL_SIZE = 8192
# The GEMMs' operand type of schemes that quantize their activations (MoEQuantConfig allows fp8 only).
_ACTIVATION_COMPUTE_DTYPES = {QuantDType.FP8_E4M3: torch.float8_e4m3fn}


def compute_dtype(config: MoEConfig, quant: MoEQuantConfig) -> torch.dtype:
    """The operand type of the scheme's GEMMs: the quantized activations' (fp8 W8A8), else the layer
    dtype (16-bit schemes, and weight-only ones, which dequantize their weights to it)."""
    if quant.activation is None:
        return config.dtype
    return _ACTIVATION_COMPUTE_DTYPES[quant.activation.dtype]


def _matmul(n: int, dtype: torch.dtype, device: torch.device) -> Callable[[], torch.Tensor]:
    """An n x n x n matmul with `dtype` operands: fp8 through torch._scaled_mm (unit scales, bf16
    out, the second operand column-major as it requires), else `a @ b`."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    if dtype == torch.float8_e4m3fn:
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return lambda: a @ b


# Columns of the bf16 matrix the read ceiling's GEMV and skinny GEMM stream through.
_READ_COLUMNS = 8192


def read_kernels(src: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """Kernels that each read all of `src` (bytes, a multiple of 2 * _READ_COLUMNS) once and write
    next to nothing: a float32 sum, a bf16 matrix-vector product, a bf16 GEMM with 16 columns (the
    shape of a decode step's weight stream) and, on a GPU where Triton runs, plain streaming reads
    (`_stream_read`). No torch kernel reads at the full rate on every GPU (an H200's fp32 sum read
    4.2-4.4 TB/s where bf16 MoE layers streamed their weights at up to 4.6), so the read ceiling is
    the fastest of them."""
    matrix = src.view(torch.bfloat16).view(-1, _READ_COLUMNS)
    vector = torch.ones(_READ_COLUMNS, dtype=torch.bfloat16, device=src.device)
    columns = torch.ones(_READ_COLUMNS, 16, dtype=torch.bfloat16, device=src.device)
    readers = {"fp32 sum": src.view(torch.float32).sum, "bf16 gemv": lambda: torch.mv(matrix, vector),
               "bf16 gemm x16": lambda: matrix @ columns}
    if src.device.type == "cuda":
        try:
            from moe_core.bench._stream_read import stream_readers
        except ImportError:  # torch without Triton: torch's readers alone
            return readers
        readers.update(stream_readers(src))
    return readers


def _cuda_best_seconds(fn: Callable[[], object]) -> float:
    """The fastest of `fn`'s CUDA-event samples: a ceiling is what the machine can do, and a job's
    first samples may run below it, below what the layers timed later in the job reach
    (docs/design/validation.md, "The roofline floor")."""
    return min(_cuda_seconds(fn))


def _cuda_stream_seconds(device: torch.device) -> tuple[float, float, str]:
    """Seconds of a device-to-device copy of CUDA_COPY_BYTES, and of the fastest plain read of them
    (`read_kernels`) with its name."""
    src = torch.ones(CUDA_COPY_BYTES, device=device, dtype=torch.uint8)
    dst = torch.empty_like(src)
    reads = {name: _cuda_best_seconds(kernel) for name, kernel in read_kernels(src).items()}
    fastest = min(reads, key=reads.get)
    return _cuda_best_seconds(lambda: dst.copy_(src)), reads[fastest], fastest


def _measure_cuda_ceilings(device: torch.device, dtype: torch.dtype) -> Ceilings:
    copy_s, read_s, reader = _cuda_stream_seconds(device)
    n, fp8, note = CUDA_MATMUL_SIZE, torch.float8_e4m3fn, ""
    with SmClockSampler(device) as clock:
        rates = {_dtype_name(dtype): 2 * n**3 / _cuda_best_seconds(_matmul(n, dtype, device))}
        try:
            rates[_dtype_name(fp8)] = 2 * n**3 / _cuda_best_seconds(_matmul(n, fp8, device))
        except (RuntimeError, NotImplementedError) as exc:  # no fp8 matmul on this GPU
            note = (f"; no fp8 matmul here ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}): fp8 "
                    f"schemes use the {_dtype_name(dtype)} rate")
    torch.cuda.empty_cache()
    return Ceilings(copy_bytes_per_s=2 * CUDA_COPY_BYTES / copy_s, matmul_flop_per_s=rates,
                    matmul_dtype=_dtype_name(dtype), copy_bytes=CUDA_COPY_BYTES, matmul_size=n,
                    matmul_sm_clock_mhz=clock.median,
                    method=f"CUDA events, fastest of {CUDA_SAMPLES - CUDA_DROPPED} samples after dropping the first "
                           f"{CUDA_DROPPED}; "
                           f"read: {reader}" + note, read_bytes_per_s=CUDA_COPY_BYTES / read_s)


def _measure_host_timed_ceilings(device: torch.device, dtype: torch.dtype, samples: int) -> Ceilings:
    copy_bytes = 256 << 20
    n = 2048 if device.type == "cpu" else 8192
    src = torch.ones(copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    matmul = _matmul(n, dtype, device)
    threads = torch.get_num_threads()
    copy_s, mm_s = float("inf"), float("inf")
    try:
        for t in sorted({1, threads}) if device.type == "cpu" else [threads]:
            torch.set_num_threads(t)
            copy_s = min(copy_s, min(_time(lambda: dst.copy_(src), device, 2, samples)))
            mm_s = min(mm_s, min(_time(matmul, device, 2, samples)))
    finally:
        torch.set_num_threads(threads)
    threads_note = " at 1 thread and at the configured count" if device.type == "cpu" else ""
    return Ceilings(copy_bytes_per_s=2 * copy_bytes / copy_s, matmul_flop_per_s={_dtype_name(dtype): 2 * n**3 / mm_s},
                    matmul_dtype=_dtype_name(dtype), copy_bytes=copy_bytes, matmul_size=n,
                    matmul_sm_clock_mhz=None, method=f"wall clock, best of {samples} samples{threads_note}")


def measure_ceilings(device: torch.device | str, dtype: torch.dtype, host_samples: int = 10) -> Ceilings:
    """The copy bandwidth (bytes read + written) and matmul rates of `device`: the ceilings of `roofline_floor`.

    CUDA: a 2 GiB device-to-device copy and the fastest plain read of the same bytes (`read_kernels`), and 8192^3
    matmuls in `dtype` (the layer dtype) and in fp8
    (torch._scaled_mm; left out, and said in `method`, where the GPU has none), timed with CUDA
    events, the fastest of 20 samples after dropping the first 3; the SM clock is sampled while the
    matmuls run. CPU and XPU: a 256 MiB copy and a 2048^3 (XPU: 8192^3) matmul in `dtype` timed by
    the wall clock, the best of `host_samples` samples (ceilings are peaks); on the CPU the best of
    one thread and the configured thread count (on small shared machines one thread often copies
    faster than two).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return _measure_cuda_ceilings(device, dtype)
    return _measure_host_timed_ceilings(device, dtype, host_samples)


# The quick ceilings, measured at the run's start and again after every cell: a copy large enough to
# stream past the caches (a GPU's L2, a CPU's L3) and a matmul of the layer dtype at the configured
# threads (on a shared CPU, descheduled threads slow parallel regions more than copies), each costing
# milliseconds.
QUICK_COPY_BYTES = {"cuda": 256 << 20, "host": 64 << 20}
QUICK_MATMUL_SIZE = {"cuda": 4096, "host": 512}
QUICK_SAMPLES_HOST = 5
# A cell whose quick ceilings moved further than this from the run's start is flagged: its time and
# floor fraction were measured on a machine slower (or faster) than the one the ceilings saw.
RECHECK_TOLERANCE = 0.2


@dataclass(frozen=True)
class QuickCeilings:
    copy_bytes_per_s: float
    matmul_flop_per_s: float  # in the layer dtype


def quick_ceilings(device: torch.device | str, dtype: torch.dtype) -> QuickCeilings:
    """A quick copy and matmul (CUDA: a 256 MiB copy and a 4096^3 matmul, CUDA events, median of 20
    after the first 3; elsewhere a 64 MiB copy and a 512^3 matmul, wall clock, median of 5): taken
    before and after each cell, they say whether the machine's speed moved while it was timed (other
    processes' load), which a cell whose samples are all slow alike cannot show by its spread."""
    device = torch.device(device)
    kind = "cuda" if device.type == "cuda" else "host"
    nbytes, n = QUICK_COPY_BYTES[kind], QUICK_MATMUL_SIZE[kind]
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    matmul = _matmul(n, dtype, device)
    if kind == "cuda":
        copy_s = statistics.median(_cuda_seconds(lambda: dst.copy_(src)))
        matmul_s = statistics.median(_cuda_seconds(matmul))
    else:
        copy_s = statistics.median(_time(lambda: dst.copy_(src), device, 1, QUICK_SAMPLES_HOST))
        matmul_s = statistics.median(_time(matmul, device, 1, QUICK_SAMPLES_HOST))
    return QuickCeilings(2 * nbytes / copy_s, 2 * n**3 / matmul_s)


# ---- the floor --------------------------------------------------------------------------------------

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



def routed_work(config: MoEConfig, router_logits: Iterable[torch.Tensor],
                correction_bias: torch.Tensor | None = None) -> RoutedWork:
    """The work of the mean call over `router_logits` (one [M, E] tensor per input set, the sets timed
    in turn): the distinct experts of this rank that the reference router (`route_torch`) selects and
    the (token, expert) pairs sent to them, each averaged over the sets. A few tokens' sets select
    different numbers of experts (mixtral-8x7b's 8-token sets 6-8 of 8): their fewest would put the
    floor of a call reading 6 beside the time of calls reading 7.25 on average."""
    local = None
    if config.parallel.use_ep:
        local = torch.tensor(config.parallel.local_experts(config.num_experts))
    experts, pairs = [], []
    for logits in router_logits:
        ids = route_torch(logits, config.routing, config.top_k, correction_bias)[1].flatten().long().cpu()
        if local is not None:
            ids = ids[torch.isin(ids, local)]
        experts.append(int(ids.unique().numel()))
        pairs.append(int(ids.numel()))
    if not experts:
        raise ValueError("routed_work: no router logits given")
    return RoutedWork(statistics.fmean(experts), statistics.fmean(pairs))


def roofline_floor(config: MoEConfig, quant: MoEQuantConfig, work: RoutedWork, ceilings: Ceilings) -> Floor:
    """The least time one layer call doing `work` can take under `ceilings`: reading the weights of
    the experts it selects (`expert_weight_bytes` each) or the GEMMs' 2 * pairs * (R + N) * K flops
    at the rate of the scheme's compute type (`compute_dtype`), whichever takes longer."""
    R, K, N = config.w13_rows, config.hidden_size, config.intermediate_size_per_partition
    per_expert = expert_weight_bytes(config, quant)
    memory_s = work.experts * per_expert / ceilings.memory_bytes_per_s
    matmul_dtype, rate = ceilings.matmul_rate(compute_dtype(config, quant))
    compute_s = 2 * work.pairs * (R + N) * K / rate
    return Floor(max(memory_s, compute_s), "memory" if memory_s >= compute_s else "compute", memory_s, compute_s,
                 work.experts, per_expert, matmul_dtype)
