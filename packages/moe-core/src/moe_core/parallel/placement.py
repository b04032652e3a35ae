"""Expert placement: which rank holds which experts, balanced by measured load, and the weights
each rank loads (the canonical experts of its placement, in local order)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from moe_core.config import ExpertPlacement, MoEConfig
from moe_core.weights.canonical import ExpertWeights

__all__ = ["balanced_placement", "expert_loads", "local_weights"]


def expert_loads(topk_ids: torch.Tensor, num_experts: int) -> list[int]:
    """Routed choices per global expert, from a sample of routed ids [M, k]: the input to `balanced_placement`."""
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [M, k], got shape {list(topk_ids.shape)}")
    return torch.bincount(topk_ids.reshape(-1).long().cpu(), minlength=num_experts)[:num_experts].tolist()


def balanced_placement(loads: Sequence[float] | torch.Tensor, num_ranks: int, redundant: int = 0) -> ExpertPlacement:
    """A placement that evens the routed load over ranks (greedy, deterministic).

    `loads[e]`: how much expert e is used (e.g. `expert_loads` of a calibration batch).
    `redundant`: extra copies of hot experts, each given to the expert with the highest load per copy;
    a choice of a replicated expert is later served by one copy, so each copy carries load / copies.
    Copies are placed heaviest first, each on the least-loaded rank that has a free slot and no copy
    of that expert yet (ties: lower rank). Every rank gets ceil((E + redundant) / num_ranks) slots at
    most, so ranks hold about the same weight bytes. Local order: ascending global id.
    """
    loads = [float(v) for v in (loads.tolist() if isinstance(loads, torch.Tensor) else loads)]
    E = len(loads)
    if E == 0 or not all(math.isfinite(v) and v >= 0 for v in loads):
        raise ValueError(f"balanced_placement: loads must be a non-empty sequence of finite values >= 0, got {loads}")
    if not isinstance(num_ranks, int) or not 1 <= num_ranks <= E:
        raise ValueError(f"balanced_placement: num_ranks={num_ranks!r} is invalid: expected an int in [1, {E}]")
    slots = E + redundant
    capacity = -(-slots // num_ranks)
    if not isinstance(redundant, int) or redundant < 0 or (num_ranks > 1 and capacity >= E) \
            or redundant > E * (num_ranks - 1):
        raise ValueError(f"balanced_placement: redundant={redundant!r} is invalid: expected an int >= 0 that leaves "
                         f"every rank without at least one expert (at most {num_ranks} copies of an expert, "
                         f"ceil((E + redundant) / num_ranks) < E={E})")
    copies = [1] * E
    for _ in range(redundant):
        hot = max((e for e in range(E) if copies[e] < num_ranks), key=lambda e: (loads[e] / copies[e], -e))
        copies[hot] += 1
    # Replicated experts first: their copies need distinct ranks, so they go while every rank has room.
    items = sorted(((e, loads[e] / copies[e]) for e in range(E) for _ in range(copies[e])),
                   key=lambda item: (copies[item[0]] == 1, -item[1], item[0]))
    held: list[list[int]] = [[] for _ in range(num_ranks)]
    rank_load = [0.0] * num_ranks
    for e, load in items:
        free = [r for r in range(num_ranks) if len(held[r]) < capacity and e not in held[r]]
        if not free:
            raise ValueError(f"balanced_placement: no rank has room for another copy of expert {e} "
                             f"({copies[e]} copies, {capacity} slots per rank); use fewer redundant copies")
        r = min(free, key=lambda r: (rank_load[r], len(held[r]), r))
        held[r].append(e)
        rank_load[r] += load
    return ExpertPlacement(E, tuple(tuple(sorted(h)) for h in held))


def local_weights(weights: ExpertWeights, config: MoEConfig) -> ExpertWeights:
    """This rank's experts of the layer's canonical weights (all E experts), in local order: what
    `FusedMoE.load_weights` takes on an expert-parallel rank. Views for a contiguous block, else copies."""
    E = config.num_experts
    if weights.num_experts != E:
        raise ValueError(f"local_weights: expected the whole layer's weights ({E} experts), got {weights.num_experts}")
    local = config.parallel.local_experts(E) if config.parallel.use_ep else tuple(range(E))
    if local == tuple(range(local[0], local[0] + len(local))):
        return weights.narrow(local[0], len(local))
    index = torch.tensor(local, dtype=torch.long)
    return dataclasses.replace(weights, **{name: t.index_select(0, index.to(t.device))
                                           for name, t in weights.tensors().items()})
