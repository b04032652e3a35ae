"""compressed-tensors `pack-quantized` int4/int8 weights -> canonical `ExpertWeights`.

Per expert projection (an nn.Linear), N = out_features, K = in_features, G = K / group_size:

| tensor | dtype | shape | layout |
|---|---|---|---|
| `weight_packed` | int32 | [N, ceil(K*bits/32)] | dense along K: element k at bit k*bits; code = q + 2**(bits-1) |
| `weight_scale` | float | [N, G] ([N, 1] for channel) | |
| `weight_zero_point` | int32 | [ceil(N*bits/32), G] | asymmetric only; packed along N (dim 0), offset like codes |
| `weight_shape` | int | [2] | (N, K) before packing |
| `weight_g_idx` | int32 | [K] | only with actorder "group"/"dynamic" (older releases) |

Dequantization: w = (q - zp) * scale with signed q and zp; both carry the same offset in storage,
so the stored unsigned codes and zeros are canonical as they are (symmetric: implicit zero 2**(bits-1)).
Verified against compressed-tensors 0.20's own `compressors/pack_quantized/{base,helpers}.py`
(`pack_to_int32` adds `1 << (bits - 1)` and packs densely; the zero point uses `packed_dim=0`;
`decompress` unpacks with `weight_shape`) and its `ActivationOrdering` (only "group"/"dynamic" keep a
runtime g_idx; "weight"/"static" only change calibration). The tests round-trip through that code.
Refused: formats other than pack-quantized, strategies other than group/channel, float types,
bits other than 4 and 8, quantized activations, and experts split over several config groups.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from moe_core.quant import MoEQuantConfig, int4_w4a16, int8_w8a16
from moe_core.weights._config import config_bool, config_int
from moe_core.weights._intquant import (
    QuantizedProjection,
    assemble_int_experts,
    check_trivial_g_idx,
    expert_projection_names,
    unpack_int32,
)
from moe_core.weights._source import FLOAT_DTYPES, CheckpointError, TensorSource, expert_ids, join_key
from moe_core.weights.canonical import ExpertWeights

__all__ = ["CompressedTensorsScheme", "compressed_tensors_experts", "compressed_tensors_scheme_for"]

_RUNTIME_ACTORDER = ("group", "dynamic")


@dataclass(frozen=True)
class CompressedTensorsScheme:
    bits: int
    symmetric: bool
    group_size: int  # -1 = channel strategy
    act_order: bool  # weight_g_idx carries a permuted grouping

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"compressed-tensors num_bits={self.bits} is not supported: expected 4 or 8")

    def quant_config(self, scale_dtype: str = "bf16") -> MoEQuantConfig:
        """The scheme these weights load as (scales are stored in the model dtype)."""
        factory = int4_w4a16 if self.bits == 4 else int8_w8a16
        return factory(self.group_size, zero_point=not self.symmetric, act_order=self.act_order,
                       scale_dtype=scale_dtype)


def compressed_tensors_scheme_for(qc: Mapping[str, object], modules: Sequence[str]) -> CompressedTensorsScheme | None:
    """The weight scheme config.json's `quantization_config` gives `modules`, or None if all are ignored.

    Every module must resolve to one scheme (or all to none): a layer cannot mix them.
    """
    if qc.get("quant_method") != "compressed-tensors":
        raise ValueError(f"quantization_config.quant_method={qc.get('quant_method')!r}: expected 'compressed-tensors'")
    ignore = _strings(qc.get("ignore"), "ignore")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, Mapping) or not all(isinstance(g, Mapping) for g in groups.values()):
        raise ValueError(f"compressed-tensors quantization_config.config_groups={groups!r} is invalid: expected an "
                         'object of named groups, e.g. {"group_0": {"targets": ["Linear"], "weights": {...}}}')
    missing = [name for name, group in groups.items() if "targets" not in group]
    if missing:  # compressed-tensors requires them; without, a group would silently quantize nothing
        raise ValueError(f"compressed-tensors quantization_config.config_groups.{missing[0]} has no 'targets': "
                         'expected a list of module names or "re:" patterns, e.g. ["Linear"]')
    targets = {name: _strings(group.get("targets"), f"config_groups.{name}.targets") for name, group in groups.items()}
    found: dict[str, tuple[str, Mapping] | None] = {}
    for module in modules:
        match = None
        if not any(_matches(module, pattern, "ignore") for pattern in ignore):
            for name, group in groups.items():
                if any(t == "Linear" or _matches(module, t, f"config_groups.{name}.targets") for t in targets[name]):
                    match = (name, group)
                    break
        found[module] = match
    names = {m[0] if m else None for m in found.values()}
    if len(names) != 1:
        listing = ", ".join(f"{mod} -> {m[0] if m else 'unquantized'}" for mod, m in found.items())
        raise CheckpointError(f"compressed-tensors: the layer's expert projections resolve to different schemes "
                              f"({listing}); a fused layer needs one")
    match = next(iter(found.values()))
    if match is None:
        return None
    group_name, group = match
    fmt = group.get("format") or qc.get("format")
    if fmt != "pack-quantized":
        raise ValueError(f"compressed-tensors format={fmt!r} (group {group_name!r}) is not supported here: "
                         "expected 'pack-quantized' (int4/int8 weights)")
    if group.get("input_activations"):
        raise ValueError(f"compressed-tensors group {group_name!r} quantizes activations; only weight-only "
                         "pack-quantized schemes are read")
    w = group.get("weights") or {}
    where = f"compressed-tensors quantization_config.config_groups.{group_name}.weights"
    if not isinstance(w, Mapping):
        raise ValueError(f"{where}={w!r} is invalid: expected an object (num_bits, strategy, group_size, ...)")
    if w.get("type", "int") != "int":
        raise ValueError(f"compressed-tensors weights type={w.get('type')!r} is not supported: expected 'int'")
    if config_bool(w, "dynamic", False, where):
        raise ValueError("compressed-tensors dynamic weight quantization has no stored scales to read")
    strategy = w.get("strategy")
    if strategy == "group":
        group_size = config_int(w, "group_size", where, "a positive int with strategy 'group' (e.g. 128)")
        if group_size < 1:
            raise ValueError(f"{where}.group_size={group_size} is invalid: expected a positive "
                             "int with strategy 'group'")
    elif strategy == "channel":
        group_size = -1
    else:
        raise ValueError(f"compressed-tensors weight strategy={strategy!r} is not supported: expected "
                         "'group' or 'channel'")
    # compressed-tensors' own validator reads actorder true as "group" and false as none.
    actorder = w.get("actorder")
    actorder = {True: "group", False: None}.get(actorder, actorder) if isinstance(actorder, bool) else actorder
    if actorder is not None and not isinstance(actorder, str):
        raise ValueError(f"{where}.actorder={actorder!r} is invalid: expected null, a bool or "
                         "one of 'group', 'weight', 'dynamic', 'static'")
    return CompressedTensorsScheme(bits=config_int(w, "num_bits", where, "4 or 8", default=8),
                                   symmetric=config_bool(w, "symmetric", True, where),
                                   group_size=group_size, act_order=actorder in _RUNTIME_ACTORDER)


def _strings(value: object, field: str) -> list[str]:
    """A list of strings (null: none), as `ignore` and `targets` are."""
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"compressed-tensors quantization_config.{field}={value!r} is invalid: expected a list of "
                         "module names or 're:' patterns")
    return list(value)


def compressed_tensors_experts(source: TensorSource, prefix: str, num_experts: int, scheme: CompressedTensorsScheme,
                               experts: Sequence[int] | None = None) -> ExpertWeights:
    ids = expert_ids(num_experts, experts)
    names = expert_projection_names(source, prefix, ids[0], "weight_packed")
    per_expert = [{n: _projection(source, join_key(prefix, f"{e}.{n}"), scheme) for n in names if n is not None}
                  for e in ids]
    return assemble_int_experts(per_expert, names, bits=scheme.bits, group_size=scheme.group_size,
                                zero_point=not scheme.symmetric, act_order=scheme.act_order,
                                where=f"{source.what}: {prefix}")


def _matches(module: str, pattern: str, field: str) -> bool:
    # compressed-tensors' match_name: "re:" patterns use re.match, others compare exactly.
    if pattern.startswith("re:"):
        try:
            return re.match(pattern.removeprefix("re:"), module) is not None
        except re.error as exc:
            raise ValueError(f"compressed-tensors quantization_config.{field} pattern {pattern!r} is not a valid "
                             f"regular expression ({exc}); expected 're:' followed by a Python regex") from None
    return pattern == module


def _projection(source: TensorSource, module: str, scheme: CompressedTensorsScheme) -> QuantizedProjection:
    bits = scheme.bits
    shape_key = f"{module}.weight_shape"
    shape = source.get(shape_key, (2,), (torch.int64, torch.int32))
    N, K = (int(v) for v in shape.tolist())
    if scheme.group_size != -1 and K % scheme.group_size:
        raise CheckpointError(f"{source.what}: {shape_key!r} says in_features {K}, not a multiple of group_size "
                              f"{scheme.group_size}")
    G = 1 if scheme.group_size == -1 else K // scheme.group_size
    packed = source.get(f"{module}.weight_packed", (N, -(-K * bits // 32)), (torch.int32,))
    scale = source.get(f"{module}.weight_scale", (N, G), FLOAT_DTYPES)
    # Dense packing: for 4 and 8 bits no code straddles a word, so plain fields are exact.
    codes = unpack_int32(packed, bits, dim=1)[:, :K]
    zero = None
    if not scheme.symmetric:
        zp = source.get(f"{module}.weight_zero_point", (-(-N * bits // 32), G), (torch.int32,))
        zero = unpack_int32(zp, bits, dim=0)[:N]
    g_idx = None
    key = f"{module}.weight_g_idx"
    if scheme.act_order:
        g_idx = source.get(key, (K,), (torch.int32, torch.int64))
        if int(g_idx.min()) < 0 or int(g_idx.max()) >= G:
            raise CheckpointError(f"{source.what}: {key!r} holds groups outside [0, {G})")
        g_idx = g_idx.to(torch.int32)
    elif key in source:
        check_trivial_g_idx(source.get(key, (K,), (torch.int32, torch.int64)), scheme.group_size, key, source.what)
    return QuantizedProjection(codes.contiguous(), scale.contiguous(), zero, g_idx)
