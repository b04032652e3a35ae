"""How an expert-parallel layer moves tokens, chosen by `FusedMoE(..., parallel=...)`.

- `Replicate()`: every rank holds the same tokens; each computes its experts' share and the shares
  are all-reduced. Moves hidden_size x tokens x ranks per layer and every rank routes every token.
- `AllToAll()`: every rank holds its own tokens (its data-parallel share) and router logits; it
  routes them, sends each token only to the ranks holding its chosen experts, and gets back the
  weighted partial sums of those experts for its tokens.

`resolve_parallel` validates the choice against the layer and says which mode runs and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from moe_core.config import ExpertPlacement, MoEConfig

__all__ = ["PAYLOAD_DTYPES", "AllToAll", "ParallelPlan", "Replicate", "resolve_parallel"]

# Dispatch payloads narrower than the layer dtype: fp8 rows carry one fp32 scale each.
PAYLOAD_DTYPES = (torch.bfloat16, torch.float8_e4m3fn)


@dataclass(frozen=True)
class Replicate:
    """Same tokens on every rank; partial outputs summed over the group (fp32, one rounding)."""

    name: ClassVar[str] = "replicate"

    def describe(self) -> str:
        return "replicate (all-reduce of the partial outputs)"


@dataclass(frozen=True)
class AllToAll:
    """Each rank's own tokens go only to the ranks holding their experts, and come back combined."""

    payload: torch.dtype | None = None  # dtype of the dispatched rows: None = the layer dtype (exact);
    #                                     torch.bfloat16, or torch.float8_e4m3fn with a per-row fp32 scale
    fixed_slots: bool = False  # True: every pair of ranks exchanges all M rows of the call (M equal on every
    #                            rank: the token bucket), no host sync, so a CUDA graph can capture it

    name: ClassVar[str] = "all_to_all"

    def __post_init__(self) -> None:
        if self.payload is not None and self.payload not in PAYLOAD_DTYPES:
            raise ValueError(f"AllToAll.payload={self.payload!r} is invalid: expected None (the layer dtype), "
                             "torch.bfloat16 or torch.float8_e4m3fn")
        if not isinstance(self.fixed_slots, bool):
            raise ValueError(f"AllToAll.fixed_slots={self.fixed_slots!r} is invalid: expected a bool")

    def describe(self) -> str:
        payload = "layer dtype" if self.payload is None else str(self.payload).removeprefix("torch.")
        slots = "fixed slots (graph-capturable)" if self.fixed_slots else "exact splits"
        return f"all_to_all ({payload} payload, {slots})"


@dataclass(frozen=True)
class ParallelPlan:
    """The mode a layer runs, why, and where its experts live."""

    mode: Replicate | AllToAll | None  # None: one rank, no communication
    reason: str  # why this mode (for `moe explain`)
    placement: ExpertPlacement | None  # None for a single rank
    ep_rank: int

    @property
    def mode_name(self) -> str:
        return "local" if self.mode is None else self.mode.name

    def explain(self) -> str:
        mode = "local" if self.mode is None else self.mode.describe()
        text = f"parallel: {mode}: {self.reason}"
        if self.placement is not None:
            text += f"\nplacement (this process: rank {self.ep_rank}):\n  " + \
                self.placement.describe().replace("\n", "\n  ")
        return text

    def to_dict(self) -> dict:
        out: dict = {"mode": self.mode_name, "reason": self.reason}
        if isinstance(self.mode, AllToAll):
            out.update(payload=None if self.mode.payload is None else str(self.mode.payload).removeprefix("torch."),
                       fixed_slots=self.mode.fixed_slots)
        if self.placement is not None:
            out.update(ep_rank=self.ep_rank, placement=[list(held) for held in self.placement.ranks])
        return out


def _expected_ranks_per_token(config: MoEConfig) -> float:
    """Ranks a token reaches under uniform routing (k distinct experts spread evenly over R ranks)."""
    R, k = config.parallel.ep_size, config.top_k
    return R * (1 - (1 - 1 / R) ** k)


def resolve_parallel(config: MoEConfig, parallel: object, experts_monolithic: bool, experts_name: str,
                     ep_group: object = None) -> ParallelPlan:
    """Validate `FusedMoE(..., parallel=, ep_group=)` for this layer and say which mode runs and why."""
    p = config.parallel
    if parallel is not None and not isinstance(parallel, Replicate | AllToAll):
        raise ValueError(f"FusedMoE(parallel={parallel!r}) is invalid: expected None (replicate when "
                         "ParallelConfig.ep_size > 1), moe_core.parallel.Replicate() or AllToAll(...)")
    if not p.use_ep:
        if parallel is not None:
            raise ValueError(f"FusedMoE(parallel={type(parallel).__name__}(...)) needs expert parallelism: "
                             f"ParallelConfig.ep_size is {p.ep_size}, expected > 1")
        if p.tp_size > 1:
            # The layer does not own a tensor-parallel group: its output stays a partial sum, on request only.
            if ep_group != "partial":
                raise ValueError(
                    f"ParallelConfig.tp_size={p.tp_size}: this rank holds {config.intermediate_size_per_partition} of "
                    f"the {config.intermediate_size} intermediate columns of every expert, so its output is a partial "
                    "sum that FusedMoE does not reduce; pass ep_group='partial' to take this rank's share and sum "
                    "the outputs over your tensor-parallel group (e.g. torch.distributed.all_reduce)")
            return ParallelPlan(None, f"tensor parallel, rank {p.tp_rank} of {p.tp_size}: the layer holds "
                                      f"{config.intermediate_size_per_partition} of {config.intermediate_size} "
                                      "intermediate columns of every expert and returns this rank's partial sum "
                                      "(ep_group='partial'); the caller sums over its tensor-parallel group", None, 0)
        return ParallelPlan(None, "ParallelConfig.ep_size == 1: the layer holds every expert", None, 0)
    placement = p.expert_placement(config.num_experts)
    if isinstance(parallel, AllToAll):
        if ep_group == "partial":
            raise ValueError("ep_group='partial' (this rank's share, no sum) is a replicate-mode option; "
                             "AllToAll always combines the partial sums on the token's own rank")
        spread = _expected_ranks_per_token(config)
        reason = (f"chosen (parallel=AllToAll): each rank routes its own tokens and sends each to the ranks "
                  f"holding its experts (~{spread:.2f} of {p.ep_size} ranks per token under uniform routing)")
        if experts_monolithic:
            reason += (f"; {experts_name} routes itself when alone, here its modular apply() runs the received "
                       "rows")
        return ParallelPlan(parallel, reason, placement, p.ep_rank)
    if placement.has_replicas:
        raise ValueError("the expert placement replicates experts on several ranks: replicate mode would count "
                         "them once per copy; use parallel=AllToAll() (a choice goes to one replica) or a "
                         "placement without replicas")
    if parallel is None:
        reason = ("default for ep_size > 1: every rank holds the same tokens and the partial outputs are "
                  "all-reduced; pass parallel=AllToAll() when each rank holds its own tokens")
    else:
        reason = "chosen (parallel=Replicate()): every rank holds the same tokens, partial outputs all-reduced"
    if ep_group == "partial":
        reason += "; ep_group='partial': this rank's share is returned unsummed"
    return ParallelPlan(Replicate(), reason, placement, p.ep_rank)
