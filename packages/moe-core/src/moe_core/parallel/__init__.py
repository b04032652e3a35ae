"""Expert parallelism over `torch.distributed` (NCCL on GPUs, gloo on CPU).

`FusedMoE(config, ..., parallel=...)` with `config.parallel.ep_size > 1` picks how tokens meet
their experts (see `modes`): `Replicate()` (the default: same tokens on every rank, partial outputs
all-reduced) or `AllToAll(payload=..., fixed_slots=...)` (each rank's own tokens dispatched to the
ranks holding their experts and combined back). Which experts a rank holds is an `ExpertPlacement`
(`ParallelConfig.placement`): contiguous blocks by default, or `balanced_placement` from measured
per-expert loads, optionally with redundant copies of hot experts (all-to-all only). A rank loads
`local_weights(all_weights, config)`.
"""

from moe_core.config import ExpertPlacement
from moe_core.parallel.all_to_all import AllToAllDispatch, decode_rows, encode_rows, payload_roundtrip
from moe_core.parallel.modes import PAYLOAD_DTYPES, AllToAll, ParallelPlan, Replicate, resolve_parallel
from moe_core.parallel.placement import balanced_placement, expert_loads, local_weights
from moe_core.parallel.replicate import ExpertParallelReduce, check_group

__all__ = [
    "PAYLOAD_DTYPES",
    "AllToAll",
    "AllToAllDispatch",
    "ExpertParallelReduce",
    "ExpertPlacement",
    "ParallelPlan",
    "Replicate",
    "balanced_placement",
    "check_group",
    "decode_rows",
    "encode_rows",
    "expert_loads",
    "local_weights",
    "payload_roundtrip",
    "resolve_parallel",
]
