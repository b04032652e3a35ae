"""CPU experts classes. Each sorts the routed pairs by expert and runs one MLP per expert that
received tokens (never a loop over tokens); they differ in how an expert's GEMMs are computed.

Why a loop over experts rather than `torch._grouped_mm`: on the CPU the two run equally fast,
and only a loop can call oneDNN on weights prepacked once at load, which is faster than both.
"""

from __future__ import annotations

import functools
import weakref
from abc import abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moe_core.backends import Platform
from moe_core.config import ActivationKind, Feature, MoEConfig
from moe_core.experts import UNQUANTIZED, Capability, Experts, SchemeSupport, Support, check_routed_inputs
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType, ZeroPoint
from moe_core.reference import apply_activation, fake_quantize_activation
from moe_core.weights import ExpertWeights, PackedWeights
from moe_cpu._details.dispatch import run_experts
from moe_cpu._details.packing import (
    act_order_permutation,
    dequantized,
    int4_tinygemm,
    int8_per_channel,
    w13_halves,
)

__all__ = [
    "CpuDequantizedExperts",
    "CpuFp8EmulatedExperts",
    "CpuInt4Experts",
    "CpuInt8Experts",
    "CpuOneDnnExperts",
    "CpuUnquantizedExperts",
]

_ALL_ACTIVATIONS = frozenset(ActivationKind)
# Routing runs in moe_core's route_torch and activations in its apply_activation, which implement all.
_ALL_FEATURES = frozenset(Feature)
_VALIDATED = ("cpu: AMD EPYC (x86-64, AVX-512), 2 vCPUs",)
TINYGEMM_GROUP_SIZES = frozenset({32, 64, 128, 256})


def _biases(weights: ExpertWeights, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    if not weights.has_bias:
        return {}
    # Copies: the layer must not change when the caller later writes to its own tensors.
    return {"w13_bias": weights.w13_bias.to(dtype, copy=True), "w2_bias": weights.w2_bias.to(dtype, copy=True)}


class _CpuExperts(Experts):
    """Dispatch and activation shared by the CPU classes; subclasses compute one expert's GEMMs."""

    backend = "cpu"

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
              ) -> torch.Tensor:
        views = _experts_of(self._packed())
        check_routed_inputs(hidden_states, topk_weights, topk_ids, self.config)
        return run_experts(hidden_states, topk_weights, topk_ids, self.config.num_local_experts,
                           self.expert_map, self.config.routing.weight_on_input,
                           lambda name, expert, x: self._gemm(views, name, expert, x), self._activate)

    @abstractmethod
    def _gemm(self, views: _ExpertViews, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
        """x [m, in] @ weight `name` ("w13" or "w2") of one local expert, plus its bias: [m, out].
        views: the packed weights per expert (`_experts_of`, looked up once per call)."""

    def _activate(self, h: torch.Tensor) -> torch.Tensor:
        # fp32 for the nonlinearity: the GEMM output is small next to the weights, the accuracy is not
        return apply_activation(h.float(), self.config.activation).to(h.dtype)


def _groups_divide(config: MoEConfig, quant: MoEQuantConfig) -> Support:
    """GROUP weight scales must tile both GEMMs' input dimensions exactly."""
    g = quant.weight.group_size
    if g is None:
        return Support.yes()
    for what, size in (("hidden size", config.hidden_size),
                       ("intermediate size", config.intermediate_size_per_partition)):
        if size % g:
            return Support.no(f"group size {g} does not divide the {what} {size}")
    return Support.yes()


# Each loaded PackedWeights' tensors per expert, made on first use: a view or key made per GEMM on
# every call (`t[expert]`, oneDNN's "w13.<expert>"; 32 GEMMs at one token for qwen3-30b-a3b) is a
# visible share of a one-token call's host time.
_ExpertViews = dict[str, tuple[torch.Tensor, ...]]
_EXPERT_VIEWS: weakref.WeakKeyDictionary[PackedWeights, _ExpertViews] = weakref.WeakKeyDictionary()


def _experts_of(packed: PackedWeights) -> _ExpertViews:
    """packed's tensors per expert: each dense [E, ...] tensor split into its experts' views, and
    oneDNN's opaque weights (stored one per expert as "<name>.<expert>") gathered under their name."""
    views = _EXPERT_VIEWS.get(packed)
    if views is None:
        views, opaque = {}, {}
        for key, t in packed.tensors.items():
            if t.is_mkldnn:
                name, _, expert = key.rpartition(".")
                opaque.setdefault(name, {})[int(expert)] = t
            else:
                views[key] = t.unbind(0)
        views.update({name: tuple(per[e] for e in range(len(per))) for name, per in opaque.items()})
        _EXPERT_VIEWS[packed] = views
    return views


def _expert_bias(views: _ExpertViews, name: str, expert: int) -> torch.Tensor | None:
    bias = views.get(f"{name}_bias")
    return None if bias is None else bias[expert]


# ---- unquantized ------------------------------------------------------------------------------


def _check_layer_dtype(weights: ExpertWeights, config: MoEConfig) -> None:
    for name in ("w13", "w2"):
        t = getattr(weights, name)
        if t.dtype != config.dtype:
            raise ValueError(f"{name} is {t.dtype} but the layer dtype is {config.dtype}; unquantized "
                             "weights must be in the layer dtype (cast them, or build the layer with theirs)")


@dataclass(frozen=True)
class UnquantizedProcessor:
    layout: str = "cpu.dense"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        _check_layer_dtype(weights, config)
        # Copies, not views of the caller's tensors (see _biases).
        return PackedWeights(self.layout, {"w13": weights.w13.clone(memory_format=torch.contiguous_format),
                                           "w2": weights.w2.clone(memory_format=torch.contiguous_format),
                                           **_biases(weights, config.dtype)})


# Rows per call that oneDNN blocks the prepacked weights for: a few rows per expert, as at decode
# and small batches (8 was fastest from 8 to 128 tokens and level with F.linear at one).
ONEDNN_ROWS_HINT = 8


@functools.cache
def _onednn_usable(dtype: torch.dtype) -> Support:
    """Whether this torch build and CPU can prepack and run `dtype` linears (a tiny trial, once)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return Support.no(f"torch {torch.__version__} was built without oneDNN (mkldnn) linear prepacking")
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(16, 16, dtype=dtype), ONEDNN_ROWS_HINT)
        torch.ops.mkldnn._linear_pointwise(torch.ones(2, 16, dtype=dtype), w, None, "none", [], "")
    except RuntimeError as exc:
        return Support.no(f"oneDNN cannot prepack {dtype} weights on this CPU: {str(exc).splitlines()[0]}")
    return Support.yes()


@dataclass(frozen=True)
class OneDnnPrepackProcessor:
    layout: str = "cpu.onednn_prepacked"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        _check_layer_dtype(weights, config)
        tensors = _biases(weights, config.dtype)
        for name in ("w13", "w2"):
            w = getattr(weights, name)
            for expert in range(w.shape[0]):
                # opaque oneDNN tensors: one per expert, they cannot be stacked
                tensors[f"{name}.{expert}"] = torch.ops.mkldnn._reorder_linear_weight(
                    w[expert].contiguous(), ONEDNN_ROWS_HINT)
        return PackedWeights(self.layout, tensors)


class CpuOneDnnExperts(_CpuExperts):
    """bf16/fp32 weights prepacked once into oneDNN's blocked layout; one oneDNN linear pair per
    expert that received tokens.

    Why: with a few rows per expert (128 tokens x top-8 over 128 experts is 8), plain `F.linear`
    re-blocks the weight on every call; prepacked once, that cost leaves the call.
    """

    weight_processor = OneDnnPrepackProcessor()
    capability = Capability(
        platforms=frozenset({Platform.CPU}),
        schemes=(UNQUANTIZED,),
        activations=_ALL_ACTIVATIONS,
        features=_ALL_FEATURES,
        dtypes=frozenset({torch.bfloat16, torch.float32}),
        validated_on=_VALIDATED,
        limitations=("bf16 and fp32 only (oneDNN prepacks fp16 only on CPUs with avx512_fp16 or avx_ne_convert; "
                     "CpuUnquantizedExperts serves fp16)",
                     "needs a torch build with oneDNN; the packed weights are opaque oneDNN tensors, one per expert"),
    )

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device) -> Support:
        return _onednn_usable(config.dtype)

    # Opaque oneDNN tensors have no storage to pickle, deep-copy or put in a state dict (torch.save and
    # copy.deepcopy raised NotImplementedError): saved as plain tensors, prepacked again when restored,
    # so a saved layer also loads on a CPU whose oneDNN blocks weights differently.
    def packed_state(self) -> PackedWeights | None:
        if self.weights is None:
            return None
        return PackedWeights(self.weights.layout, {name: t.to_dense() if t.is_mkldnn else t
                                                   for name, t in self.weights.tensors.items()})

    def restore_packed(self, packed: PackedWeights) -> None:
        super().restore_packed(PackedWeights(packed.layout, {
            name: t if name.endswith("_bias") or t.is_mkldnn else
            torch.ops.mkldnn._reorder_linear_weight(t, ONEDNN_ROWS_HINT) for name, t in packed.tensors.items()}))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "weights": self.packed_state()}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.weights is not None:
            self.restore_packed(self.weights)

    def _gemm(self, views: _ExpertViews, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), views[name][expert],
                                                  _expert_bias(views, name, expert), "none", [], "")


class CpuUnquantizedExperts(_CpuExperts):
    """bf16/fp16/fp32 weights: one `F.linear` pair per expert that received tokens.

    The fallback where `CpuOneDnnExperts` cannot run (fp16 on CPUs without avx512_fp16, builds
    without oneDNN); the base of the classes that dequantize at load.
    """

    weight_processor = UnquantizedProcessor()
    capability = Capability(
        platforms=frozenset({Platform.CPU}),
        schemes=(UNQUANTIZED,),
        activations=_ALL_ACTIVATIONS,
        features=_ALL_FEATURES,
        validated_on=_VALIDATED,
        limitations=("no quantized weights (see the other CPU classes)",
                     "one GEMM pair per active expert: tokens per expert are not padded or batched across experts"),
    )

    def _gemm(self, views: _ExpertViews, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, views[name][expert], _expert_bias(views, name, expert))


# ---- dequantized at load: fp8, mxfp4, and int4/int8 forms the packed kernels refuse -------------


@dataclass(frozen=True)
class DequantizingProcessor:
    layout: str = "cpu.dequantized"
    dtype: torch.dtype | None = None  # None: the layer dtype

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        dtype = self.dtype or config.dtype
        w13, w2 = dequantized(weights, dtype)
        return PackedWeights(self.layout, {"w13": w13, "w2": w2, **_biases(weights, dtype)})


_ALL_WEIGHT_GRANULARITIES = frozenset({Granularity.TENSOR, Granularity.CHANNEL, Granularity.GROUP,
                                       Granularity.BLOCK})
_FP8_WEIGHT_GRANULARITIES = frozenset({Granularity.TENSOR, Granularity.CHANNEL, Granularity.BLOCK})


class CpuDequantizedExperts(CpuUnquantizedExperts):
    """Quantized weights dequantized once at load to the layer dtype, then the unquantized path."""

    weight_processor = DequantizingProcessor()
    capability = Capability(
        platforms=frozenset({Platform.CPU}),
        schemes=(
            SchemeSupport(QuantDType.FP8_E4M3, _FP8_WEIGHT_GRANULARITIES),
            SchemeSupport(QuantDType.FP4_E2M1, frozenset({Granularity.GROUP}), group_sizes=frozenset({32})),
            SchemeSupport(QuantDType.INT4, _ALL_WEIGHT_GRANULARITIES, zero_points=frozenset(ZeroPoint),
                          act_order=True),
            SchemeSupport(QuantDType.INT8, _ALL_WEIGHT_GRANULARITIES, zero_points=frozenset(ZeroPoint),
                          act_order=True),
        ),
        activations=_ALL_ACTIVATIONS,
        features=_ALL_FEATURES,
        validated_on=_VALIDATED,
        limitations=("weights are held dequantized in the layer dtype: no memory saving and the speed of "
                     "the unquantized path (int4/int8 reach it only when the packed int4/int8 classes refuse)",
                     "no quantized activations (fp8 W8A8 goes to CpuFp8EmulatedExperts)"),
    )

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device) -> Support:
        return _groups_divide(config, quant)


class CpuFp8EmulatedExperts(_CpuExperts):
    """fp8 W8A8 emulated: fp32 weights and GEMMs, each expert's GEMM inputs quantize-dequantized to
    fp8 as the activation key says (per tensor, per token or per group, over that expert's rows).

    fp32, not the layer dtype: a GEMM output rounded to 16 bits moves values across fp8 rounding
    boundaries in the next quantization, an error of a whole fp8 step on those elements.
    """

    weight_processor = DequantizingProcessor("cpu.dequantized_fp32", torch.float32)
    capability = Capability(
        platforms=frozenset({Platform.CPU}),
        schemes=(SchemeSupport(QuantDType.FP8_E4M3, _FP8_WEIGHT_GRANULARITIES, activation=QuantDType.FP8_E4M3),),
        activations=_ALL_ACTIVATIONS,
        features=_ALL_FEATURES,
        validated_on=_VALIDATED,
        limitations=("an emulation for correctness: weights held in fp32 (4 bytes per parameter) and fp32 "
                     "GEMMs; no fp8 arithmetic and no speed benefit",),
    )

    def _gemm(self, views: _ExpertViews, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
        # the key's activation quantization applies to each expert's own rows, as in the reference
        xq = fake_quantize_activation(x.float(), self.quant.activation)
        return F.linear(xq, views[name][expert], _expert_bias(views, name, expert))


# ---- int4 weight-only: ATen tinygemm -----------------------------------------------------------


@dataclass(frozen=True)
class Int4TinygemmProcessor:
    layout: str = "cpu.int4pack"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        key = weights.key
        g = key.group_size
        tensors = _biases(weights, config.dtype)
        for name in ("w13", "w2"):
            g_idx = getattr(weights, f"{name}_g_idx") if key.act_order else None
            if g_idx is not None and g_idx.dim() == 3 and torch.equal(g_idx[:, 0], g_idx[:, 1]):
                g_idx = g_idx[:, 0]  # the halves agree: one permutation serves all rows
            if g_idx is not None and g_idx.dim() == 3:
                # Gate and up grouped apart: each half packed under its own input permutation,
                # stacked on dim 1 (w13 [E, 2, ...], w13_perm [E, 2, K]); _gemm runs them apart.
                halves = [(half, act_order_permutation(half.w13_g_idx, g, name)) for half in w13_halves(weights)]
                packed = [int4_tinygemm(half, name, config.dtype, perm) for half, perm in halves]
                tensors[f"{name}_perm"] = torch.stack([perm for _, perm in halves], 1)
                tensors[name], tensors[f"{name}_scale_and_zeros"] = (torch.stack(parts, 1) for parts in zip(*packed))
                continue
            perm = None
            if g_idx is not None:
                perm = act_order_permutation(g_idx, g, name)
                tensors[f"{name}_perm"] = perm
            tensors[name], tensors[f"{name}_scale_and_zeros"] = int4_tinygemm(weights, name, config.dtype, perm)
        return PackedWeights(self.layout, tensors)


class CpuInt4Experts(_CpuExperts):
    """int4 weight-only (GPTQ/AWQ/compressed-tensors): `aten._weight_int4pack_mm_for_cpu` per expert.

    Act-order weights are served by permuting each expert's input channels once at load and its
    input rows per call, which makes every scale group contiguous. Where gate and up rows have
    different groupings, each half has its own permutation and GEMM1 runs as two GEMMs.
    """

    weight_processor = Int4TinygemmProcessor()
    capability = Capability(
        platforms=frozenset({Platform.CPU}),
        schemes=(SchemeSupport(QuantDType.INT4, frozenset({Granularity.GROUP}), group_sizes=TINYGEMM_GROUP_SIZES,
                               zero_points=frozenset(ZeroPoint), act_order=True),),
        activations=_ALL_ACTIVATIONS,
        features=_ALL_FEATURES,
        validated_on=_VALIDATED,
        limitations=("group sizes 32, 64, 128 and 256 only; no per-channel scales (the ATen kernel's limits)",
                     "act-order only where every group holds exactly group_size channels (checked at load)",
                     "faster than bf16 at few tokens per expert; slower than bf16 GEMMs past ~16 rows per expert"),
    )

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device) -> Support:
        if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
            return Support.no(f"torch {torch.__version__} lacks aten._weight_int4pack_mm_for_cpu")
        return _groups_divide(config, quant)

    def _gemm(self, views: _ExpertViews, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
        codes, scale_and_zeros = views[name][expert], views[f"{name}_scale_and_zeros"][expert]
        perms = views.get(f"{name}_perm")
        perm = None if perms is None else perms[expert]
        if perm is not None and perm.dim() == 2:  # gate and up halves, each under its own permutation
            y = torch.cat([self._int4_mm(x.index_select(1, perm[h]), codes[h], scale_and_zeros[h])
                           for h in range(2)], dim=1)
        else:
            y = self._int4_mm(x if perm is None else x.index_select(1, perm), codes, scale_and_zeros)
        bias = _expert_bias(views, name, expert)
        return y if bias is None else y + bias

    def _int4_mm(self, x: torch.Tensor, codes: torch.Tensor, scale_and_zeros: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), codes, self.quant.weight.group_size,
                                                          scale_and_zeros)


# ---- int8 weight-only: ATen per-channel int8 GEMM ----------------------------------------------


@dataclass(frozen=True)
class Int8PerChannelProcessor:
    layout: str = "cpu.int8pack"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        tensors = _biases(weights, config.dtype)
        for name in ("w13", "w2"):
            codes, scale, correction = int8_per_channel(weights, name, config.dtype)
            tensors[name], tensors[f"{name}_scale"] = codes, scale
            if correction is not None:
                tensors[f"{name}_zero_correction"] = correction
        return PackedWeights(self.layout, tensors)


class CpuInt8Experts(_CpuExperts):
    """int8 weight-only with per-channel scales: `aten._weight_int8pack_mm` per expert.

    Zero points (integer or float) become a per-row correction times the input's row sum.
    """

    weight_processor = Int8PerChannelProcessor()
    capability = Capability(
        platforms=frozenset({Platform.CPU}),
        schemes=(SchemeSupport(QuantDType.INT8, frozenset({Granularity.CHANNEL}), zero_points=frozenset(ZeroPoint)),),
        activations=_ALL_ACTIVATIONS,
        features=_ALL_FEATURES,
        validated_on=_VALIDATED,
        limitations=("per-channel scales only: grouped int8 scales are refused here (the dequantizing class "
                     "serves them)",),
    )

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device) -> Support:
        if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
            return Support.no(f"torch {torch.__version__} lacks aten._weight_int8pack_mm")
        return Support.yes()

    def _gemm(self, views: _ExpertViews, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.ops.aten._weight_int8pack_mm(x, views[name][expert], views[f"{name}_scale"][expert])
        correction = views.get(f"{name}_zero_correction")
        if correction is not None:
            y = (y.float() + x.float().sum(-1, keepdim=True) * correction[expert].float()).to(x.dtype)
        bias = _expert_bias(views, name, expert)
        return y if bias is None else y + bias
