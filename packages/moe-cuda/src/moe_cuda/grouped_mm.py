"""Experts on torch's own grouped GEMMs: `torch._grouped_mm` (bf16) and `torch._scaled_grouped_mm`
(fp8 per-channel weights x per-token dynamic fp8 activations). No dependency beyond torch.

The layer routes (moe-core's `route_torch`); the pairs are sorted by expert without padding
(`moe_cuda.dispatch`), both GEMMs run as one grouped call each over the sorted rows, the activation
runs in fp32 between them, and the rows are summed back into tokens with the router weights.

Why bf16 only: torch 2.11 has grouped-GEMM kernels for bf16 on sm90/sm100 only; fp16, fp32 and older
GPUs take its fallback, a per-expert loop with a device-to-host sync, which is slower than every
other backend here. `torch._grouped_mm` runs on the CPU too (the same fallback), which is how the
CPU tests run this class's real path at tiny shapes.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import torch

from moe_core.backends import Platform
from moe_core.config import ActivationKind, Feature, MoEConfig
from moe_core.experts import UNQUANTIZED, Capability, Experts, SchemeSupport
from moe_core.quant import Granularity, QuantDType
from moe_core.weights import ExpertWeights, PackedWeights
from moe_cuda.dispatch import ExpertPermutation, activate, combine, permute_by_expert

__all__ = [
    "GroupedMmProcessor",
    "TorchFp8GroupedMmExperts",
    "TorchGroupedMmExperts",
    "quantize_rows_fp8",
    "scaled_grouped_mm_twin",
]

FP8_MAX = 448.0
# route_torch (the layer's router for modular classes) implements every routing semantic.
ROUTED_BY_CORE = frozenset({Feature.SQRT_SOFTPLUS_SCORES, Feature.GROUP_SCORE_MAX,
                            Feature.SELECTION_BIAS_ON_LOGITS})
ALL_ACTIVATIONS = frozenset(ActivationKind)


@dataclass(frozen=True)
class GroupedMmProcessor:
    """Canonical w13 [E, R, K] / w2 [E, K, N], contiguous, on the device; the kernels read them
    transposed (column-major B), which is a view. fp8 keeps its codes and fp32 per-channel scales."""

    layout: str

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        tensors = {"w13": weights.w13, "w2": weights.w2}
        if weights.key.quantized:
            tensors |= {"w13_scale": weights.w13_scale.float(), "w2_scale": weights.w2_scale.float()}
        elif weights.w13.dtype != config.dtype:
            raise ValueError(f"w13 is {weights.w13.dtype} but the layer dtype is {config.dtype}; unquantized "
                             "weights must be in the layer dtype")
        if weights.has_bias:
            tensors |= {"w13_bias": weights.w13_bias.float(), "w2_bias": weights.w2_bias.float()}
        return PackedWeights(self.layout, {k: v.to(device).contiguous() for k, v in tensors.items()})


class _GroupedExperts(Experts):
    backend = "torch_grouped_mm"
    router = "moe_cuda.dispatch:route"

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
              ) -> torch.Tensor:
        packed = self._packed()
        cfg = self.config
        perm = permute_by_expert(topk_weights, topk_ids, cfg.num_local_experts, self.expert_map)
        h = self._gemm1(hidden_states, packed, perm)
        y = self._gemm2(h, packed, perm)
        return combine(y, perm, hidden_states.shape[0], weighted=not cfg.routing.weight_on_input)

    def _gemm1(self, hidden_states: torch.Tensor, packed: PackedWeights, perm: ExpertPermutation) -> torch.Tensor:
        """GEMM1 over each sorted pair's token row, weighted by its router weight where the model weighs
        the input (Llama4)."""
        x = hidden_states[perm.token]
        if self.config.routing.weight_on_input:
            x = (x.float() * perm.weight[:, None]).to(x.dtype)
        return self._with_bias(self._grouped(x, packed, "w13", perm), packed, "w13", perm)

    def _gemm2(self, h: torch.Tensor, packed: PackedWeights, perm: ExpertPermutation) -> torch.Tensor:
        """GEMM2 over GEMM1's rows after the activation."""
        return self._with_bias(self._grouped(activate(h, self.config), packed, "w2", perm), packed, "w2", perm)

    @staticmethod
    def _with_bias(y: torch.Tensor, packed: PackedWeights, name: str, perm: ExpertPermutation) -> torch.Tensor:
        bias = packed.get(f"{name}_bias")
        if bias is None:
            return y
        expert = perm.expert.clamp(max=bias.shape[0] - 1)  # rows of other ranks' experts are masked later
        return (y.float() + bias[expert]).to(y.dtype)

    @abstractmethod
    def _grouped(self, x: torch.Tensor, packed: PackedWeights, name: str, perm: ExpertPermutation) -> torch.Tensor:
        """One grouped GEMM of the expert-sorted rows x against weight `name` (rows of expert e:
        perm.starts[e]:perm.offsets[e])."""


class TorchGroupedMmExperts(_GroupedExperts):
    """bf16 experts: one `torch._grouped_mm` per GEMM over the expert-sorted rows."""

    weight_processor = GroupedMmProcessor("cuda.grouped_mm.canonical")
    capability = Capability(
        platforms=frozenset({Platform.CUDA}),
        schemes=(UNQUANTIZED,),
        activations=ALL_ACTIVATIONS,
        dtypes=frozenset({torch.bfloat16}),
        min_capability=(9, 0),
        features=ROUTED_BY_CORE,
        hidden_multiple=8,  # 16-byte aligned rows of bf16
        intermediate_multiple=8,
        validated_on=("cuda: NVIDIA H100 80GB HBM3", "cuda: NVIDIA H200"),
        limitations=(
            "bf16 only, sm90 and newer: elsewhere torch runs a per-expert loop with a host sync",
            "the sorted rows' gathers and index steps run as torch ops around the two grouped GEMMs; "
            "measured 1.5-2x slower than the fused Triton kernels on an H200 (bf16)",
        ),
    )

    def _grouped(self, x, packed, name, perm):
        return torch._grouped_mm(x, packed[name].transpose(1, 2), offs=perm.offsets)


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic fp8: (codes float8_e4m3fn [P, K], fp32 scales [P]) with x ~= codes * scale."""
    scale = x.float().abs().amax(-1).clamp(min=1e-12) / FP8_MAX
    codes = (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def scaled_grouped_mm_twin(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                           offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """What `torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=...)` computes for
    a [P, K] fp8 x b [E, K, R] fp8 with row scales [P] and column scales [E, R], in fp32 (any device)."""
    a32 = a.float() * scale_a[:, None]
    b32 = b.float() * scale_b[:, None, :]
    return torch._grouped_mm(a32, b32, offs=offs).to(out_dtype)


class TorchFp8GroupedMmExperts(_GroupedExperts):
    """fp8 W8A8: per-channel fp8 weights, activations quantized per row (token) on the fly, one
    `torch._scaled_grouped_mm` (fp8 tensor cores, rowwise scales) per GEMM."""

    weight_processor = GroupedMmProcessor("cuda.grouped_mm.fp8_channel")
    capability = Capability(
        platforms=frozenset({Platform.CUDA}),
        schemes=(SchemeSupport(QuantDType.FP8_E4M3, frozenset({Granularity.CHANNEL}),
                               activation=QuantDType.FP8_E4M3),),
        activations=ALL_ACTIVATIONS,
        dtypes=frozenset({torch.bfloat16}),
        min_capability=(9, 0),
        max_capability=(9, 0),
        features=ROUTED_BY_CORE,
        hidden_multiple=16,  # fp8 GEMM dimensions must be multiples of 16
        intermediate_multiple=16,
        validated_on=("cuda: NVIDIA H100 80GB HBM3", "cuda: NVIDIA H200"),
        limitations=(
            "sm90 only: torch 2.11's scaled grouped GEMM kernels are built for Hopper",
            "per-channel weights with per-token activations only (bf16 output)",
        ),
    )

    def _grouped(self, x, packed, name, perm):
        offsets = perm.offsets
        codes, scale = quantize_rows_fp8(x)
        w, w_scale = packed[name].transpose(1, 2), packed[f"{name}_scale"]
        if x.device.type == "cpu":  # torch has no CPU kernel for the fp8 op: tests run its twin
            return scaled_grouped_mm_twin(codes, w, scale, w_scale, offsets, x.dtype)
        return torch._scaled_grouped_mm(codes, w, scale, w_scale, offs=offsets, out_dtype=x.dtype)
