"""Canonical `ExpertWeights` -> the tensors `vllm_xpu_kernels.fused_moe_interface.XpuFusedMoe` reads.

Read from vllm-xpu-kernels 0.1.16.2 (`fused_moe_interface.py` and the Xe2 grouped GEMM it calls).
The interface infers its recipe from the dtypes of w13 and its scales, so each layout below fixes
those dtypes; `kernel_recipe` states the inference and `expected_recipe` what a scheme must give.

| layout | w13 / w2 | scales |
|---|---|---|
| `xpu.dense.kn` | layer dtype, [E, K, R] / [E, N, K] (input dim first) | none |
| `xpu.fp8.kn` | float8_e4m3fn, [E, K, R] / [E, N, K] | per tensor fp32 [E]; 128x128 blocks fp32 [E, K/128, R/128] |
| `xpu.int4.nk` | uint8 u4 codes [E, R, K/2] / [E, K, N/2], even k in the low nibble, implicit zero 8 | layer dtype [E, R, K/g] |
| `xpu.mxfp4.nk` | float4_e2m1fn_x2 [E, R, K/2] / [E, K, N/2], even k in the low nibble | uint8 e8m0 [E, R, K/32] |

(R = w13 rows: 2N gated, N for relu2.) Gated w13 rows are gate-then-up like the canonical form,
except for swiglu_oai: the interface's `swigluoai_and_mul` reads gate and up interleaved (gate j at
2j, up j at 2j + 1), so w13 rows (and their scales and bias) are interleaved for it. Biases are in
the layer dtype ([E, R] and [E, K]): the GEMM reads them as its activation type.

The int4 codes are what the interface's constructor takes: it re-encodes them in place, once, to
int8 two's-complement nibbles (code - 8, same nibble positions), which the GEMM reads. Every tensor
here is a fresh copy, so that re-encoding never reaches the canonical weights.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from moe_core.config import Activation, ActivationKind, MoEConfig
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType, ZeroPoint
from moe_core.weights import ExpertWeights, PackedWeights

__all__ = [
    "FP8_BLOCK",
    "INT4_GROUP_SIZES",
    "KERNEL_TOP_K",
    "SWIGLU_OAI_ALPHA",
    "SWIGLU_OAI_LIMIT",
    "Recipe",
    "XpuDenseProcessor",
    "XpuFp8Processor",
    "XpuInt4Processor",
    "XpuMxfp4Processor",
    "env_override_reason",
    "expected_recipe",
    "gate_up_row_order",
    "kernel_activation",
    "kernel_recipe",
    ]

# Group sizes the Xe2 GEMM accepts for 4-bit weights (it derives the group from the scales' shape).
INT4_GROUP_SIZES = frozenset({32, 64, 128, 256})
# Block-FP8 scales cover 128x128 weight tiles; K and N of both GEMMs must be multiples of 128.
FP8_BLOCK = 128
# top-k values `moe_gather` is instantiated for; any other raises in the kernel.
KERNEL_TOP_K = frozenset({1, 2, 4, 6, 7, 8, 10, 16})
# The interface calls swigluoai_and_mul with these constants; other values cannot be passed.
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0
# Every GEMM's output width (R for GEMM1, K for GEMM2) must be a multiple of this.
GEMM_N_MULTIPLE = 8

_KERNEL_ACTIVATIONS = {
    ActivationKind.SILU: "silu",
    ActivationKind.GELU: "gelu",
    ActivationKind.GELU_TANH: "gelu_tanh",
    ActivationKind.SWIGLU_OAI: "swigluoai",
    ActivationKind.RELU2: "relu2_no_mul",
}

# Environment switches of the interface that change what it computes.
REF_PATH_ENV = "VLLM_XPU_FUSED_MOE_USE_REF"
NATIVE_BLOCK_FP8_ENV = "VLLM_XPU_FUSED_MOE_NATIVE_BLOCK_FP8"
MXFP4_FP8_ENV = "VLLM_XPU_FUSED_MOE_USE_MXFP4_FP8"
XE_DEFAULT_GEMM_ENV = "VLLM_XPU_FORCE_XE_DEFAULT_KERNEL"
_TRUTHY = ("1", "ON", "TRUE", "YES", "Y")
_FALSY = ("0", "OFF", "FALSE", "NO", "N")


class Recipe(enum.StrEnum):
    """The interface's names for what it computes, inferred from the weight and scale dtypes."""

    BF16 = "bf16"  # 16-bit weights, no scales
    FP8 = "fp8"  # fp8 weights, one fp32 scale per expert
    FP8_BLOCK = "fp8block"  # fp8 weights, fp32 3-D block scales
    MXFP8 = "mxfp8"  # fp8 weights, e8m0 scales
    MXFP4 = "mxfp4"
    MXFP4_FP8 = "mxfp4_fp8"  # mxfp4 with fp8 activations (an environment switch)
    INT4 = "int4"  # uint8 weights


def kernel_activation(activation: Activation) -> str:
    """The interface's activation name for `activation`."""
    return _KERNEL_ACTIVATIONS[activation.kind]


def _env_on(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "0").strip().upper() in _TRUTHY


def kernel_recipe(w13: torch.Tensor, w13_scale: torch.Tensor | None,
                  env: Mapping[str, str] = os.environ) -> Recipe:
    """The recipe XpuFusedMoe infers from w13's dtype and its scales (its `_get_weights_dtype`)."""
    fp8 = w13.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    if fp8 and w13_scale is not None and w13_scale.dtype in (torch.uint8, torch.float8_e8m0fnu):
        return Recipe.MXFP8
    if fp8 and w13_scale is not None and w13_scale.dtype == torch.float32 and w13_scale.ndim == 3:
        return Recipe.FP8_BLOCK
    if w13.dtype == torch.float4_e2m1fn_x2:
        return Recipe.MXFP4_FP8 if _env_on(env, MXFP4_FP8_ENV) else Recipe.MXFP4
    if w13.dtype == torch.uint8:
        return Recipe.INT4
    return Recipe.FP8 if fp8 else Recipe.BF16


def expected_recipe(quant: MoEQuantConfig) -> Recipe:
    """The recipe that computes `quant`'s scheme."""
    w = quant.weight
    if not w.quantized:
        return Recipe.BF16
    if w.dtype is QuantDType.FP8_E4M3:
        return Recipe.FP8_BLOCK if w.scale.granularity is Granularity.BLOCK else Recipe.FP8
    if w.dtype is QuantDType.FP4_E2M1:
        return Recipe.MXFP4
    if w.dtype is QuantDType.INT4:
        return Recipe.INT4
    raise ValueError(f"vllm-xpu-kernels has no recipe for {w} weights (it computes bf16/fp16, fp8, mxfp4, int4)")


def env_override_reason(recipe: Recipe, env: Mapping[str, str] = os.environ) -> str | None:
    """Why the interface's environment switches would make it compute another layer than `recipe`'s
    scheme, or None.

    Its Python reference path fake-quantizes activations (fp8 or mxfp4) whatever the scheme; its
    mxfp4_fp8 switch gives mxfp4 layers fp8 activations; the forced Xe default GEMM reads no weight
    scales and takes the rows per expert as offsets, unlike the interface that calls it.
    """
    if env.get(XE_DEFAULT_GEMM_ENV, "") in ("1", "true", "TRUE"):
        return (f"{XE_DEFAULT_GEMM_ENV} is set: vllm-xpu-kernels would run its Xe default grouped GEMM, which "
                "its fused MoE interface does not drive correctly")
    if _env_on(env, REF_PATH_ENV):
        return f"{REF_PATH_ENV} is set: vllm-xpu-kernels would run its Python reference, which quantizes activations"
    if recipe is Recipe.FP8_BLOCK and env.get(NATIVE_BLOCK_FP8_ENV, "1").strip().upper() in _FALSY:
        return (f"{NATIVE_BLOCK_FP8_ENV} is off: vllm-xpu-kernels would run block fp8 through its Python "
                "reference, which quantizes activations")
    if recipe is Recipe.MXFP4 and _env_on(env, MXFP4_FP8_ENV):
        return f"{MXFP4_FP8_ENV} is set: vllm-xpu-kernels would run mxfp4 layers with fp8 activations"
    return None


def gate_up_row_order(config: MoEConfig) -> torch.Tensor | None:
    """w13 row order the kernel's activation reads: None (canonical gate|up), or the interleave
    [gate 0, up 0, gate 1, up 1, ...] for swiglu_oai."""
    if config.activation.kind is not ActivationKind.SWIGLU_OAI:
        return None
    n = config.intermediate_size_per_partition
    return torch.stack((torch.arange(n), torch.arange(n) + n), dim=1).reshape(-1)


def _kernel_tensor(t: torch.Tensor, device: torch.device, rows: torch.Tensor | None = None,
                   transpose: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`t` [E, rows, cols] on `device`, rows reordered, optionally [E, cols, rows], contiguous, never
    sharing storage with `t` (the interface re-encodes int4 weights in place)."""
    out = t.to(device)
    # 1-byte dtypes as uint8: row gathers and transposing copies are not implemented for all fp8 types.
    raw = out.element_size() == 1 and out.dtype != torch.uint8
    if raw:
        out = out.view(torch.uint8)
    if rows is not None:
        out = out.index_select(1, rows.to(out.device))
    if transpose:
        out = out.transpose(1, 2)
    out = out.contiguous()
    if raw:
        out = out.view(t.dtype)
    if dtype is not None:
        out = out.to(dtype)
    if out.data_ptr() == t.data_ptr():
        out = out.clone()
    return out


def _biases(weights: ExpertWeights, config: MoEConfig, device: torch.device,
            rows: torch.Tensor | None) -> dict[str, torch.Tensor]:
    if not weights.has_bias:
        return {}
    b13 = _kernel_tensor(weights.w13_bias.unsqueeze(2), device, rows, dtype=config.dtype).squeeze(2)
    return {"w13_bias": b13, "w2_bias": weights.w2_bias.to(device=device, dtype=config.dtype, copy=True)}


def _expect_key(weights: ExpertWeights, dtype: QuantDType, layout: str) -> None:
    if weights.key.dtype is not dtype and not (dtype.is_float_unquantized and not weights.key.quantized):
        raise ValueError(f"layout {layout} takes {dtype.value} weights, got {weights.key}")


@dataclass(frozen=True)
class XpuDenseProcessor:
    """bf16/fp16 weights transposed to [E, in, out], the 16-bit GEMM's row-major B."""

    layout: str = "xpu.dense.kn"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        _expect_key(weights, QuantDType.BF16, self.layout)
        for name in ("w13", "w2"):
            t = getattr(weights, name)
            if t.dtype != config.dtype:
                raise ValueError(f"{name} is {t.dtype} but the layer dtype is {config.dtype}; unquantized weights "
                                 "must be in the layer dtype (bf16 or fp16 for this kernel)")
        rows = gate_up_row_order(config)
        return PackedWeights(self.layout, {
            "w13": _kernel_tensor(weights.w13, device, rows, transpose=True),
            "w2": _kernel_tensor(weights.w2, device, transpose=True),
            **_biases(weights, config, device, rows),
        })


@dataclass(frozen=True)
class XpuFp8Processor:
    """fp8 e4m3 weights transposed to [E, in, out]; per-tensor scales fp32 [E], block scales fp32
    [E, in/128, out/128] (the canonical [E, out/128, in/128] transposed)."""

    layout: str = "xpu.fp8.kn"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        _expect_key(weights, QuantDType.FP8_E4M3, self.layout)
        granularity = weights.key.scale.granularity
        if granularity not in (Granularity.TENSOR, Granularity.BLOCK):
            raise ValueError(f"layout {self.layout} takes per-tensor or 128x128 block fp8 scales, got {weights.key}")
        block = granularity is Granularity.BLOCK
        if block and weights.key.scale.block_shape != (FP8_BLOCK, FP8_BLOCK):
            raise ValueError(f"layout {self.layout} takes 128x128 scale blocks, got {weights.key.scale.block_shape}")
        rows = gate_up_row_order(config)
        if block and rows is not None:
            raise ValueError("block fp8 cannot be interleaved for swiglu_oai: a 128-row scale block would mix gate "
                             "and up rows of different blocks")
        tensors = {"w13": _kernel_tensor(weights.w13, device, rows, transpose=True),
                   "w2": _kernel_tensor(weights.w2, device, transpose=True)}
        for name in ("w13", "w2"):
            scale = getattr(weights, f"{name}_scale")
            if block:
                tensors[f"{name}_scale"] = _kernel_tensor(scale, device, transpose=True, dtype=torch.float32)
            else:
                tensors[f"{name}_scale"] = scale.to(device=device, dtype=torch.float32, copy=True)
        return PackedWeights(self.layout, {**tensors, **_biases(weights, config, device, rows)})


def _expect_group_scales(weights: ExpertWeights, layout: str, sizes: frozenset[int]) -> None:
    key = weights.key
    if key.scale.granularity is not Granularity.GROUP or key.group_size not in sizes:
        raise ValueError(f"layout {layout} takes group scales of size {sorted(sizes)}, got {key}")


@dataclass(frozen=True)
class XpuInt4Processor:
    """Symmetric int4 codes as the interface takes them: uint8 [E, out, in/2] (the canonical bytes:
    GPTQ's int32 words transposed and viewed as bytes give the same), scales [E, out, in/g] in the
    layer dtype."""

    layout: str = "xpu.int4.nk"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        key = weights.key
        _expect_key(weights, QuantDType.INT4, self.layout)
        _expect_group_scales(weights, self.layout, INT4_GROUP_SIZES)
        if key.zero_point is not ZeroPoint.NONE or key.act_order:
            raise ValueError(f"layout {self.layout} takes symmetric int4 without act-order (the kernel's zero point "
                             f"is fixed at 8 and it has no g_idx), got {key}")
        rows = gate_up_row_order(config)
        return PackedWeights(self.layout, {
            "w13": _kernel_tensor(weights.w13, device, rows),
            "w2": _kernel_tensor(weights.w2, device),
            "w13_scale": _kernel_tensor(weights.w13_scale, device, rows, dtype=config.dtype),
            "w2_scale": _kernel_tensor(weights.w2_scale, device, dtype=config.dtype),
            **_biases(weights, config, device, rows),
        })


@dataclass(frozen=True)
class XpuMxfp4Processor:
    """MXFP4 e2m1 codes as float4_e2m1fn_x2 [E, out, in/2] (canonical bytes), e8m0 scales uint8
    [E, out, in/32]."""

    layout: str = "xpu.mxfp4.nk"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        _expect_key(weights, QuantDType.FP4_E2M1, self.layout)
        _expect_group_scales(weights, self.layout, frozenset({32}))
        rows = gate_up_row_order(config)
        return PackedWeights(self.layout, {
            # The dtype is what tells the interface these bytes are e2m1 pairs.
            "w13": _kernel_tensor(weights.w13, device, rows).view(torch.float4_e2m1fn_x2),
            "w2": _kernel_tensor(weights.w2, device).view(torch.float4_e2m1fn_x2),
            "w13_scale": _kernel_tensor(weights.w13_scale, device, rows),
            "w2_scale": _kernel_tensor(weights.w2_scale, device),
            **_biases(weights, config, device, rows),
        })
