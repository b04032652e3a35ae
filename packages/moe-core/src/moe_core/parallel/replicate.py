"""Replicate mode: every rank of the expert-parallel group holds the same tokens (e.g. after
tensor-parallel attention) and its own experts; each rank's kernel computes the contributions of
its local experts (choices of other ranks' experts contribute zero through `expert_map`), and the
finalize step sums the partial outputs across the group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from moe_core.config import MoEConfig

__all__ = ["ExpertParallelReduce", "check_group"]


def check_group(config: MoEConfig, group: dist.ProcessGroup | None) -> None:
    """The process group must match `config.parallel`'s ep_size and ep_rank."""
    p = config.parallel
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"ParallelConfig(ep_size={p.ep_size}) needs torch.distributed initialized "
                         "(torch.distributed.init_process_group) before the layer is built")
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if (size, rank) != (p.ep_size, p.ep_rank):
        raise ValueError(f"the expert-parallel group has size {size} and this process is rank {rank}, but the "
                         f"layer was configured with ep_size={p.ep_size}, ep_rank={p.ep_rank}")


class ExpertParallelReduce:
    """Finalize: sum the ranks' partial [M, K] outputs in fp32, one rounding to the layer dtype."""

    def __init__(self, config: MoEConfig, group: dist.ProcessGroup | None = None) -> None:
        check_group(config, group)
        self.group = group

    def __call__(self, partial: torch.Tensor) -> torch.Tensor:
        total = partial.float()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        return total.to(partial.dtype)
