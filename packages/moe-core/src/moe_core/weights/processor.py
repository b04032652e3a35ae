"""The contract between canonical weights and a kernel's own layout."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from moe_core.config import MoEConfig
    from moe_core.weights.canonical import ExpertWeights

__all__ = ["PackedWeights", "WeightProcessor"]


@dataclass(frozen=True, eq=False)
class PackedWeights:
    """Tensors in one kernel's layout, tagged with the layout's name so the kernel can assert it."""

    layout: str  # e.g. "cpu.int4pack"; the experts class that consumes it checks this tag
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def get(self, name: str) -> torch.Tensor | None:
        return self.tensors.get(name)


@runtime_checkable
class WeightProcessor(Protocol):
    """Turns canonical `ExpertWeights` into one kernel layout.

    Must be pure: it never mutates its input and never keeps state, so loading the same weights
    twice gives the same packed tensors (vLLM#42821 was a converter that was not).
    """

    layout: str

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights: ...
