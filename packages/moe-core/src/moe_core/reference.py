"""The fp32 reference MoE every backend is tested against, and the activation functions it uses."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_core.config import Activation, ActivationKind, Feature, MoEConfig
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType, QuantKey
from moe_core.weights.canonical import ExpertWeights

__all__ = ["apply_activation", "fake_quantize_activation", "reference_moe"]

_FP8_MAX = 448.0


def apply_activation(h: torch.Tensor, activation: Activation) -> torch.Tensor:
    """GEMM1 output [..., R] -> [..., N]; gated kinds read [gate | up] halves."""
    kind = activation.kind
    if kind is ActivationKind.RELU2:
        return F.relu(h).square()
    gate, up = h.chunk(2, dim=-1)
    if kind is ActivationKind.SILU:
        if activation.clamp is not None:  # clamped SiLU
            gate = gate.clamp(max=activation.clamp)
            up = up.clamp(-activation.clamp, activation.clamp)
        return F.silu(gate) * up
    if kind is ActivationKind.GELU:
        return F.gelu(gate) * up
    if kind is ActivationKind.GELU_TANH:
        return F.gelu(gate, approximate="tanh") * up
    if kind is ActivationKind.SWIGLU_OAI:
        gate = gate.clamp(max=activation.limit)
        up = up.clamp(-activation.limit, activation.limit)
        return gate * torch.sigmoid(activation.alpha * gate) * (up + 1)
    raise ValueError(f"unknown activation {activation}")


def fake_quantize_activation(x: torch.Tensor, key: QuantKey) -> torch.Tensor:
    """Quantize-dequantize activations [M, K] (fp32) the way a W8A8 kernel quantizes them."""
    if key.dtype is not QuantDType.FP8_E4M3:
        raise ValueError(f"activation quantization to {key} is not supported")
    g = key.scale.granularity
    if g is Granularity.TENSOR:
        amax = x.abs().amax().view(1, 1)
    elif g is Granularity.TOKEN:
        amax = x.abs().amax(-1, keepdim=True)
    elif g is Granularity.GROUP:
        gs = key.scale.group_size
        if x.shape[-1] % gs:
            raise ValueError(f"activation group size {gs} does not divide {x.shape[-1]}")
        xg = x.view(x.shape[0], -1, gs)
        s = (xg.abs().amax(-1, keepdim=True).clamp(min=1e-12) / _FP8_MAX)
        return ((xg / s).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn).float() * s).view_as(x)
    else:
        raise ValueError(f"activation scales of granularity {g.value} are not supported")
    s = amax.clamp(min=1e-12) / _FP8_MAX
    return (x / s).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn).float() * s


def reference_moe(hidden_states: torch.Tensor, weights: ExpertWeights, config: MoEConfig,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  quant: MoEQuantConfig | None = None,
                  expert_map: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 [M, K]: sum over the k choices of weight * expert(x), from dequantized weights.

    topk_ids are global expert ids; with `expert_map` (expert parallel), ids map to local experts
    and choices of experts owned elsewhere contribute zero. With fp8 activations in `quant`, the
    inputs of both GEMMs are quantize-dequantized as the kernel would.
    """
    M, K = hidden_states.shape
    b13 = weights.w13_bias.float().to(hidden_states.device) if weights.has_bias else None
    b2 = weights.w2_bias.float().to(hidden_states.device) if weights.has_bias else None
    act_key = quant.activation if quant is not None else None
    x = hidden_states.float()
    ids = topk_ids.long()
    if expert_map is not None:
        ids = expert_map.to(ids.device).long()[ids]
    tw = topk_weights.float()
    out = torch.zeros(M, K, dtype=torch.float32, device=hidden_states.device)
    for e in range(weights.num_experts):
        token, slot = (ids == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        # One expert at a time: the fp32 copy of a whole large layer would not fit in memory.
        w13, w2 = (w[0].to(x.device) for w in weights.narrow(e, 1).dequantize())
        xe = x[token]
        if config.routing.weight_on_input:
            xe = xe * tw[token, slot, None]
        if act_key is not None:
            xe = fake_quantize_activation(xe, act_key)
        h = xe @ w13.T
        if b13 is not None:
            h = h + b13[e]
        a = apply_activation(h, config.activation)
        if act_key is not None:
            a = fake_quantize_activation(a, act_key)
        y = a @ w2.T
        if b2 is not None:
            y = y + b2[e]
        if not config.routing.weight_on_input:
            y = y * tw[token, slot, None]
        out.index_add_(0, token, y)
    return out


# ---- the reference as an experts class (never auto-selected; prefer="reference" to debug) ----

from moe_core.backends import REFERENCE_BACKEND, Platform  # noqa: E402
from moe_core.experts import UNQUANTIZED, Capability, Experts, SchemeSupport, check_routed_inputs  # noqa: E402
from moe_core.quant import ZeroPoint  # noqa: E402
from moe_core.weights.processor import PackedWeights  # noqa: E402


class _KeepCanonical:
    layout = "canonical"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        # A copy: later writes to the caller's tensors must not change the loaded layer.
        return PackedWeights(self.layout, {"canonical": weights.to(device, copy=True)})  # type: ignore[dict-item]


_ALL_G = frozenset(Granularity)
_ZP = frozenset(ZeroPoint)


class ReferenceExperts(Experts):
    """The fp32 reference behind the experts interface: slow, exact, every scheme, every platform."""

    backend = REFERENCE_BACKEND
    weight_processor = _KeepCanonical()
    capability = Capability(
        platforms=frozenset(Platform),
        schemes=(
            UNQUANTIZED,
            SchemeSupport(QuantDType.INT4, _ALL_G, zero_points=_ZP, act_order=True),
            SchemeSupport(QuantDType.INT8, _ALL_G, zero_points=_ZP, act_order=True),
            SchemeSupport(QuantDType.FP8_E4M3, _ALL_G, activation=QuantDType.FP8_E4M3),
            SchemeSupport(QuantDType.FP4_E2M1, frozenset({Granularity.GROUP})),
        ),
        activations=frozenset(ActivationKind),
        features=frozenset(Feature),
        limitations=("a per-expert fp32 loop: for checking, never for speed",),
    )

    def apply(self, hidden_states, topk_weights, topk_ids):
        canonical: ExpertWeights = self._packed()["canonical"]  # type: ignore[assignment]
        check_routed_inputs(hidden_states, topk_weights, topk_ids, self.config)
        out = reference_moe(hidden_states, canonical, self.config, topk_weights, topk_ids, self.quant,
                            self.expert_map)
        return out.to(hidden_states.dtype)
