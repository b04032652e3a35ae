"""Experts classes over vllm-xpu-kernels' `XpuFusedMoe` (Intel GPUs, Xe2 grouped GEMM).

One class per weight family, each with its own layout (`moe_xpu.layouts`); they share the call:
XpuFusedMoe is built once per `load_weights` from the processed tensors, after checking that the
recipe it will infer from their dtypes is the scheme the oracle chose, and `apply` hands it the
routed ids and fp32 weights with this layer's `expert_map`.

What the kernel accepts was read from vllm-xpu-kernels 0.1.16.2; none of it has run on Intel
hardware here (`validated_on` is empty).
"""

from __future__ import annotations

from typing import Any

import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import ActivationKind, MoEConfig
from moe_core.experts import UNQUANTIZED, Capability, Experts, SchemeSupport, Support
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType
from moe_core.weights import ExpertWeights
from moe_xpu.inputs import quantize_fp8_groups, routed_inputs
from moe_xpu.layouts import (
    FP8_BLOCK,
    GEMM_N_MULTIPLE,
    INT4_GROUP_SIZES,
    KERNEL_TOP_K,
    SWIGLU_OAI_ALPHA,
    SWIGLU_OAI_LIMIT,
    XpuDenseProcessor,
    XpuFp8Processor,
    XpuInt4Processor,
    XpuMxfp4Processor,
    env_override_reason,
    expected_recipe,
    kernel_activation,
    kernel_recipe,
)

__all__ = ["XpuExperts", "XpuFp8Experts", "XpuInt4Experts", "XpuMxfp4Experts"]

_VENDOR = "vllm_xpu_kernels"
_ALL_ACTIVATIONS = frozenset(ActivationKind)
_KERNEL_DTYPES = frozenset({torch.bfloat16, torch.float16})
_COMMON_LIMITATIONS = (
    "NOT validated on real hardware: written from vllm-xpu-kernels 0.1.16.2's sources; its layouts are "
    "checked on CPU by a torch twin only",
    "needs an Xe2/Xe3 GPU (Battlemage, Lunar Lake, Ponte Vecchio, Panther Lake): elsewhere the interface falls "
    "back to a grouped GEMM that reads no weight scales; the architecture is not checked here",
    "bf16/fp16 activations only: the Xe2 grouped GEMM has no fp32 path",
    f"top_k in {sorted(KERNEL_TOP_K)} (the kernel's moe_gather)",
    f"swiglu_oai only with alpha {SWIGLU_OAI_ALPHA} and limit {SWIGLU_OAI_LIMIT} (fixed in the interface)",
    f"every GEMM's output width (w13 rows, hidden size) a multiple of {GEMM_N_MULTIPLE}",
)


def _kernel_module() -> Any:
    """The vendor interface, imported on first use; a clear error where it cannot load."""
    try:
        from vllm_xpu_kernels import fused_moe_interface
    except ImportError as exc:
        raise RuntimeError(f"vllm-xpu-kernels cannot be imported ({exc}); install moe-xpu[kernels] with torch's XPU "
                           "build and oneAPI (libsycl, Level Zero)") from exc
    if not fused_moe_interface.FUSEDMOE_AVAILABLE:
        raise RuntimeError("vllm-xpu-kernels is installed but its native MoE libraries did not load: "
                           f"{fused_moe_interface.FUSEDMOE_UNAVAILABLE_REASON}")
    return fused_moe_interface


class _XpuFusedMoeExperts(Experts):
    """The XpuFusedMoe call shared by every weight family."""

    backend = "xpu"

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> None:
        super().__init__(config, quant, device)
        self._kernel: Any = None  # XpuFusedMoe over self.weights; rebuilt by every load_weights

    # ---- capability -----------------------------------------------------------------------

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> Support:
        if config.top_k not in KERNEL_TOP_K:
            return Support.no(f"top_k {config.top_k} (the kernel's moe_gather takes {sorted(KERNEL_TOP_K)})")
        act = config.activation
        if act.kind is ActivationKind.SWIGLU_OAI and (act.alpha, act.limit) != (SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT):
            return Support.no(f"{act} (the interface fixes alpha={SWIGLU_OAI_ALPHA}, limit={SWIGLU_OAI_LIMIT})")
        for what, width in (("w13 rows", config.w13_rows), ("hidden size", config.hidden_size)):
            if width % GEMM_N_MULTIPLE:
                return Support.no(f"{what} {width} (each GEMM's output width must be a multiple of {GEMM_N_MULTIPLE})")
        reason = env_override_reason(expected_recipe(quant))
        if reason is not None:
            return Support.no(reason)
        return cls._supports_scheme(config, quant)

    @classmethod
    def _supports_scheme(cls, config: MoEConfig, quant: MoEQuantConfig) -> Support:
        """What the family's record cannot state. Default: nothing."""
        return Support.yes()

    # ---- weights --------------------------------------------------------------------------

    def load_weights(self, weights: ExpertWeights) -> None:
        self._kernel = None  # a failed load must not leave the previous weights' kernel callable
        super().load_weights(weights)
        packed = self._packed()
        want = expected_recipe(self.quant)
        got = kernel_recipe(packed["w13"], packed.get("w13_scale"))
        if got is not want:
            raise RuntimeError(f"{self.name()}: XpuFusedMoe would infer recipe {got.value!r} from the processed "
                               f"weights but {self.quant.name} needs {want.value!r}")
        reason = env_override_reason(want)
        if reason is not None:
            raise RuntimeError(f"{self.name()}: {reason}; unset it to run the kernel as selected")
        self._kernel = _kernel_module().XpuFusedMoe(
            w13=packed["w13"], w13_scales=packed.get("w13_scale"), w13_bias=packed.get("w13_bias"),
            w2=packed["w2"], w2_scales=packed.get("w2_scale"), w2_bias=packed.get("w2_bias"),
            n_experts_per_token=self.config.top_k, activation=kernel_activation(self.config.activation),
            num_experts=self.config.num_local_experts, expert_map=self.expert_map)

    # ---- compute --------------------------------------------------------------------------

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
              ) -> torch.Tensor:
        if self._kernel is None:
            raise RuntimeError(f"{self.name()}: no weights loaded; call FusedMoE.load_weights first")
        self._check_inputs(hidden_states, topk_weights, topk_ids)
        x, weights = routed_inputs(hidden_states.contiguous(), topk_weights, self.config)
        weights, topk_ids = weights.contiguous(), topk_ids.contiguous()  # the native kernels index them flat
        output = torch.empty_like(hidden_states)
        if self.quant.activation is None:
            self._kernel.apply(output, x, weights, topk_ids, expert_map=self.expert_map)
        else:
            xq, x_scale = quantize_fp8_groups(x, FP8_BLOCK)
            self._kernel.apply(output, xq, weights, topk_ids, expert_map=self.expert_map, a1q_scale=x_scale)
        return output

    def _check_inputs(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> None:
        cfg, device = self.config, self.device.torch_device
        if hidden_states.ndim != 2 or hidden_states.shape[1] != cfg.hidden_size:
            raise ValueError(f"hidden_states has shape {list(hidden_states.shape)}, expected [M, {cfg.hidden_size}]")
        if hidden_states.dtype != cfg.dtype:
            raise ValueError(f"hidden_states is {hidden_states.dtype}, expected the layer dtype {cfg.dtype}")
        want = [hidden_states.shape[0], cfg.top_k]
        for name, t in (("topk_weights", topk_weights), ("topk_ids", topk_ids)):
            if list(t.shape) != want:
                raise ValueError(f"{name} has shape {list(t.shape)}, expected {want} (tokens x top_k)")
        if topk_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"topk_ids is {topk_ids.dtype}, expected int32 or int64")
        for name, t in (("hidden_states", hidden_states), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
            if t.device.type != device.type:
                raise ValueError(f"{name} is on {t.device}, expected the layer's device {device}")


def _capability(schemes: tuple[SchemeSupport, ...], *limitations: str) -> Capability:
    return Capability(
        platforms=frozenset({Platform.XPU}),
        schemes=schemes,
        activations=_ALL_ACTIVATIONS,
        dtypes=_KERNEL_DTYPES,
        requires=(_VENDOR,),
        validated_on=(),
        limitations=(*_COMMON_LIMITATIONS, *limitations),
    )


def _groups_divide(config: MoEConfig, group: int) -> Support:
    for what, size in (("hidden size", config.hidden_size),
                       ("intermediate size", config.intermediate_size_per_partition)):
        if size % group:
            return Support.no(f"group size {group} does not divide the {what} {size}")
    return Support.yes()


class XpuExperts(_XpuFusedMoeExperts):
    """bf16/fp16 weights: XpuFusedMoe's 16-bit recipe."""

    weight_processor = XpuDenseProcessor()
    capability = _capability((UNQUANTIZED,))


class XpuInt4Experts(_XpuFusedMoeExperts):
    """Symmetric int4 weight-only (GPTQ sym, compressed-tensors symmetric): XpuFusedMoe's int4 recipe."""

    weight_processor = XpuInt4Processor()
    capability = _capability(
        (SchemeSupport(QuantDType.INT4, frozenset({Granularity.GROUP}), group_sizes=INT4_GROUP_SIZES),),
        "symmetric only: the interface re-encodes codes around the fixed zero 8 and the GEMM takes no zero "
        "points, so AWQ and other asymmetric checkpoints are refused",
        "no act-order (g_idx): the GEMM reads a row's scale by k // group",
        "group sizes 32, 64, 128, 256 only (no per-channel scales)",
        "scales are cast to the layer dtype, which the GEMM reads them as",
    )

    @classmethod
    def _supports_scheme(cls, config: MoEConfig, quant: MoEQuantConfig) -> Support:
        return _groups_divide(config, quant.weight.group_size)


class XpuFp8Experts(_XpuFusedMoeExperts):
    """fp8 e4m3 weights: per tensor (W8A16) or 128x128 blocks (W8A16, or W8A8 with dynamic 1x128
    activation groups): XpuFusedMoe's fp8 and fp8block recipes."""

    weight_processor = XpuFp8Processor()
    capability = _capability(
        (
            SchemeSupport(QuantDType.FP8_E4M3, frozenset({Granularity.TENSOR})),
            SchemeSupport(QuantDType.FP8_E4M3, frozenset({Granularity.BLOCK}), block_shapes=frozenset({(128, 128)})),
            SchemeSupport(QuantDType.FP8_E4M3, frozenset({Granularity.BLOCK}), block_shapes=frozenset({(128, 128)}),
                          activation=QuantDType.FP8_E4M3),
        ),
        "per-tensor fp8 with 16-bit activations only: the Xe2 GEMM reads 16-bit activations and the interface "
        "quantizes GEMM2's input only for block fp8, so per-tensor W8A8 is refused",
        "block W8A8: activations are quantized to fp8 per 1x128 group and dequantized back to 16 bits before "
        "each GEMM (W8A8's numerics, not its speed)",
        "no per-channel fp8 scales; block fp8 needs hidden and intermediate sizes that are multiples of 128 and "
        "no swiglu_oai (its interleaved rows would split scale blocks)",
    )

    @classmethod
    def _supports_scheme(cls, config: MoEConfig, quant: MoEQuantConfig) -> Support:
        if quant.weight.scale.granularity is not Granularity.BLOCK:
            return Support.yes()
        act = quant.activation
        if act is not None and (act.scale.granularity is not Granularity.GROUP or act.group_size != FP8_BLOCK):
            return Support.no(f"fp8 activations {act} with block weights (the kernel quantizes them per 1x128 group)")
        if config.activation.kind is ActivationKind.SWIGLU_OAI:
            return Support.no("swiglu_oai with block fp8 (interleaved gate/up rows would split 128-row scale blocks)")
        for what, size in (("hidden size", config.hidden_size),
                           ("intermediate size", config.intermediate_size_per_partition)):
            if size % FP8_BLOCK:
                return Support.no(f"block fp8 with {what} {size} (must be a multiple of {FP8_BLOCK})")
        return Support.yes()


class XpuMxfp4Experts(_XpuFusedMoeExperts):
    """OCP MXFP4 weights with 16-bit activations (gpt-oss): XpuFusedMoe's mxfp4 recipe."""

    weight_processor = XpuMxfp4Processor()
    capability = _capability(
        (SchemeSupport(QuantDType.FP4_E2M1, frozenset({Granularity.GROUP}), group_sizes=frozenset({32})),),
        "16-bit activations only (the interface's switch to fp8 activations, VLLM_XPU_FUSED_MOE_USE_MXFP4_FP8, "
        "is refused)",
        "the GEMM decodes an e8m0 scale byte of 0 as 0, not 2**-127",
    )

    @classmethod
    def _supports_scheme(cls, config: MoEConfig, quant: MoEQuantConfig) -> Support:
        return _groups_divide(config, 32)
