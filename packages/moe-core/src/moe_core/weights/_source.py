"""Tensor look-up with errors that name the checkpoint key, its expected shape and dtype.

Every reader goes through `TensorSource`, so a bad checkpoint always fails the same way: the message
names the tensor, what was found and what was expected. Nothing is guessed or silently cast.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence

import torch

__all__ = ["CheckpointError", "TensorSource", "expert_ids", "join_key"]


class CheckpointError(ValueError):
    """A checkpoint that does not hold what its format requires (missing, mis-shaped or mistyped)."""


def expert_ids(num_experts: int, experts: Sequence[int] | None) -> Sequence[int]:
    """The expert ids to read, validated: all of them by default, else the given distinct ids in order.

    All of them is a lazy range: a config.json claiming 10**12 experts then fails on the first expert
    the checkpoint lacks, rather than on building a list of 10**12 ids (MemoryError, no message)."""
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts={num_experts!r} is invalid: expected a positive int")
    if experts is None or (isinstance(experts, range) and experts == range(num_experts)):
        return range(num_experts)
    invalid = ValueError(f"experts={experts!r} is invalid: expected distinct ids in [0, {num_experts}), each an int")
    try:  # integers only: int() would truncate 1.5 or parse "1"
        ids = [operator.index(e) if not isinstance(e, bool) else None for e in experts]
    except TypeError:
        raise invalid from None
    if not ids or None in ids or any(not 0 <= e < num_experts for e in ids) or len(set(ids)) != len(ids):
        raise invalid
    return ids


def join_key(prefix: str, name: str) -> str:
    """'model.layers.0.mlp.experts' + 'gate_up_proj' -> 'model.layers.0.mlp.experts.gate_up_proj'."""
    prefix = prefix.rstrip(".")
    return f"{prefix}.{name}" if prefix else name


class TensorSource:
    """A read-only view over a name -> tensor mapping (a state dict or lazily opened safetensors)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], what: str = "checkpoint") -> None:
        self._tensors = tensors
        self.what = what  # used in messages: "checkpoint", "state dict", a directory path
        self.consumed: set[str] = set()  # keys read through get(), to find tensors no reader understood

    def __contains__(self, key: str) -> bool:
        return key in self._tensors

    def names(self) -> Iterator[str]:
        return iter(self._tensors)

    def names_under(self, prefix: str) -> list[str]:
        """The names starting with `prefix` (a checkpoint directory answers from its sorted keys, so
        per-layer look-ups do not scan every key of the model)."""
        under = getattr(self._tensors, "keys_under", None)
        if under is not None:
            return under(prefix)
        return [k for k in self._tensors if k.startswith(prefix)]

    def get(self, key: str, shape: Sequence[int | None] | None = None,
            dtypes: Sequence[torch.dtype] | None = None) -> torch.Tensor:
        """The tensor at `key`; None in `shape` accepts any size in that position."""
        if key not in self._tensors:
            want = f" (expected shape {_shape_text(shape)})" if shape is not None else ""
            raise CheckpointError(f"{self.what}: tensor {key!r} is missing{want}")
        t = self._tensors[key]
        self.consumed.add(key)
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{self.what}: {key!r} is a {type(t).__name__}, expected a torch.Tensor")
        if shape is not None and (t.dim() != len(shape)
                                  or any(w is not None and s != w for s, w in zip(t.shape, shape))):
            raise CheckpointError(f"{self.what}: tensor {key!r} has shape {list(t.shape)}, "
                                  f"expected {_shape_text(shape)}")
        if dtypes is not None and t.dtype not in dtypes:
            names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise CheckpointError(f"{self.what}: tensor {key!r} has dtype {str(t.dtype).removeprefix('torch.')}, "
                                  f"expected {names}")
        return t

    def get_float(self, key: str, shape: Sequence[int | None] | None = None) -> torch.Tensor:
        return self.get(key, shape, FLOAT_DTYPES)


FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _shape_text(shape: Sequence[int | None] | None) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
