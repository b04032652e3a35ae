"""Quantization descriptors: `QuantKey` (one tensor role), `MoEQuantConfig` (a layer) and factories.

A key says everything a kernel needs to know to accept or refuse a tensor: value type, bits,
how stored codes map to values (implicit offset, zero points), scale granularity and group size,
act-order, static or dynamic. Nothing is folded into a coarser bucket, so adding a group size
never silently re-routes a model. Tensors themselves travel in `moe_core.weights.ExpertWeights`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = [
    "BF16",
    "FP8_BLOCK128_WEIGHT",
    "FP8_CHANNEL_WEIGHT",
    "FP8_DYNAMIC_GROUP128",
    "FP8_DYNAMIC_TENSOR",
    "FP8_DYNAMIC_TOKEN",
    "FP8_TENSOR_WEIGHT",
    "FP16",
    "FP32",
    "MXFP4_WEIGHT",
    "SCHEME_SPELLINGS",
    "Granularity",
    "MoEQuantConfig",
    "QuantDType",
    "QuantFamily",
    "QuantKey",
    "ScaleSpec",
    "ZeroPoint",
    "fp8_w8a8",
    "int4_w4a16",
    "int8_w8a16",
    "mxfp4_w4a16",
    "unquantized",
]


class QuantDType(enum.StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8_E4M3 = "fp8e4m3"
    INT8 = "int8"  # integer codes, stored unsigned 0..255 in canonical form
    INT4 = "int4"  # integer codes, stored unsigned 0..15, two per byte, low nibble = even k
    FP4_E2M1 = "fp4e2m1"  # OCP MX fp4, two per byte, low nibble = even k

    @property
    def bits(self) -> int:
        return {"bf16": 16, "fp16": 16, "fp32": 32, "fp8e4m3": 8, "int8": 8, "int4": 4, "fp4e2m1": 4}[self.value]

    @property
    def is_float_unquantized(self) -> bool:
        return self in (QuantDType.BF16, QuantDType.FP16, QuantDType.FP32)

    @staticmethod
    def from_torch(dtype: torch.dtype) -> QuantDType:
        try:
            return {torch.bfloat16: QuantDType.BF16, torch.float16: QuantDType.FP16,
                    torch.float32: QuantDType.FP32}[dtype]
        except KeyError:
            raise ValueError(f"no unquantized QuantDType for {dtype}; expected bf16, fp16 or fp32") from None


class Granularity(enum.StrEnum):
    TENSOR = "tensor"  # one scale per expert tensor
    CHANNEL = "channel"  # one per output row (weights)
    TOKEN = "token"  # one per row of activations
    GROUP = "group"  # one per `group_size` consecutive input elements of a row (weights or activations)
    BLOCK = "block"  # one per `block_shape` tile of a weight (rows, cols), e.g. (128, 128)


class ZeroPoint(enum.StrEnum):
    NONE = "none"  # symmetric: value = (code - offset) * scale, offset = 2**(bits-1) for ints
    INTEGER = "integer"  # value = (code - zero) * scale, integer zero per scale group (GPTQ/AWQ/CT asym)
    FLOAT = "float"  # value = (code - offset) * scale + zero, float zero per group (tinygemm/HQQ style)


@dataclass(frozen=True)
class ScaleSpec:
    granularity: Granularity
    group_size: int | None = None  # GROUP only: input elements per scale (weights: along K)
    block_shape: tuple[int, int] | None = None  # BLOCK only: (rows, cols) of the weight per scale
    dtype: str = "fp32"  # storage of the scales: fp32, bf16, fp16 or e8m0 (power-of-two exponents)
    dynamic: bool = False  # computed from the tensor at run time (activations) instead of loaded

    def __post_init__(self) -> None:
        if not isinstance(self.granularity, Granularity):
            object.__setattr__(self, "granularity", Granularity(self.granularity))
        if self.dtype not in ("fp32", "bf16", "fp16", "e8m0"):
            raise ValueError(f"ScaleSpec.dtype={self.dtype!r} is invalid: expected fp32, bf16, fp16 or e8m0")
        if self.granularity is Granularity.GROUP:
            if not isinstance(self.group_size, int) or isinstance(self.group_size, bool) or self.group_size < 1:
                raise ValueError(f"ScaleSpec.group_size={self.group_size!r} is invalid: GROUP scales need a "
                                 "positive group size (use CHANNEL for one scale per row)")
        elif self.group_size is not None:
            raise ValueError(f"ScaleSpec.group_size={self.group_size} is only valid with GROUP granularity")
        if self.granularity is Granularity.BLOCK:
            bs = self.block_shape
            if not (isinstance(bs, tuple) and len(bs) == 2
                    and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in bs)):
                raise ValueError(f"ScaleSpec.block_shape={bs!r} is invalid: BLOCK scales need (rows, cols) > 0")
        elif self.block_shape is not None:
            raise ValueError(f"ScaleSpec.block_shape={self.block_shape} is only valid with BLOCK granularity")

    def __str__(self) -> str:
        g = self.granularity.value
        if self.group_size is not None:
            g += f"{self.group_size}"
        if self.block_shape is not None:
            g += f"{self.block_shape[0]}x{self.block_shape[1]}"
        return f"{'dynamic' if self.dynamic else 'static'}-{g}-{self.dtype}"


@dataclass(frozen=True)
class QuantKey:
    """One tensor role (weights or activations) of a layer."""

    dtype: QuantDType
    scale: ScaleSpec | None = None  # None: unquantized (dtype is bf16/fp16/fp32)
    zero_point: ZeroPoint = ZeroPoint.NONE
    act_order: bool = False  # weights only: g_idx maps each input channel to its scale group (GPTQ desc_act)

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, QuantDType):
            object.__setattr__(self, "dtype", QuantDType(self.dtype))
        if not isinstance(self.zero_point, ZeroPoint):
            object.__setattr__(self, "zero_point", ZeroPoint(self.zero_point))
        if self.dtype.is_float_unquantized:
            if self.scale is not None or self.zero_point is not ZeroPoint.NONE or self.act_order:
                raise ValueError(f"QuantKey: unquantized {self.dtype.value} takes no scale, zero point or act-order")
            return
        if self.scale is None:
            raise ValueError(f"QuantKey: {self.dtype.value} needs a ScaleSpec")
        is_int = self.dtype in (QuantDType.INT4, QuantDType.INT8)
        if self.zero_point is not ZeroPoint.NONE and not is_int:
            raise ValueError(f"QuantKey: zero points are only defined for integer codes, not {self.dtype.value}")
        if self.act_order and not (is_int and self.scale.granularity is Granularity.GROUP):
            raise ValueError("QuantKey: act_order needs integer codes with GROUP scales (GPTQ desc_act)")
        if self.dtype is QuantDType.FP4_E2M1 and (self.scale.granularity is not Granularity.GROUP
                                                  or self.scale.dtype != "e8m0"):
            raise ValueError("QuantKey: fp4e2m1 is supported as OCP MXFP4 only (GROUP 32 scales in e8m0)")

    @property
    def quantized(self) -> bool:
        return self.scale is not None

    @property
    def bits(self) -> int:
        return self.dtype.bits

    @property
    def group_size(self) -> int | None:
        return self.scale.group_size if self.scale else None

    @property
    def code_offset(self) -> int:
        """Implicit zero of symmetric integer codes (uint4b8 -> 8, uint8b128 -> 128); 0 otherwise."""
        if self.dtype in (QuantDType.INT4, QuantDType.INT8) and self.zero_point is not ZeroPoint.INTEGER:
            return 1 << (self.bits - 1)
        return 0

    def __str__(self) -> str:
        if not self.quantized:
            return self.dtype.value
        s = f"{self.dtype.value}[{self.scale}]"
        if self.zero_point is not ZeroPoint.NONE:
            s += f"+zp:{self.zero_point.value}"
        if self.act_order:
            s += "+act_order"
        return s


# ---- named keys -----------------------------------------------------------------------------

BF16 = QuantKey(QuantDType.BF16)
FP16 = QuantKey(QuantDType.FP16)
FP32 = QuantKey(QuantDType.FP32)
FP8_TENSOR_WEIGHT = QuantKey(QuantDType.FP8_E4M3, ScaleSpec(Granularity.TENSOR))
FP8_CHANNEL_WEIGHT = QuantKey(QuantDType.FP8_E4M3, ScaleSpec(Granularity.CHANNEL))
FP8_BLOCK128_WEIGHT = QuantKey(QuantDType.FP8_E4M3, ScaleSpec(Granularity.BLOCK, block_shape=(128, 128)))
FP8_DYNAMIC_TENSOR = QuantKey(QuantDType.FP8_E4M3, ScaleSpec(Granularity.TENSOR, dynamic=True))
FP8_DYNAMIC_TOKEN = QuantKey(QuantDType.FP8_E4M3, ScaleSpec(Granularity.TOKEN, dynamic=True))
FP8_DYNAMIC_GROUP128 = QuantKey(QuantDType.FP8_E4M3, ScaleSpec(Granularity.GROUP, group_size=128, dynamic=True))
MXFP4_WEIGHT = QuantKey(QuantDType.FP4_E2M1, ScaleSpec(Granularity.GROUP, group_size=32, dtype="e8m0"))


class QuantFamily(enum.StrEnum):
    """The unit in which backends are prioritised (vLLM keeps one oracle per family)."""

    UNQUANTIZED = "unquantized"
    FP8 = "fp8"
    WNA16 = "wna16"  # int4/int8 weights, 16-bit activations
    MXFP4 = "mxfp4"


@dataclass(frozen=True)
class MoEQuantConfig:
    """The quantization of one layer: its weights' key and its activations' key.

    `activation` is None when activations stay in the layer dtype (weight-only schemes).
    """

    weight: QuantKey
    activation: QuantKey | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.weight, QuantKey):
            raise ValueError(f"MoEQuantConfig.weight={self.weight!r} is invalid: expected a QuantKey")
        a = self.activation
        if a is not None and (not isinstance(a, QuantKey) or not a.quantized or not a.scale.dynamic):
            raise ValueError(f"MoEQuantConfig.activation={a!s} is invalid: expected None (16-bit activations) "
                             "or a dynamic quantized key such as FP8_DYNAMIC_TOKEN")
        if a is not None and self.weight.dtype is not QuantDType.FP8_E4M3:
            raise ValueError(f"MoEQuantConfig: quantized activations ({a}) are only supported with fp8 weights")

    @property
    def family(self) -> QuantFamily:
        d = self.weight.dtype
        if d.is_float_unquantized:
            return QuantFamily.UNQUANTIZED
        if d is QuantDType.FP8_E4M3:
            return QuantFamily.FP8
        if d is QuantDType.FP4_E2M1:
            return QuantFamily.MXFP4
        return QuantFamily.WNA16

    @property
    def name(self) -> str:
        """Short scheme name used in tables, tuned-config files and CLI flags."""
        w = self.weight
        if not w.quantized:
            return "unquantized"
        if w.dtype in (QuantDType.INT4, QuantDType.INT8):
            g = w.scale.group_size if w.scale.granularity is Granularity.GROUP else "channel"
            s = f"{w.dtype.value}_w{w.bits}a16_g{g}"
            if w.zero_point is ZeroPoint.INTEGER:
                s += "_zp"
            return s + ("_actorder" if w.act_order else "")
        if w.dtype is QuantDType.FP8_E4M3:
            return f"fp8_w8a8_{w.scale.granularity.value}"
        return "mxfp4_w4a16"

    def __str__(self) -> str:
        if not self.weight.quantized:
            return "weights and activations in the layer dtype"
        return f"w={self.weight} a={self.activation or '16-bit'}"


# ---- factories ------------------------------------------------------------------------------


def unquantized() -> MoEQuantConfig:
    """Weights in the layer's dtype. The key says bf16 by convention: for unquantized layers
    `MoEConfig.dtype` is the weights' dtype too, and kernels check that."""
    return MoEQuantConfig(BF16)


def _int_weight_key(dtype: QuantDType, group_size: int, zero_point: bool, act_order: bool,
                    scale_dtype: str) -> QuantKey:
    if group_size == -1:
        if act_order:
            raise ValueError("act_order needs grouped scales (group_size > 0), not per-channel (-1)")
        scale = ScaleSpec(Granularity.CHANNEL, dtype=scale_dtype)
    elif isinstance(group_size, int) and not isinstance(group_size, bool) and group_size > 0:
        scale = ScaleSpec(Granularity.GROUP, group_size=group_size, dtype=scale_dtype)
    else:
        raise ValueError(f"group_size={group_size!r} is invalid: expected a positive int or -1 (per channel)")
    return QuantKey(dtype, scale, ZeroPoint.INTEGER if zero_point else ZeroPoint.NONE, act_order)


def int4_w4a16(group_size: int = 128, zero_point: bool = False, act_order: bool = False,
               scale_dtype: str = "bf16") -> MoEQuantConfig:
    """int4 weights (GPTQ/AWQ/compressed-tensors), 16-bit activations. group_size -1 = per channel."""
    return MoEQuantConfig(_int_weight_key(QuantDType.INT4, group_size, zero_point, act_order, scale_dtype))


def int8_w8a16(group_size: int = -1, zero_point: bool = False, act_order: bool = False,
               scale_dtype: str = "bf16") -> MoEQuantConfig:
    """int8 weights, 16-bit activations. group_size -1 = per channel."""
    return MoEQuantConfig(_int_weight_key(QuantDType.INT8, group_size, zero_point, act_order, scale_dtype))


def fp8_w8a8(granularity: str = "tensor", block: tuple[int, int] | None = None,
             dynamic_activations: bool = True, activation_scales: str = "token") -> MoEQuantConfig:
    """fp8 e4m3 weights with fp8 activations quantized on the fly.

    granularity: "tensor" (one scale per expert weight), "channel" (one per output row) or "block"
    (block[0] x block[1] weight blocks with 1 x block[1] activation groups, DeepSeek-V3; block
    defaults to (128, 128) and is read with "block" only).

    activation_scales ("tensor" and "channel" weights): "token" (default), one dynamic scale per
    token, so each token's output depends on that token alone; or "tensor", one scale for the whole
    batch, which a checkpoint calibrated that way demands (compressed-tensors `strategy: tensor`):
    then one outlier token coarsens every other token's quantization and one Inf makes the whole
    batch NaN.
    """
    if not dynamic_activations:
        raise ValueError("fp8_w8a8: static activation scales are not supported; pass dynamic_activations=True")
    if block is not None and granularity != "block":
        raise ValueError(f"fp8_w8a8: block={block!r} is read with granularity='block' only, not "
                         f"granularity={granularity!r}")
    if activation_scales not in ("token", "tensor"):
        raise ValueError(f"fp8_w8a8: activation_scales={activation_scales!r} is invalid: expected 'token' "
                         "(one scale per token) or 'tensor' (one per batch)")
    activation = FP8_DYNAMIC_TOKEN if activation_scales == "token" else FP8_DYNAMIC_TENSOR
    if granularity == "tensor":
        return MoEQuantConfig(FP8_TENSOR_WEIGHT, activation)
    if granularity == "channel":
        return MoEQuantConfig(FP8_CHANNEL_WEIGHT, activation)
    if granularity == "block":
        if activation_scales != "token":  # the activation groups follow the weight blocks
            raise ValueError(f"fp8_w8a8: activation_scales={activation_scales!r} is not read with "
                             "granularity='block': its activations are scaled per 1 x block[1] group")
        block = (128, 128) if block is None else block
        if not isinstance(block, tuple | list) or len(block) != 2:
            raise ValueError(f"fp8_w8a8: block={block!r} is invalid: expected (rows, cols) of the weight per scale, "
                             "e.g. (128, 128)")
        w = QuantKey(QuantDType.FP8_E4M3, ScaleSpec(Granularity.BLOCK, block_shape=tuple(block)))
        a = QuantKey(QuantDType.FP8_E4M3, ScaleSpec(Granularity.GROUP, group_size=block[1], dynamic=True))
        return MoEQuantConfig(w, a)
    raise ValueError(f"fp8_w8a8: granularity={granularity!r} is invalid: expected 'tensor', 'channel' or 'block'")


def mxfp4_w4a16() -> MoEQuantConfig:
    """OCP MXFP4 weights (e2m1 codes, e8m0 scale per 32), 16-bit activations (gpt-oss)."""
    return MoEQuantConfig(MXFP4_WEIGHT)


SCHEMES = {
    "unquantized": unquantized,
    "int4": int4_w4a16,
    "int8": int8_w8a16,
    "fp8-tensor": lambda: fp8_w8a8("tensor"),
    "fp8-channel": lambda: fp8_w8a8("channel"),
    "fp8-block": lambda: fp8_w8a8("block"),
    "mxfp4": mxfp4_w4a16,
}

# Names of the unquantized scheme across the CLI (bench's bf16, tune's none): the layer dtype is --dtype's.
UNQUANTIZED_NAMES = ("unquantized", "bf16", "fp16", "none")
SCHEME_SPELLINGS = ("unquantized (or bf16, fp16, none), int4[:G[:zp]], int8[:G[:zp]], fp8-tensor[:token|:tensor], "
                    "fp8-channel[:token|:tensor], fp8-block, mxfp4")


def parse_scheme(text: str) -> MoEQuantConfig:
    """CLI spelling, the same scheme as the factory of that name called with the same arguments:

    - `int4[:G[:zp]]`, `int8[:G[:zp]]`: `int4_w4a16` / `int8_w8a16`; G is a group size or -1 for per
      channel; without G, each factory's default: int4 groups of 128, int8 per channel. 'zp' adds
      integer zero points. (`moe run`/`moe bench` read a bare `int4` as the preset's group size.)
    - `fp8-tensor[:A]`, `fp8-channel[:A]`: `fp8_w8a8` with per-tensor or per-channel weight scales and
      activation scales A: `token` (default, one per token) or `tensor` (one per batch).
    - `fp8-block`: 128x128 weight blocks, activation groups of 128; `mxfp4`; `unquantized`, also
      spelled `bf16`, `fp16` or `none` (the weights are in the layer dtype, whichever it is).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_scheme takes a scheme's name (a str such as 'int4:128'), got {text!r}")
    if text in UNQUANTIZED_NAMES:
        return unquantized()
    head, *rest = text.split(":")
    if head in ("int4", "int8"):
        factory = int4_w4a16 if head == "int4" else int8_w8a16
        kwargs: dict = {}
        if rest:
            try:
                kwargs["group_size"] = int(rest[0])
            except ValueError:
                raise ValueError(f"scheme {text!r}: group size {rest[0]!r} is not an int") from None
        if len(rest) > 1:
            if rest[1] != "zp" or len(rest) > 2:
                raise ValueError(f"scheme {text!r}: expected {head}:GROUP[:zp]")
            kwargs["zero_point"] = True
        return factory(**kwargs)
    if head in ("fp8-tensor", "fp8-channel") and len(rest) == 1:
        if rest[0] not in ("token", "tensor"):
            raise ValueError(f"scheme {text!r}: activation scales {rest[0]!r} are invalid: expected "
                             f"{head}:token or {head}:tensor")
        return fp8_w8a8(head.removeprefix("fp8-"), activation_scales=rest[0])
    if head in SCHEMES and not rest:
        return SCHEMES[head]()
    raise ValueError(f"unknown quantization scheme {text!r}: expected one of {SCHEME_SPELLINGS}")
