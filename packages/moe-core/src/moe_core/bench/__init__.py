"""`moe bench`: time whole MoE layers against the machine's own ceilings and a naive per-expert loop.

The modules, by concern:

- `timing`: thread pinning, progress, sample statistics and the CUDA protocol (`time_cuda_layer`);
- `roofline`: the measured ceilings and the roofline floor, the one definition that `moe bench`,
  benchmarks/gpu and the docs use;
- `memory`: the memory a run plans to use, checked before anything is allocated;
- `results`: the rows, the results JSON and the measured ranking a run writes;
- `report`: the results table and the plot;
- `cli`: the `moe bench` command itself.

The names below are what `moe run` and benchmarks/gpu import from `moe_core.bench`.
"""

from moe_core.bench.cli import CORRECTION_BIAS_STD, DEFAULT_OUT, MEMORY_HEADROOM, add_arguments, main
from moe_core.bench.memory import estimate_peak_bytes, planned_bytes
from moe_core.bench.results import Row, prepare_out_dir, save_ranking, triton_version, write_json_atomic
from moe_core.bench.roofline import (
    IMPOSSIBLE_FRACTION,
    RECHECK_TOLERANCE,
    Ceilings,
    Floor,
    QuickCeilings,
    RoutedWork,
    compute_dtype,
    expert_weight_bytes,
    measure_ceilings,
    quick_ceilings,
    roofline_floor,
    routed_work,
    weight_bytes_per_param,
)
from moe_core.bench.timing import (
    SPREAD_WARNING,
    Progress,
    SmClockSampler,
    TimingSummary,
    add_threads_argument,
    default_threads,
    mean_call_seconds,
    pin_threads,
    step,
    summarize_timings,
    time_cuda_layer,
    validate_threads,
    warn_if_unsteady,
)

__all__ = ["CORRECTION_BIAS_STD", "DEFAULT_OUT", "IMPOSSIBLE_FRACTION", "MEMORY_HEADROOM", "RECHECK_TOLERANCE", "SPREAD_WARNING",
           "Ceilings", "Floor", "Progress", "QuickCeilings", "RoutedWork", "Row", "SmClockSampler", "TimingSummary",
           "add_arguments", "add_threads_argument", "compute_dtype", "default_threads", "estimate_peak_bytes",
           "expert_weight_bytes", "main", "mean_call_seconds", "measure_ceilings", "pin_threads", "planned_bytes", "prepare_out_dir",
           "quick_ceilings", "roofline_floor", "routed_work", "save_ranking", "step", "summarize_timings",
           "time_cuda_layer", "triton_version", "validate_threads", "warn_if_unsteady", "weight_bytes_per_param",
           "write_json_atomic"]
