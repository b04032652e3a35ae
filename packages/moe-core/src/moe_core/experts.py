"""The experts contract: a capability record that answers `supports(...)`, and the kernel interface.

An experts class declares what it can do as data (`Capability`); `supports` evaluates the record
and returns the first reason it cannot serve a layer. Instances are per layer: the layer owns
one and nothing is shared between layers.

Two shapes:
- modular: `apply(hidden_states, topk_weights, topk_ids)`; the layer routes first.
- monolithic: `apply_monolithic(hidden_states, router_logits, correction_bias)`; the kernel routes.
  FusedMoE calls only this; a monolithic class may also serve `apply` to callers that route
  themselves (moe-triton's quantized classes do).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import ActivationKind, Feature, MoEConfig, RoutingMethod
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType, ZeroPoint
from moe_core.weights.canonical import ExpertWeights
from moe_core.weights.processor import PackedWeights, WeightProcessor

__all__ = ["UNQUANTIZED", "Capability", "Experts", "SchemeSupport", "Support", "check_routed_inputs"]


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str = ""  # why not (empty when ok)

    def __bool__(self) -> bool:
        return self.ok

    @staticmethod
    def yes() -> Support:
        return Support(True)

    @staticmethod
    def no(reason: str) -> Support:
        return Support(False, reason)


def _fmt(values) -> str:
    return "{" + ", ".join(sorted(str(getattr(v, "value", v)) for v in values)) + "}"


@dataclass(frozen=True)
class SchemeSupport:
    """One quantization scheme a kernel accepts. Unset constraint fields accept anything."""

    weight: QuantDType  # value type of the weights
    granularities: frozenset[Granularity] = frozenset()  # weight scale granularities (empty: unquantized)
    group_sizes: frozenset[int] | None = None  # GROUP scales: accepted sizes (None: any that divides K and N)
    block_shapes: frozenset[tuple[int, int]] | None = None  # BLOCK scales: accepted shapes
    zero_points: frozenset[ZeroPoint] = frozenset({ZeroPoint.NONE})
    act_order: bool = False  # accepts g_idx
    activation: QuantDType | None = None  # None: 16-bit activations; else the dynamic activation type

    def check(self, quant: MoEQuantConfig) -> Support:
        w = quant.weight
        if not w.quantized and self.weight.is_float_unquantized:
            pass  # unquantized weights are in the layer dtype, which Capability.dtypes checks
        elif w.dtype is not self.weight:
            return Support.no(f"weights {w.dtype.value} (supports: {self.weight.value})")
        if w.quantized:
            g = w.scale.granularity
            if g not in self.granularities:
                return Support.no(f"{g.value} weight scales (supported: {_fmt(self.granularities)})")
            if g is Granularity.GROUP and self.group_sizes is not None and w.group_size not in self.group_sizes:
                return Support.no(f"group size {w.group_size} (supported: {_fmt(self.group_sizes)})")
            if g is Granularity.BLOCK and self.block_shapes is not None and w.scale.block_shape not in self.block_shapes:
                return Support.no(f"block shape {w.scale.block_shape} (supported: {_fmt(self.block_shapes)})")
            if w.zero_point not in self.zero_points:
                return Support.no(f"{w.zero_point.value} zero points (supported: {_fmt(self.zero_points)})")
            if w.act_order and not self.act_order:
                return Support.no("act-order (g_idx) weights")
        a = quant.activation
        if (a.dtype if a is not None else None) is not self.activation:
            want = self.activation.value if self.activation else "16-bit"
            return Support.no(f"activations {a.dtype.value if a else '16-bit'} (supports: {want})")
        return Support.yes()


def check_routed_inputs(hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                        config: MoEConfig) -> None:
    """`Experts.apply`'s inputs, checked where a kernel would otherwise drop ids outside [0, E), truncate
    float ids, ignore extra weight columns or fail deep inside: hidden_states [M, K] in the layer dtype,
    integer topk_ids and float topk_weights both [M, k], every id in [0, num_experts). For kernels on
    the CPU, where the range check costs no device sync."""
    K, E = config.hidden_size, config.num_experts
    if hidden_states.dim() != 2 or hidden_states.shape[1] != K or hidden_states.dtype != config.dtype:
        raise ValueError(f"hidden_states must be [M, {K}] in the layer dtype {config.dtype}, got "
                         f"{hidden_states.dtype} {list(hidden_states.shape)}")
    M = hidden_states.shape[0]
    if topk_ids.dim() != 2 or topk_ids.shape[0] != M or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids and topk_weights must both be [{M}, top_k] for {M} tokens, got "
                         f"{list(topk_ids.shape)} and {list(topk_weights.shape)}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype.is_complex or topk_ids.dtype == torch.bool:
        raise ValueError(f"topk_ids must hold integer expert ids, got {topk_ids.dtype}")
    if not topk_weights.dtype.is_floating_point:
        raise ValueError(f"topk_weights must be floating point, got {topk_weights.dtype}")
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= E):
        bad = topk_ids[(topk_ids < 0) | (topk_ids >= E)]
        raise ValueError(f"topk_ids hold expert ids outside [0, {E}) (the layer's experts): "
                         f"{sorted(set(bad.tolist()))[:8]}")


ENV_CHECK_IDS = "MOE_CHECK_EXPERT_IDS"


@functools.cache
def checking_ids_on_accelerators() -> bool:
    """Whether GPU kernels check `Experts.apply`'s inputs too (MOE_CHECK_EXPERT_IDS=1, read once): the
    range check costs a host synchronization per call, so by default they trust the contract
    (routers produce ids in [0, E) by construction) and an id outside it reads out of bounds."""
    flag = os.environ.get(ENV_CHECK_IDS, "0")
    if flag not in ("0", "1"):
        raise ValueError(f"{ENV_CHECK_IDS}={flag!r}: accepted values are 0 (GPU kernels trust Experts.apply's "
                         "expert ids, the default) and 1 (check them, synchronizing with the device)")
    return flag == "1"


# Weights in the layer's dtype (which `Capability.dtypes` constrains).
UNQUANTIZED = SchemeSupport(QuantDType.BF16)


@dataclass(frozen=True)
class Capability:
    """What an experts class can serve. Every field is checked by `Experts.supports`."""

    platforms: frozenset[Platform]
    schemes: tuple[SchemeSupport, ...]
    activations: frozenset[ActivationKind]
    dtypes: frozenset[torch.dtype] = frozenset({torch.bfloat16, torch.float16, torch.float32})
    min_capability: tuple[int, int] | None = None  # CUDA/ROCm only, inclusive
    max_capability: tuple[int, int] | None = None  # inclusive
    routing_methods: frozenset[RoutingMethod] | None = None  # monolithic kernels: methods fused; None = any
    features: frozenset[Feature] = frozenset()  # optional semantics (config.features) it implements, incl. routing
    bias: bool = True  # per-expert GEMM biases
    expert_parallel: bool = True  # accepts an expert_map (local experts)
    tensor_parallel: bool = True
    hidden_multiple: int = 1  # K must be a multiple of this
    intermediate_multiple: int = 1  # N (per partition) must be a multiple of this
    requires: tuple[str, ...] = ()  # importable modules the kernel needs (checked without importing)
    validated_on: tuple[str, ...] = ()  # "platform: hardware" this class's tests passed on for real,
    #                                      e.g. "cuda: NVIDIA H100 80GB HBM3"; a platform never named is unvalidated
    limitations: tuple[str, ...] = ()  # what it does not do, in words, for docs and `moe explain`

    def __post_init__(self) -> None:
        names = sorted(p.value for p in Platform)
        for entry in self.validated_on:
            platform, sep, hardware = entry.partition(":")
            if not sep or platform.strip() not in names or not hardware.strip():
                raise ValueError(f"Capability.validated_on entry {entry!r} is invalid: expected 'platform: hardware' "
                                 f"with platform one of {names}")

    def check_compute_capability(self, device: DeviceInfo) -> Support:
        """The device's compute capability against min/max (devices that report none pass)."""
        have = device.capability
        if have is not None:
            if self.min_capability and have < self.min_capability:
                return Support.no(f"needs compute capability >= {self.min_capability}, device has {have}")
            if self.max_capability and have > self.max_capability:
                return Support.no(f"needs compute capability <= {self.max_capability}, device has {have}")
        return Support.yes()

    @property
    def unvalidated_platforms(self) -> frozenset[Platform]:
        """Platforms the record claims but no real run has covered."""
        seen = {entry.partition(":")[0].strip() for entry in self.validated_on}
        return frozenset(p for p in self.platforms if p.value not in seen)


class Experts(ABC):
    """Base of every experts class. Subclasses set the class attributes and implement `apply*`."""

    backend: ClassVar[str]  # the name its plugin's ExpertsRef and Priority use
    capability: ClassVar[Capability]
    weight_processor: ClassVar[WeightProcessor]
    monolithic: ClassVar[bool] = False

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> None:
        self.config = config
        self.quant = quant
        self.device = device
        self.weights: PackedWeights | None = None
        self.expert_map = config.expert_map(device.torch_device)

    # ---- capability -----------------------------------------------------------------------

    @classmethod
    def name(cls) -> str:
        return cls.__name__

    @classmethod
    def supports(cls, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> Support:
        """The first reason this class cannot serve the layer, or ok."""
        cap = cls.capability
        if device.platform not in cap.platforms:
            return Support.no(f"runs on {_fmt(cap.platforms)}, not {device.platform.value}")
        arch = cap.check_compute_capability(device)
        if not arch:
            return arch
        for module in cap.requires:
            if importlib.util.find_spec(module) is None:
                return Support.no(f"needs the Python package {module!r}, which is not installed")
        if config.dtype not in cap.dtypes:
            return Support.no(f"activation dtype {config.dtype} (supported: {_fmt(cap.dtypes)})")
        if config.activation.kind not in cap.activations:
            return Support.no(f"activation {config.activation.kind.value} (supported: {_fmt(cap.activations)})")
        missing = config.features - cap.features
        if missing:
            return Support.no(f"does not implement {_fmt(missing)} (implements: {_fmt(cap.features) if cap.features else 'none'})")
        reasons = [s.check(quant) for s in cap.schemes]
        if not any(reasons):
            if not reasons:
                return Support.no("declares no quantization scheme")
            wrong_type = [s for s in cap.schemes if quant.weight.dtype is not s.weight
                          and not (s.weight.is_float_unquantized and not quant.weight.quantized)]
            if len(wrong_type) == len(cap.schemes):
                kinds = ", ".join(dict.fromkeys("unquantized" if s.weight.is_float_unquantized else s.weight.value
                                                for s in cap.schemes))
                got = quant.weight.dtype.value if quant.weight.quantized else "unquantized"
                return Support.no(f"does not support {got} weights (supports: {kinds})")
            return Support.no("does not support " + "; ".join(dict.fromkeys(r.reason for r in reasons if not r)))
        if cls.monolithic and cap.routing_methods is not None and config.routing.method not in cap.routing_methods:
            return Support.no(f"fused routing {config.routing.method.value} (supported: {_fmt(cap.routing_methods)})")
        if config.has_bias and not cap.bias:
            return Support.no("expert biases")
        if config.parallel.use_ep and not cap.expert_parallel:
            return Support.no("expert parallelism (expert_map)")
        if config.parallel.tp_size > 1 and not cap.tensor_parallel:
            return Support.no("tensor parallelism")
        if config.hidden_size % cap.hidden_multiple:
            return Support.no(f"hidden size {config.hidden_size} (must be a multiple of {cap.hidden_multiple})")
        n = config.intermediate_size_per_partition
        if n % cap.intermediate_multiple:
            return Support.no(f"intermediate size {n} (must be a multiple of {cap.intermediate_multiple})")
        return cls.supports_extra(config, quant, device)

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> Support:
        """Constraints the record cannot state (e.g. a group size that must divide N). Default: none."""
        return Support.yes()

    # ---- weights --------------------------------------------------------------------------

    def load_weights(self, weights: ExpertWeights) -> None:
        """Convert canonical weights to this kernel's layout. Replaces, never mutates, what was loaded."""
        weights.validate(self.config, self.quant)
        packed = self.weight_processor(weights, self.config, self.device.torch_device)
        if packed.layout != self.weight_processor.layout:
            raise RuntimeError(f"{self.name()}: processor produced layout {packed.layout!r}, "
                               f"expected {self.weight_processor.layout!r}")
        self.weights = packed

    def packed_state(self) -> PackedWeights | None:
        """The loaded weights as plain tensors that `torch.save` can write (`FusedMoE.state_dict`);
        `restore_packed` takes them back. Classes whose layout holds opaque tensors override both."""
        return self.weights

    def restore_packed(self, packed: PackedWeights) -> None:
        """Install weights `packed_state` gave (of this class's layout), as loading them would."""
        if packed.layout != self.weight_processor.layout:
            raise ValueError(f"{self.name()}: packed weights of layout {packed.layout!r}, expected "
                             f"{self.weight_processor.layout!r}")
        self.weights = packed

    def _packed(self) -> PackedWeights:
        if self.weights is None:
            raise RuntimeError(f"{self.name()}: no weights loaded; call FusedMoE.load_weights first")
        return self.weights

    # ---- compute --------------------------------------------------------------------------

    @abstractmethod
    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
              ) -> torch.Tensor:
        """Modular kernels: [M, K] in the layer dtype -> [M, K], weighted and summed over top-k.

        topk_ids are global expert ids in [0, E); choices of experts that `expert_map` marks -1
        contribute zero. CPU kernels check the ids; GPU kernels only with MOE_CHECK_EXPERT_IDS=1
        (`checking_ids_on_accelerators`), since the check synchronizes with the device.
        """

    def apply_monolithic(self, hidden_states: torch.Tensor, router_logits: torch.Tensor,
                         correction_bias: torch.Tensor | None) -> torch.Tensor:
        raise TypeError(f"{self.name()} is modular: call apply() with routed ids")

    # Modular kernels may bring a faster router; it must equal moe_core.routing.route_torch.
    router: ClassVar[str | None] = None  # "module:function" with route_torch's signature, or None

