"""`save_pretrained` of fused models: the checkpoint back in its own format, or an error before any write.

A `FusedMoE` holds its experts only in a kernel's layout (int4 tinygemm tiles, Marlin words, ...),
which is no checkpoint format. A model from `from_pretrained` therefore writes its experts, and the
linears it dequantized or handed to transformers' quantizer, as the checkpoint stored them (read again from the files they were loaded
from: a round trip is bit-exact by construction), and every other tensor from the model under its
checkpoint name; config.json is the model's config (which keeps the quantization_config). Before
writing anything it checks that every such tensor is still what was loaded (a layer given other
weights through `load_weights`, or such a linear's weight changed in place, would make the copy false)
and that the source files are still there. A model fused by `fuse()` has no such source: its
`save_pretrained` raises instead of writing a checkpoint without experts.
"""

from __future__ import annotations

import json
import logging
import os
import types
from pathlib import Path

import torch
from torch import nn

from moe_core.integrations._loading import CheckpointSource
from moe_core.weights._source import CheckpointError
from moe_core.weights.checkpoint import SafetensorsDirectory

__all__ = ["install_save", "refuse_save"]

_log = logging.getLogger(__name__)
_DEFAULT_SHARD_BYTES = 5 << 30


def install_save(model: nn.Module, source: CheckpointSource) -> None:
    """Give a model loaded by `from_pretrained` a `save_pretrained` that writes its checkpoint format."""

    def save_pretrained(self, save_directory: str | os.PathLike, *, max_shard_size: int = _DEFAULT_SHARD_BYTES,
                        **kwargs) -> None:
        """Write config.json and the tensors (safetensors, sharded over `max_shard_size` bytes with an index)
        in the format the model was loaded from. Raises, before writing anything, where that cannot be exact."""
        _refuse_options(kwargs)
        _save(self, source, Path(save_directory), max_shard_size)

    model.save_pretrained = types.MethodType(save_pretrained, model)


def refuse_save(model: nn.Module) -> None:
    """Make `save_pretrained` of a model fused by `fuse()` raise (its experts exist only in kernel layouts)."""

    def save_pretrained(self, *args, **kwargs) -> None:
        raise NotImplementedError(
            "save_pretrained: this model's MoE blocks were fused by moe_core fuse(), which keeps the experts only in "
            "the kernels' layouts; a checkpoint written now would lack them. Save the model before fusing, or load "
            "it with moe_core.integrations.transformers.from_pretrained, whose models save in the checkpoint's format")

    model.save_pretrained = types.MethodType(save_pretrained, model)


def _refuse_options(kwargs: dict) -> None:
    accepted = {"is_main_process": True, "safe_serialization": True, "push_to_hub": False, "state_dict": None}
    wrong = {k: v for k, v in kwargs.items() if k not in accepted or v != accepted[k]}
    if wrong:
        raise TypeError(f"save_pretrained of a fused model: {', '.join(f'{k}={v!r}' for k, v in wrong.items())} is not "
                        "supported; it takes save_directory and max_shard_size (bytes) and writes safetensors")


def _save(model: nn.Module, source: CheckpointSource, directory: Path, max_shard_size: int) -> None:
    if not isinstance(max_shard_size, int) or isinstance(max_shard_size, bool) or max_shard_size < 1:
        raise ValueError(f"max_shard_size={max_shard_size!r} is invalid: expected a positive int (bytes)")
    if directory.exists() and directory.resolve() == source.root.resolve():
        raise ValueError(f"save_pretrained: {directory} is the directory the model was loaded from, whose files it "
                         "reads while writing; save to another directory")
    changed = [what for what, unchanged in source.raw_guards if not unchanged()]
    if changed:
        raise RuntimeError(f"save_pretrained: {', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''} no longer "
                           "hold(s) the tensors loaded from the checkpoint, which are written back as stored; the "
                           "checkpoint would not match the model")
    tensors = SafetensorsDirectory(source.root)  # refuses missing or unreadable source files
    gone = [k for k in source.raw if k not in tensors]
    if gone:
        raise CheckpointError(f"save_pretrained: the source checkpoint {source.root} no longer holds "
                              f"{', '.join(gone[:4])}; its expert tensors are copied from there")
    plan: list[tuple[str, object]] = [(k, None) for k in source.raw]
    for key, where in source.params.items():
        plan.append((key, _model_tensor(model, key, where)))
    shards = _shards(plan, tensors, max_shard_size)

    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(directory)
    weight_map = {}
    for i, keys in enumerate(shards):
        name = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        chunk = {}
        for key, tensor in keys:
            chunk[key] = (tensors[key] if tensor is None else tensor.detach().to("cpu")).contiguous()
        save_file(chunk, directory / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, name))
        _log.info("save_pretrained: wrote %s (%d tensors)", directory / name, len(chunk))
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(_nbytes(tensors, k, t) for s in shards for k, t in s)},
                 "weight_map": dict(sorted(weight_map.items()))}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _model_tensor(model: nn.Module, key: str, where: str | torch.Tensor) -> torch.Tensor:
    if isinstance(where, torch.Tensor):
        return where
    module_name, _, leaf = where.rpartition(".")
    try:
        module = model.get_submodule(module_name)
    except AttributeError:
        module = None
    tensor = getattr(module, leaf, None) if module is not None else None
    if not isinstance(tensor, torch.Tensor):
        raise RuntimeError(f"save_pretrained: the model no longer has {where!r}, which holds the checkpoint's {key!r}")
    return tensor


def _nbytes(tensors: SafetensorsDirectory, key: str, tensor: torch.Tensor | None) -> int:
    if tensor is not None:
        return tensor.numel() * tensor.element_size()
    return tensors.nbytes(key)


def _shards(plan: list[tuple[str, torch.Tensor | None]], tensors: SafetensorsDirectory, limit: int
            ) -> list[list[tuple[str, torch.Tensor | None]]]:
    """Consecutive keys (sorted, so a layer's tensors stay together) in shards of at most `limit` bytes."""
    shards: list[list[tuple[str, torch.Tensor | None]]] = [[]]
    size = 0
    for key, tensor in sorted(plan, key=lambda item: item[0]):
        n = _nbytes(tensors, key, tensor)
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append((key, tensor))
        size += n
    return shards
