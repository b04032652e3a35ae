"""Load one MoE layer from a Hugging Face model directory (safetensors shards + config.json).

    loaded = load_layer("path/to/model", layer_index=3)
    layer = FusedMoE(config, loaded.quant)        # config: the model's MoEConfig
    layer.load_weights(loaded.weights, loaded.correction_bias)

The format comes from config.json's `quantization_config.quant_method` (none: unquantized; "gptq",
"awq", "compressed-tensors", "mxfp4", "fp8"); the readers then demand exactly the tensors that format
defines and fail naming any that is missing or mis-shaped. Only the requested layer's tensors are
read: `model.safetensors.index.json` says which file holds each key (without an index, the one file
`model.safetensors`, as transformers reads it), and safetensors memory-maps the files.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch

from moe_core._progress import logged_step
from moe_core.quant import MoEQuantConfig
from moe_core.weights._source import CheckpointError, TensorSource, expert_ids, join_key
from moe_core.weights.awq import AWQFormat, awq_experts
from moe_core.weights.canonical import ExpertWeights
from moe_core.weights.compressed_tensors import (
    CompressedTensorsFP8Scheme,
    compressed_tensors_experts,
    compressed_tensors_scheme_for,
)
from moe_core.weights.fp8 import BlockFP8Format, block_fp8_experts
from moe_core.weights.gptq import GPTQFormat, gptq_experts
from moe_core.weights.hf import unquantized_experts_from_source
from moe_core.weights.mxfp4 import gpt_oss_mxfp4_experts

__all__ = ["INTERLEAVED_GATE_UP_MODEL_TYPES", "LoadedLayer", "SafetensorsDirectory", "load_layer", "read_layer",
           "read_model_config"]

# model_type values whose fused gate_up_proj alternates gate and up rows: the transformers models
# declared `use_experts_implementation(is_concatenated=False)` (5.23: gpt_oss only).
INTERLEAVED_GATE_UP_MODEL_TYPES = frozenset({"gpt_oss"})
_NUM_EXPERTS_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")
SUPPORTED_QUANT_METHODS = ("gptq", "awq", "compressed-tensors", "mxfp4", "fp8")
_log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class LoadedLayer:
    """One MoE layer read from a checkpoint: canonical weights plus what a caller needs to build it."""

    weights: ExpertWeights
    quant: MoEQuantConfig  # the layer quantization the weights imply (pass it to FusedMoE)
    format: str  # "unquantized", "gptq", "awq", "compressed-tensors", "mxfp4" or "fp8"
    experts_prefix: str  # e.g. "model.layers.3.mlp.experts"
    num_experts: int  # global experts of the layer (config.json)
    top_k: int | None  # experts per token, from config.json when it says
    router_weight: torch.Tensor | None  # [E, K] (`gate.weight` or gpt-oss `router.weight`)
    router_bias: torch.Tensor | None  # [E] (gpt-oss `router.bias`)
    correction_bias: torch.Tensor | None  # [E] DeepSeek-V3 `gate.e_score_correction_bias`
    model_config: Mapping[str, object]  # config.json, read-only


def _read_json_object(path: Path) -> dict:
    """A JSON file that must hold one object; anything else is a CheckpointError naming the file."""
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from exc
    except RecursionError:  # json's decoder recurses once per nesting level
        raise CheckpointError(f"{path}: JSON nested too deeply to read (past Python's recursion limit); a "
                              "config.json or index is a few levels deep") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got a {type(value).__name__}")
    return value


class SafetensorsDirectory(Mapping[str, torch.Tensor]):
    """A lazy name -> tensor mapping over a directory's safetensors shards (tensors read on access)."""

    def __init__(self, model_dir: str | Path) -> None:
        from safetensors import safe_open  # a dependency of moe-core; imported where it is used

        self._safe_open = safe_open
        self.root = Path(model_dir)
        # transformers' rule: the index if there is one, else the single file model.safetensors.
        index = self.root / "model.safetensors.index.json"
        if index.exists():
            weight_map = _read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index}: no 'weight_map' object")
            root, shards = self.root.resolve(), {}  # each shard's path checked once, not once per tensor
            self._where = {}
            for k, v in weight_map.items():
                if not isinstance(v, str) or v not in shards:
                    shards[v] = self._shard_path(index, k, v, root)
                self._where[k] = shards[v]
            missing = sorted({str(p) for p in set(self._where.values()) if not p.exists()})
            if missing:
                raise CheckpointError(f"{index} names shards that do not exist: {', '.join(missing)}")
            self._refuse_duplicates(sorted(set(self._where.values())))
        else:
            single = self.root / "model.safetensors"
            if not single.exists():
                others = sorted(p.name for p in self.root.glob("*.safetensors"))
                found = (f" (found {', '.join(others)}, which are not read without an index)" if others
                         else " (no *.safetensors files)")
                raise CheckpointError(f"{self.root}: no model.safetensors.index.json and no model.safetensors{found}")
            with self._open_file(single) as f:
                self._where = dict.fromkeys(f.keys(), single)
        self._open: dict[Path, object] = {}
        self._sorted: list[str] | None = None  # the keys in order, for keys_under (built on first use)

    def keys_under(self, prefix: str) -> list[str]:
        """The keys starting with `prefix`, in sorted order (a bisection of the sorted keys)."""
        if self._sorted is None:
            self._sorted = sorted(self._where)
        keys, i = self._sorted, bisect.bisect_left(self._sorted, prefix)
        found = []
        while i < len(keys) and keys[i].startswith(prefix):
            found.append(keys[i])
            i += 1
        return found

    def _open_file(self, path: Path):
        """A safetensors handle; a truncated, empty or foreign file is a CheckpointError naming it."""
        try:
            return self._safe_open(path, framework="pt")
        except Exception as exc:  # safetensors raises its own SafetensorError (and OSError)
            raise CheckpointError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc})") from exc

    def _shard_path(self, index: Path, key: str, name: object, root: Path) -> Path:
        """The index entry's file, which must be a plain file name or a path inside the model directory.

        In the Hugging Face hub cache (`models--org--name/snapshots/<rev>/`) the files are symlinks into
        the repository's `blobs/`: a file inside the directory may resolve there, and nowhere else."""
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"{index}: weight_map[{key!r}] = {name!r} is not a file name")
        path = (self.root / name).resolve()
        lexical = Path(os.path.normpath(root / name))
        inside = not Path(name).is_absolute() and root in lexical.parents
        if not inside or (root not in path.parents and path.parent != _hub_blobs(root)):
            raise CheckpointError(f"{index}: weight_map[{key!r}] = {name!r} points outside the model directory "
                                  f"{self.root}; expected a shard file name inside it (or, in the Hugging Face "
                                  "hub cache, a link into the repository's blobs/)")
        return path

    def _refuse_duplicates(self, shards: list[Path]) -> None:
        """A key stored in two shards would be read from whichever the index names: refuse it."""
        holder: dict[str, Path] = {}
        for shard in shards:
            with self._open_file(shard) as f:
                for key in f.keys():  # noqa: SIM118 - safetensors handles are not iterable
                    if key in holder:
                        raise CheckpointError(f"{self.root}: tensor {key!r} is stored in both {holder[key].name} "
                                              f"and {shard.name}; a key must be in exactly one shard")
                    holder[key] = shard

    def _handle(self, key: str):
        path = self._where[key]
        if path not in self._open:
            self._open[path] = self._open_file(path)
        return path, self._open[path]

    def __getitem__(self, key: str) -> torch.Tensor:
        path, handle = self._handle(key)
        try:
            return handle.get_tensor(key)
        except Exception as exc:  # the index named a key its shard lacks
            raise CheckpointError(f"{path}: cannot read tensor {key!r} listed in the index: {exc}") from exc

    def header(self, key: str) -> tuple[list[int], str]:
        """The stored shape and safetensors dtype name ("I32", "BF16", ...) of tensor `key`, from its
        file's header (the data is not read)."""
        path, handle = self._handle(key)
        try:
            part = handle.get_slice(key)
            return part.get_shape(), part.get_dtype()
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot read tensor {key!r} listed in the index: {exc}") from exc

    def nbytes(self, key: str) -> int:
        """The stored size of tensor `key`, from its file's header (the data is not read)."""
        shape, dtype = self.header(key)
        bits = 8 if dtype == "BOOL" else int(re.match(r"[A-Z]+(\d+)", dtype).group(1))
        return math.prod(shape) * bits // 8

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where


def _hub_blobs(root: Path) -> Path | None:
    """`<repo>/blobs` for a resolved hub-cache snapshot directory `<repo>/snapshots/<rev>`, else None."""
    if root.parent.name != "snapshots" or not (root.parent.parent / "blobs").is_dir():
        return None
    return (root.parent.parent / "blobs").resolve()


def load_layer(model_dir: str | Path, layer_index: int, *, experts: Sequence[int] | None = None,
               dtype: torch.dtype | None = None) -> LoadedLayer:
    """Read MoE layer `layer_index` of the checkpoint in `model_dir` into canonical form.

    experts: expert ids to keep, in order (expert parallelism); default all.
    dtype: cast unquantized expert weights (and router tensors) to this dtype; default as stored.
    Raises CheckpointError (a ValueError) naming the file for missing or mis-shaped tensors and for a
    config.json it cannot read or whose format it does not support.
    Logs the step at INFO on the "moe_core" logger (see `moe_core._progress`).
    """
    with logged_step(_log, f"reading MoE layer {layer_index} from {model_dir}"):
        return _read_layer(model_dir, layer_index, experts, dtype)


def _read_layer(model_dir: str | Path, layer_index: int, experts: Sequence[int] | None,
                dtype: torch.dtype | None) -> LoadedLayer:
    _check_layer_index(layer_index)
    root, config = read_model_config(model_dir)
    counts = _expert_counts(root / "config.json", config)
    return _read_layer_from(SafetensorsDirectory(root), config, counts, layer_index, experts, dtype)


def read_layer(tensors: SafetensorsDirectory, config: Mapping[str, object], layer_index: int, *,
               experts: Sequence[int] | None = None, dtype: torch.dtype | None = None) -> LoadedLayer:
    """`load_layer` over an open directory and its config.json (from `read_model_config`), so that a
    caller reading every layer opens the shards and checks the index once."""
    _check_layer_index(layer_index)
    counts = _expert_counts(tensors.root / "config.json", config)
    return _read_layer_from(tensors, config, counts, layer_index, experts, dtype)


def read_model_config(model_dir: str | Path) -> tuple[Path, dict]:
    """(the model directory, its config.json as a dict); CheckpointError where either is missing."""
    root = Path(model_dir)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"{root}: not a directory; give the model directory holding config.json and the "
                              "safetensors files")
    config_path = root / "config.json"
    if not config_path.exists():
        raise CheckpointError(f"{root}: no config.json")
    return root, _read_json_object(config_path)


def _check_layer_index(layer_index: object) -> None:
    if not isinstance(layer_index, int) or isinstance(layer_index, bool) or layer_index < 0:
        raise ValueError(f"layer_index={layer_index!r} is invalid: expected an int >= 0 (a decoder layer's index)")


def _expert_counts(config_path: Path, config: Mapping) -> tuple[int, int | None]:
    """(experts per layer, experts per token or None) from config.json, validated."""
    text = config.get("text_config") or {}
    if not isinstance(text, dict):
        raise CheckpointError(f"{config_path}: text_config must be a JSON object, got {text!r}")
    num_experts = _first_int(config_path, config, text, _NUM_EXPERTS_KEYS)
    if num_experts is None:
        raise CheckpointError(f"{config_path}: no expert count (looked for {', '.join(_NUM_EXPERTS_KEYS)}); "
                              "is this a MoE model?")
    if num_experts < 1:
        raise CheckpointError(f"{config_path}: an expert count of {num_experts} is invalid: expected a positive int")
    top_k = _first_int(config_path, config, text, _TOP_K_KEYS)
    if top_k is not None and not 1 <= top_k <= num_experts:
        raise CheckpointError(f"{config_path}: experts per token = {top_k} is invalid: expected an int in "
                              f"[1, {num_experts}] (the expert count)")
    return num_experts, top_k


def _read_layer_from(tensors: SafetensorsDirectory, config: Mapping, counts: tuple[int, int | None],
                     layer_index: int, experts: Sequence[int] | None, dtype: torch.dtype | None) -> LoadedLayer:
    root = tensors.root
    config_path = root / "config.json"
    num_experts, top_k = counts
    source = TensorSource(tensors, str(root))
    prefix = find_experts_prefix(tensors, layer_index, str(root))
    qc = config.get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        raise CheckpointError(f"{config_path}: quantization_config must be a JSON object, got {qc!r}")
    method = None if qc is None else qc.get("quant_method")
    if qc is not None and method is None:
        raise CheckpointError(f"{config_path}: quantization_config has no quant_method; expected one of "
                              f"{', '.join(SUPPORTED_QUANT_METHODS)} (or no quantization_config for float weights)")
    fmt_name, weights, quant = _read_experts(source, prefix, num_experts, experts, config, qc, method, dtype)
    _refuse_unread(source, prefix, expert_ids(num_experts, experts), fmt_name, num_experts)
    mlp = prefix.removesuffix(".experts")
    router_weight = _optional(source, (join_key(mlp, "gate.weight"), join_key(mlp, "router.weight")), dtype)
    router_bias = _optional(source, (join_key(mlp, "router.bias"),), dtype)
    correction = _optional(source, (join_key(mlp, "gate.e_score_correction_bias"),
                                    join_key(mlp, "e_score_correction_bias")), None)
    E, K = num_experts, weights.hidden_size
    for name, tensor, shape in (("router weight", router_weight, (E, K)), ("router bias", router_bias, (E,)),
                                ("correction bias", correction, (E,))):
        if tensor is not None and tuple(tensor.shape) != shape:
            raise CheckpointError(f"{root}: the {name} under {mlp!r} has shape {list(tensor.shape)}, expected "
                                  f"{list(shape)} (num_experts={E} from config.json, hidden size {K})")
    return LoadedLayer(weights=weights, quant=quant, format=fmt_name, experts_prefix=prefix,
                       num_experts=num_experts, top_k=top_k,
                       router_weight=router_weight, router_bias=router_bias, correction_bias=correction,
                       model_config=MappingProxyType(config))


def find_experts_prefix(keys: Mapping[str, object] | Sequence[str], layer_index: int, what: str) -> str:
    """The one experts module of decoder layer `layer_index`, e.g. 'model.layers.3.mlp.experts'."""
    pattern = re.compile(rf"^((?:.*\.)?layers\.{int(layer_index)}\.(?:[^.]+\.)*?experts)\.")
    needle = f"layers.{int(layer_index)}."  # a substring test first: the expression runs on this layer's keys only
    prefixes = {m.group(1) for k in keys if needle in k and (m := pattern.match(k))}
    if not prefixes:
        raise CheckpointError(f"{what}: layer {layer_index} has no experts (no key like "
                              f"'model.layers.{layer_index}.mlp.experts.*'); dense layer or wrong index?")
    if len(prefixes) > 1:
        raise CheckpointError(f"{what}: layer {layer_index} has several experts modules: {sorted(prefixes)}")
    return prefixes.pop()


def _read_experts(source: TensorSource, prefix: str, num_experts: int, experts: Sequence[int] | None,
                  config: Mapping, qc: Mapping | None, method: str | None, dtype: torch.dtype | None
                  ) -> tuple[str, ExpertWeights, MoEQuantConfig]:
    """(format name, the experts, the layer scheme: the weights' key, plus the activations' where the
    format quantizes them)."""
    def read(name: str, weights: ExpertWeights, quant: MoEQuantConfig | None = None
             ) -> tuple[str, ExpertWeights, MoEQuantConfig]:
        return name, weights, MoEQuantConfig(weights.key) if quant is None else quant

    def unquantized() -> tuple[str, ExpertWeights, MoEQuantConfig]:
        interleaved = config.get("model_type") in INTERLEAVED_GATE_UP_MODEL_TYPES
        return read("unquantized", unquantized_experts_from_source(
            source, prefix, num_experts, interleaved_gate_up=interleaved, experts=experts, dtype=dtype))

    ids = expert_ids(num_experts, experts)
    config_path = Path(source.what) / "config.json"

    def parsed(from_config):
        """A format's quantization_config, its errors naming config.json."""
        try:
            return from_config(qc)
        except CheckpointError:
            raise
        except ValueError as exc:
            raise CheckpointError(f"{config_path}: {exc}") from exc

    if qc is None:
        if join_key(prefix, "gate_up_proj_blocks") in source:
            raise CheckpointError(f"{source.what}: MXFP4 expert tensors but config.json has no quantization_config")
        return unquantized()
    if method == "gptq":
        return read("gptq", gptq_experts(source, prefix, num_experts, parsed(GPTQFormat.from_config), ids))
    if method == "awq":
        fmt = parsed(AWQFormat.from_config)
        if not fmt.converts(prefix):
            return unquantized()
        return read("awq", awq_experts(source, prefix, num_experts, fmt, ids))
    if method == "compressed-tensors":
        modules = sorted({k.rsplit(".", 1)[0] for k in source.names_under(prefix + ".")})
        scheme = parsed(lambda qc: compressed_tensors_scheme_for(qc, modules))
        if scheme is None:
            return unquantized()
        weights = compressed_tensors_experts(source, prefix, num_experts, scheme, ids)
        # fp8 W8A8 adds its activations' key; the integer schemes are weight-only, their key from the tensors
        return read("compressed-tensors", weights,
                    scheme.quant_config() if isinstance(scheme, CompressedTensorsFP8Scheme) else None)
    if method == "mxfp4":
        if join_key(prefix, "gate_up_proj_blocks") not in source:
            raise CheckpointError(f"{source.what}: quant_method mxfp4 but tensor "
                                  f"'{join_key(prefix, 'gate_up_proj_blocks')}' is missing")
        return read("mxfp4", gpt_oss_mxfp4_experts(source, prefix, num_experts, ids))
    if method == "fp8":
        fmt = parsed(BlockFP8Format.from_config)
        return read("fp8", block_fp8_experts(source, prefix, num_experts, fmt, ids), fmt.quant_config())
    raise CheckpointError(f"{config_path}: quantization_config.quant_method={method!r} is not supported: expected "
                          f"none or one of {', '.join(SUPPORTED_QUANT_METHODS)} (as written, lower case)")


def _refuse_unread(source: TensorSource, prefix: str, ids: list[int], fmt_name: str, num_experts: int) -> None:
    """Tensors of the read experts that the format's reader did not use (biases of quantized
    projections, static input scales, ...) would be silently dropped: refuse instead. So would
    experts beyond the count config.json declares."""
    under = source.names_under(prefix + ".")
    beyond = sorted({int(head) for k in under
                     if (head := k[len(prefix) + 1:].split(".", 1)[0]).isdigit() and int(head) >= num_experts})
    if beyond:
        raise CheckpointError(f"{source.what}: config.json declares {num_experts} experts but the checkpoint holds "
                              f"experts up to {prefix}.{beyond[-1]} ({len(beyond)} beyond the declared count); "
                              "fix the expert count in config.json")
    wanted = {str(e) for e in ids}
    unread = [k for k in under if k not in source.consumed
              and (not (head := k[len(prefix) + 1:].split(".", 1)[0]).isdigit() or head in wanted)]
    if unread:
        shown = ", ".join(repr(k) for k in sorted(unread)[:5]) + (" ..." if len(unread) > 5 else "")
        raise CheckpointError(f"{source.what}: {len(unread)} tensor(s) under {prefix!r} are not part of the "
                              f"{fmt_name} expert format and would be ignored: {shown}")


def _optional(source: TensorSource, keys: Sequence[str], dtype: torch.dtype | None) -> torch.Tensor | None:
    """The first of `keys` present (router and bias tensors), which must be floating point and finite:
    an integer router weight would route by truncated values, or fail at the first matmul."""
    for key in keys:
        if key in source:
            t = source.get(key)
            if not t.dtype.is_floating_point:
                raise CheckpointError(f"{source.what}: tensor {key!r} has dtype {str(t.dtype).removeprefix('torch.')}"
                                      ", expected a floating-point dtype (bfloat16, float16 or float32)")
            if not bool(torch.isfinite(t).all()):  # NaN logits would route every token to garbage
                raise CheckpointError(f"{source.what}: tensor {key!r} holds NaN or Inf values; router weights and "
                                      "biases must be finite")
            return t.to(dtype) if dtype is not None else t
    return None


def _first_int(config_path: Path, config: Mapping, text: Mapping, keys: Sequence[str]) -> int | None:
    """The first of `keys` (config.json, then its text_config) holding an int; None where none is set.
    Where none holds an int but one is set to something else (a string, a bool), the error names it
    rather than reporting the value missing."""
    wrong = None
    for cfg in (config, text):
        for k in keys:
            value = cfg.get(k)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if value is not None and wrong is None:
                wrong = (k, value)
    if wrong is not None:
        raise CheckpointError(f"{config_path}: {wrong[0]}={wrong[1]!r} is not an int")
    return None
