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
Refused: strategies other than group/channel, float types, bits other than 4 and 8, quantized
activations, and experts split over several config groups.

`float-quantized` fp8 W8A8 (compressed-tensors' `FloatQuantizationCompressor`, the FP8, FP8_DYNAMIC and
FP8_BLOCK presets), per projection:

| tensor | dtype | shape |
|---|---|---|
| `weight` | float8_e4m3fn | [N, K] |
| `weight_scale` | the model's float dtype | [1] tensor, [N, 1] channel, [ceil(N/br), ceil(K/bc)] block |

w = weight * weight_scale (symmetric: `_remove_symmetric_zp` drops the zero point on compress). Weights
`strategy: channel` and `tensor` load as per-channel scales: canonical w13 has one tensor scale per
expert but gate_proj and up_proj each carry their own, so every row takes its projection's scale
(exact). Activations must be dynamic, with the scheme's granularity: `token` or `tensor` with
channel/tensor weights, `group` of block[1] with block weights (fp8_w8a8's three forms). Refused:
static input scales (`input_scale`, the FP8 preset: no scheme applies a calibrated activation scale),
asymmetric fp8, weight strategies other than tensor/channel/block, other activation pairings, and
fp8 weights without quantized activations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from moe_core.quant import MoEQuantConfig, fp8_w8a8, int4_w4a16, int8_w8a16
from moe_core.weights._config import config_bool, config_int
from moe_core.weights._intquant import (
    QuantizedProjection,
    assemble_int_experts,
    check_trivial_g_idx,
    expert_projection_names,
    int4_words_as_packed,
    unpack_int32,
)
from moe_core.weights._source import FLOAT_DTYPES, CheckpointError, TensorSource, expert_ids, join_key
from moe_core.weights.canonical import ExpertWeights
from moe_core.weights.fp8 import stack_fp8_experts

__all__ = ["CompressedTensorsFP8Scheme", "CompressedTensorsScheme", "check_compressed_tensors_groups",
           "compressed_tensors_experts", "compressed_tensors_scheme_for"]

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


@dataclass(frozen=True)
class CompressedTensorsFP8Scheme:
    """A float-quantized fp8 W8A8 group: weight scales per tensor, channel or block; dynamic activations."""

    weights: str  # "tensor", "channel" or "block"
    activations: str  # "token", "tensor" or "group" (1 x block[1], with block weights only)
    block: tuple[int, int] | None = None  # (rows, cols) of the weight per scale, block weights only

    def quant_config(self) -> MoEQuantConfig:
        if self.weights == "block":
            return fp8_w8a8("block", block=self.block)
        # Per-tensor scales load per channel (see the module docstring): the same values, exactly.
        return fp8_w8a8("channel", activation_scales=self.activations)


def compressed_tensors_scheme_for(qc: Mapping[str, object], modules: Sequence[str]
                                  ) -> CompressedTensorsScheme | CompressedTensorsFP8Scheme | None:
    """The weight scheme config.json's `quantization_config` gives `modules`, or None if all are ignored.

    Every module must resolve to one scheme (or all to none): a layer cannot mix them.
    """
    groups = _config_groups(qc)
    ignore = _strings(qc.get("ignore"), "ignore")
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
    return None if match is None else _group_scheme(qc, *match)


def check_compressed_tensors_groups(qc: Mapping[str, object]) -> None:
    """Raise ValueError naming the first config group no reader serves (before anything is loaded)."""
    for name, group in _config_groups(qc).items():
        _group_scheme(qc, name, group)


def _config_groups(qc: Mapping[str, object]) -> Mapping[str, Mapping]:
    if qc.get("quant_method") != "compressed-tensors":
        raise ValueError(f"quantization_config.quant_method={qc.get('quant_method')!r}: expected 'compressed-tensors'")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, Mapping) or not all(isinstance(g, Mapping) for g in groups.values()):
        raise ValueError(f"compressed-tensors quantization_config.config_groups={groups!r} is invalid: expected an "
                         'object of named groups, e.g. {"group_0": {"targets": ["Linear"], "weights": {...}}}')
    missing = [name for name, group in groups.items() if "targets" not in group]
    if missing:  # compressed-tensors requires them; without, a group would silently quantize nothing
        raise ValueError(f"compressed-tensors quantization_config.config_groups.{missing[0]} has no 'targets': "
                         'expected a list of module names or "re:" patterns, e.g. ["Linear"]')
    return groups


def _group_scheme(qc: Mapping[str, object], group_name: str, group: Mapping
                  ) -> CompressedTensorsScheme | CompressedTensorsFP8Scheme:
    fmt = group.get("format") or qc.get("format")
    if fmt == "float-quantized":
        return _fp8_scheme(group_name, group)
    if fmt != "pack-quantized":
        raise ValueError(f"compressed-tensors format={fmt!r} (group {group_name!r}) is not supported here: "
                         "expected 'pack-quantized' (int4/int8 weights) or 'float-quantized' (fp8 W8A8)")
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


def _fp8_scheme(group_name: str, group: Mapping) -> CompressedTensorsFP8Scheme:
    """A float-quantized group, or ValueError naming the group, field, value and what is read."""
    where = f"compressed-tensors format 'float-quantized': quantization_config.config_groups.{group_name}"
    w, a = group.get("weights"), group.get("input_activations")

    def check_fp8(role: str, args: object) -> None:
        if not isinstance(args, Mapping):
            raise ValueError(f"{where}.{role}={args!r} is invalid: expected an object (num_bits 8, type 'float', ...)")
        if args.get("type", "int") != "float" or config_int(args, "num_bits", f"{where}.{role}", "8", 8) != 8:
            raise ValueError(f"{where}.{role} (type={args.get('type', 'int')!r}, num_bits={args.get('num_bits', 8)!r}) "
                             "is not served: expected type 'float' with num_bits 8 (fp8 e4m3)")
        if not config_bool(args, "symmetric", True, f"{where}.{role}"):
            raise ValueError(f"{where}.{role}.symmetric=false is not served: fp8 codes have no zero point in "
                             "moe_core; expected symmetric true")

    check_fp8("weights", w)
    if not a:
        raise ValueError(f"{where}.input_activations={a!r}: fp8 weights with 16-bit activations are not read; "
                         "expected fp8 W8A8 (input_activations num_bits 8, type 'float', dynamic true)")
    check_fp8("input_activations", a)
    if config_bool(w, "dynamic", False, f"{where}.weights"):
        raise ValueError(f"{where}.weights.dynamic=true is not served: dynamic weight quantization stores no scales; "
                         "expected false")
    if w.get("actorder") in (True, *_RUNTIME_ACTORDER):
        raise ValueError(f"{where}.weights.actorder={w.get('actorder')!r} is not served with fp8 weights: expected "
                         "null, false, 'weight' or 'static' (no runtime grouping)")
    if a.get("dynamic", False) is not True:
        raise ValueError(f"{where}.input_activations.dynamic={a.get('dynamic', False)!r} is not served: moe_core "
                         "quantizes fp8 activations dynamically, and no scheme applies a static (calibrated) "
                         "input_scale; expected true (per token, per tensor or per 1 x block-column group)")
    weights, activations = _strategy(w, f"{where}.weights"), _strategy(a, f"{where}.input_activations")
    if weights == "block":
        block = w.get("block_structure")
        if not (isinstance(block, list | tuple) and len(block) == 2
                and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise ValueError(f"{where}.weights.block_structure={block!r} is invalid: expected two positive ints "
                             "[rows, cols], e.g. [128, 128]")
        group_size = a.get("group_size")
        if activations != "group" or group_size != block[1]:
            raise ValueError(f"{where}.input_activations (strategy={activations!r}, group_size={group_size!r}) is "
                             f"not served with block {list(block)} weights: expected strategy 'group' with group_size "
                             f"{block[1]} (the block's columns)")
        return CompressedTensorsFP8Scheme("block", "group", tuple(block))
    if weights not in ("tensor", "channel"):
        raise ValueError(f"{where}.weights.strategy={weights!r} is not served with fp8 weights: expected "
                         "'tensor', 'channel' or 'block'")
    if activations not in ("token", "tensor"):
        raise ValueError(f"{where}.input_activations.strategy={activations!r} is not served with {weights!r} "
                         "weights: expected 'token' or 'tensor' (group activations go with block weights)")
    return CompressedTensorsFP8Scheme(weights, activations)


def _strategy(args: Mapping, where: str) -> str:
    """`strategy`, or what compressed-tensors infers without it: from group_size (none: tensor)."""
    strategy = args.get("strategy")
    if strategy is None:
        group_size = args.get("group_size")
        strategy = "tensor" if group_size is None else "channel" if group_size == -1 else "group"
    if not isinstance(strategy, str):
        raise ValueError(f"{where}.strategy={strategy!r} is invalid: expected a string such as 'channel'")
    return strategy.lower()


def _strings(value: object, field: str) -> list[str]:
    """A list of strings (null: none), as `ignore` and `targets` are."""
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"compressed-tensors quantization_config.{field}={value!r} is invalid: expected a list of "
                         "module names or 're:' patterns")
    return list(value)


def compressed_tensors_experts(source: TensorSource, prefix: str, num_experts: int,
                               scheme: CompressedTensorsScheme | CompressedTensorsFP8Scheme,
                               experts: Sequence[int] | None = None) -> ExpertWeights:
    ids = expert_ids(num_experts, experts)
    if isinstance(scheme, CompressedTensorsFP8Scheme):
        return stack_fp8_experts(source, prefix, ids, scheme.quant_config().weight, "weight_scale",
                                 lambda module: fp8_projection(source, module, scheme))
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
    as_packed = int4_words_as_packed(packed, 1, K) if bits == 4 else None
    codes = as_packed if as_packed is not None else unpack_int32(packed, bits, dim=1)[:, :K]
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
    return QuantizedProjection(codes.contiguous(), scale.contiguous(), zero, g_idx, packed=as_packed is not None)


def fp8_projection(source: TensorSource, module: str, scheme: CompressedTensorsFP8Scheme
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """One float-quantized linear: (codes float8_e4m3fn [N, K], fp32 scales [N] per row or the block grid)."""
    weight = source.get(f"{module}.weight", (None, None), (torch.float8_e4m3fn,))
    N, K = weight.shape
    key = f"{module}.weight_scale"
    if scheme.weights == "block":
        br, bc = scheme.block
        return weight, source.get(key, (-(-N // br), -(-K // bc)), FLOAT_DTYPES).float()
    if scheme.weights == "channel":
        return weight, source.get(key, (N, 1), FLOAT_DTYPES).float().squeeze(1)
    return weight, source.get(key, (1,), FLOAT_DTYPES).float().expand(N)  # the tensor's one scale on every row
