"""`AiterExperts`: moe-core's modular experts over AMD AITER's `aiter.fused_moe.fused_moe`.

One call runs AITER's whole layer: token sorting (`moe_sorting`), GEMM1 with the gated activation,
the dynamic fp8 quantization of both GEMMs' inputs where the weights are fp8, GEMM2 and the top-k
sum. The weights are converted once at load (`moe_rocm.layouts.AiterProcessor`); `fused_moe_arguments`
states the whole call, so the kernel and its CPU twin (`moe_rocm.twin.fused_moe_twin`) read the
same arguments.

What it serves, per architecture (torch reports gfx942 as capability (9, 4), gfx950 as (9, 5)):

| | gfx942 (MI300X/MI325X) | gfx950 (MI350X/MI355X) |
|---|---|---|
| bf16 / fp16 weights | yes | yes |
| fp8 per-channel weights x per-token activations | refused (see below) | yes (e4m3fn) |
| fp8 128x128 blocks x 1x128 activation groups | refused (see below) | yes (e4m3fn) |

AITER's fp8 on gfx942 is e4m3fnuz and it quantizes activations to amax / 240 there; moe-core's
reference (and so the conformance suite) quantizes them to e4m3fn at amax / 448. Both are equally
accurate, but they round differently: about 6% relative L2 apart on random layers (both GEMMs'
inputs are quantized), above the 2e-2 conformance tolerance. The gfx942 conversion
(`layouts.to_aiter_fp8`) is built and tested on the CPU; the claim waits for a reference that
quantizes activations the way the kernel does.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import ActivationKind, MoEConfig
from moe_core.experts import UNQUANTIZED, Capability, Experts, SchemeSupport, Support
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType
from moe_core.weights import PackedWeights
from moe_rocm.aiter_api import GFX942, GFX950, INSTALL, ActivationType, QuantType, aiter_installation, arch_of
from moe_rocm.layouts import AiterProcessor

__all__ = ["AiterExperts", "fused_moe_arguments"]

_ACTIVATIONS = {ActivationKind.SILU: ActivationType.Silu, ActivationKind.GELU: ActivationType.Gelu}
_FP8 = QuantDType.FP8_E4M3
# fp8 weight scales and the activation scales AITER pairs with them.
_ACTIVATION_GRANULARITY = {Granularity.CHANNEL: Granularity.TOKEN, Granularity.BLOCK: Granularity.GROUP}
_BLOCK = 128


def _quant_type(quant: MoEQuantConfig) -> QuantType:
    if not quant.weight.quantized:
        return QuantType.No
    return QuantType.per_Token if quant.weight.scale.granularity is Granularity.CHANNEL else QuantType.per_128x128


def fused_moe_arguments(packed: PackedWeights, config: MoEConfig, quant: MoEQuantConfig,
                        expert_mask: torch.Tensor | None) -> dict[str, Any]:
    """Everything `fused_moe` takes besides the tokens and their routing, by AITER's parameter names
    (enums as moe-rocm's mirrors; `AiterExperts.apply` maps them to AITER's)."""
    if packed.layout != AiterProcessor.layout:
        raise ValueError(f"expected weights in layout {AiterProcessor.layout!r}, got {packed.layout!r}")
    return dict(w1=packed["w13"], w2=packed["w2"], expert_mask=expert_mask,
                activation=_ACTIVATIONS[config.activation.kind], quant_type=_quant_type(quant),
                doweight_stage1=config.routing.weight_on_input,
                w1_scale=packed.get("w13_scale"), w2_scale=packed.get("w2_scale"), a1_scale=None, a2_scale=None)


class AiterExperts(Experts):
    """AITER's fused MoE (CK / assembly kernels) on AMD Instinct gfx942 and gfx950."""

    backend = "aiter"
    weight_processor = AiterProcessor()
    capability = Capability(
        platforms=frozenset({Platform.ROCM}),
        schemes=(
            UNQUANTIZED,
            # TENSOR is listed so that supports_extra can say why per-tensor fp8 is refused.
            SchemeSupport(_FP8, frozenset({Granularity.TENSOR, Granularity.CHANNEL, Granularity.BLOCK}),
                          block_shapes=frozenset({(_BLOCK, _BLOCK)}), activation=_FP8),
        ),
        activations=frozenset(_ACTIVATIONS),
        dtypes=frozenset({torch.bfloat16, torch.float16}),
        min_capability=GFX942.capability,
        max_capability=GFX950.capability,
        bias=False,
        # The weight shuffle's tiles: 16 rows by 32 columns of w13 [E, 2N, K] and w2 [E, K, N].
        hidden_multiple=32,
        intermediate_multiple=32,
        requires=("aiter",),
        validated_on=(),
        limitations=(
            "NOT validated on real hardware: written from AITER's source (fused_moe, shuffle_weight, its fp8 "
            "dtypes) and tested on the CPU through a torch twin of the kernel reading the converted weights",
            f"needs {INSTALL}",
            f"{GFX942.name} ({GFX942.products}) and {GFX950.name} ({GFX950.products}) only; bf16/fp16 layers; "
            "SiLU and GELU (erf) gated activations",
            f"fp8 W8A8 on {GFX950.name} only (per-channel weights with per-token activations, 128x128 blocks with "
            f"1x128 activation groups): on {GFX942.name} AITER's fp8 is e4m3fnuz and its activation rounding "
            "differs from moe-core's e4m3fn reference by about 6% relative L2 on random layers",
            "refused: per-tensor fp8 (AITER's dynamic activation scale spans the whole batch, moe-core's per-tensor "
            "key one expert's rows), fp8 with the router weight on the input, int4/int8 (AITER's fused_moe has "
            "int4 only as W4A8 with fp8 activations, which moe-core cannot express, and as a gfx950 group-32 "
            "W4A16 path on its main branch since 2026-05, in no release), mxfp4, biases, gelu_tanh, swiglu_oai "
            "and relu2",
            "AITER's kernels may need more than the shuffle's multiples (K and N of 32) on some shapes: unverified",
        ),
    )

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> None:
        super().__init__(config, quant, device)
        # AITER takes expert parallelism as a 0/1 int32 mask over the global experts.
        self.expert_mask = None if self.expert_map is None else (self.expert_map >= 0).to(torch.int32)

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> Support:
        if device.capability is None:
            return Support.no(f"the ROCm device's architecture is unknown (AITER's fused MoE serves {GFX942.name} "
                              f"and {GFX950.name})")
        installed = aiter_installation()
        if not installed:
            return installed
        if not _mask_expresses_placement(config):
            return Support.no("an expert placement whose local experts are not in increasing global order "
                              "(AITER's 0/1 expert_mask numbers a rank's experts in global order)")
        w, a = quant.weight, quant.activation
        if w.dtype is not _FP8:
            return Support.yes()
        arch = arch_of(device.capability)
        if arch is not GFX950:
            return Support.no(f"fp8 on {arch.name}: AITER quantizes activations to {arch.fp8_dtype} (max "
                              f"{arch.fp8_max:g}), which rounds differently from moe-core's e4m3fn reference "
                              f"(about 6% relative L2); fp8 is served on {GFX950.name}")
        g = w.scale.granularity
        if g is Granularity.TENSOR:
            return Support.no("per-tensor fp8: AITER's dynamic activation scale is one amax over the whole batch, "
                              "moe-core's per-tensor activation key one per expert's rows")
        if a.scale.granularity is not _ACTIVATION_GRANULARITY[g]:
            return Support.no(f"{g.value} fp8 weights with {a.scale.granularity.value} activation scales "
                              f"(AITER pairs them with {_ACTIVATION_GRANULARITY[g].value} scales)")
        if g is Granularity.BLOCK:
            n = config.intermediate_size_per_partition
            if a.scale.group_size != _BLOCK:
                return Support.no(f"activation groups of {a.scale.group_size} (AITER's block fp8 uses {_BLOCK})")
            if config.hidden_size % _BLOCK or n % _BLOCK:
                return Support.no(f"block fp8 needs K and N multiples of {_BLOCK} (K={config.hidden_size}, N={n})")
        if config.routing.weight_on_input:
            return Support.no("fp8 with the router weight on the input (Llama4): AITER would scale GEMM1's output "
                              "after quantizing the unweighted tokens")
        return Support.yes()

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        _check_inputs(hidden_states, topk_weights, topk_ids, cfg)
        if hidden_states.shape[0] == 0:
            return hidden_states.new_empty((0, cfg.hidden_size))
        aiter = importlib.import_module("aiter")
        fused_moe = importlib.import_module("aiter.fused_moe").fused_moe
        args = fused_moe_arguments(self._packed(), cfg, self.quant, self.expert_mask)
        args["activation"] = getattr(aiter.ActivationType, args["activation"].name)
        args["quant_type"] = getattr(aiter.QuantType, args["quant_type"].name)
        # AITER's kernels take fp32 router weights and int32 expert ids.
        return fused_moe(hidden_states=hidden_states.contiguous(), topk_weight=topk_weights.float().contiguous(),
                         topk_ids=topk_ids.to(torch.int32).contiguous(), dtype=hidden_states.dtype, **args)


def _mask_expresses_placement(config: MoEConfig) -> bool:
    """Whether this rank's local experts are its global experts in increasing order, which is all that
    AITER's expert_mask can say (it gives the k-th masked-in expert local id k)."""
    expert_map = config.expert_map()
    if expert_map is None:
        return True
    local = expert_map[expert_map >= 0]
    return torch.equal(local, torch.arange(local.numel(), dtype=local.dtype))


def _check_inputs(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg: MoEConfig) -> None:
    if x.dim() != 2 or x.shape[1] != cfg.hidden_size:
        raise ValueError(f"hidden_states must be [M, {cfg.hidden_size}], got {list(x.shape)}")
    if x.dtype != cfg.dtype:
        raise ValueError(f"hidden_states dtype {x.dtype} differs from the layer dtype {cfg.dtype}")
    if not x.is_cuda:
        raise ValueError(f"hidden_states must be on the ROCm device, got {x.device}")
    M = x.shape[0]
    if tuple(topk_ids.shape) != (M, cfg.top_k) or topk_ids.dtype.is_floating_point:
        raise ValueError(f"topk_ids must be integer [{M}, {cfg.top_k}], got {topk_ids.dtype} {list(topk_ids.shape)}")
    if tuple(topk_weights.shape) != (M, cfg.top_k) or not topk_weights.dtype.is_floating_point:
        raise ValueError(f"topk_weights must be floating [{M}, {cfg.top_k}], got {topk_weights.dtype} "
                         f"{list(topk_weights.shape)}")
