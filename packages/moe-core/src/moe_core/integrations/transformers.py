"""Run Hugging Face transformers MoE models on `moe_core.FusedMoE` layers.

    from moe_core.integrations.transformers import fuse

    report = fuse(model)                  # or fuse(model, quant=int8_w8a16(), prefer="cpu")
    print(report)                         # each replaced block with its backend
    print(report.layers[0].plan.explain())  # every candidate backend with its reason

`fuse` replaces every MoE block of a supported model in place with a `FusedMoEBlock`, which keeps the
model's own router module and shared experts and hands the router's logits to a `FusedMoE` whose
`Routing` descriptor reproduces that router exactly. A model, or one of its blocks, that the
descriptors cannot express exactly is refused with `UnsupportedModelError` before anything is
changed; nothing is approximated.

Mechanism: module swap, not transformers' experts hook
------------------------------------------------------
transformers 5 has a native hook: experts classes decorated with `use_experts_implementation` look
their forward up in `transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS` (an `ExpertsInterface`,
open to `register`) under the model-wide name `config._experts_implementation`. We read that
decorator's layout flags (`is_transposed`, `is_concatenated`, `has_bias`, `has_gate`,
`has_post_expert_norm`) to convert the expert tensors, but do not plug into the hook, because it sits
*after* the router: an experts forward receives `(hidden_states, top_k_index, top_k_weights)`
already routed by the model. Through it, `FusedMoE` could never receive router logits, so
monolithic backends (routing fused into the kernel) could not serve, the layer's `Routing`
descriptor would never run, and the oracle would choose among kernels for a routing it does not
perform. Swapping the whole sparse block keeps the one `FusedMoE.forward(hidden, router_logits)`
contract for every backend.

The router module is called as it is (so its logits are computed exactly as the model computes
them, including DeepSeek-V3's fp32 projection and gpt-oss's router bias, and
`output_router_logits` recording still sees it); its own top-k is discarded, costing O(tokens x
experts) next to the experts' O(tokens x top_k x hidden x intermediate).

How each supported model is expressed
-------------------------------------
| model_type  | block                  | routing                                                  | experts |
|-------------|------------------------|----------------------------------------------------------|---------|
| mixtral     | MixtralSparseMoeBlock  | softmax top-k, renormalized                              | w13 = gate_up_proj [E, 2N, K] |
| qwen2_moe   | Qwen2MoeSparseMoeBlock | softmax top-k, renormalized iff norm_topk_prob; shared    | as Mixtral |
|             |                        | expert x sigmoid(shared_expert_gate(x)) stays the model's |         |
| qwen3_moe   | Qwen3MoeSparseMoeBlock | softmax top-k, renormalized iff norm_topk_prob           | as Mixtral |
| olmoe       | OlmoeSparseMoeBlock    | softmax top-k, renormalized iff norm_topk_prob           | as Mixtral |
| deepseek_v3 | DeepseekV3MoE          | sigmoid, correction bias for selection, n_group/topk_group| as Mixtral |
|             |                        | grouping, renormalized (+1e-20) iff norm_topk_prob,       | (dense first layers are |
|             |                        | x routed_scaling_factor; shared experts stay the model's  | DeepseekV3MLP: untouched) |
| gpt_oss     | GptOssMLP              | top-k of logits (router bias included), softmax over the | gate_up_proj [E, K, 2N] |
|             |                        | k: equal to softmax top-k renormalized                   | transposed, gate/up columns |
|             |                        |                                                          | interleaved; biases; swiglu_oai |

Numerics that differ only by rounding (not semantics): Qwen2/Qwen3/OLMoE cast routing weights to the
model dtype and gpt-oss takes its softmax in the model dtype, where `FusedMoE` keeps them in fp32;
eager experts accumulate per-expert outputs in the model dtype, backends may accumulate in fp32.

Refused: other model types; gated activations other than silu/swish, gelu (erf) and
gelu_pytorch_tanh; non-gated experts or experts with a post-expert norm; experts whose weights are
not floating point (e.g. already quantized by a transformers quantizer); any value a descriptor
rejects (e.g. a non-positive routed_scaling_factor). Mixtral's `router_jitter_noise` only acts in
training mode, where the fused block raises instead of ignoring it. The fused blocks are for
inference: `FusedMoE` backends do not promise gradients.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from moe_core.config import Activation, ActivationKind, MoEConfig, Routing
from moe_core.layer import FusedMoE
from moe_core.oracle import Plan
from moe_core.quant import MoEQuantConfig, unquantized
from moe_core.weights.canonical import ExpertWeights
from moe_core.weights.hf import experts_from_state_dict

__all__ = ["FuseReport", "FusedLayer", "FusedMoEBlock", "UnsupportedModelError", "fuse", "supported_model_types"]


class UnsupportedModelError(ValueError):
    """`fuse` cannot express this model, or one of its MoE blocks, exactly; the message says why."""


# ---- what a block computes, in moe_core terms ------------------------------------------------


@dataclass(frozen=True)
class _BlockSpec:
    routing: Routing
    activation: Activation
    top_k: int
    router_attr: str  # child module whose forward returns (router_logits, scores, indices)
    correction_bias: torch.Tensor | None = None
    shared_expert_attr: str | None = None  # added to the routed output
    shared_expert_gate_attr: str | None = None  # Linear(K, 1): shared output *= sigmoid(gate(x))
    returns_router_scores: bool = False  # gpt-oss's block returns (hidden, router_scores)
    jitter_noise: float = 0.0  # Mixtral: multiplicative input noise in training mode only


# Gated activations whose transformers function is exactly the one moe_core applies to the gate half.
_GATED_ACTIVATIONS = {
    "silu": ActivationKind.SILU,
    "swish": ActivationKind.SILU,
    "gelu": ActivationKind.GELU,
    "gelu_pytorch_tanh": ActivationKind.GELU_TANH,
}


def _gated_activation(model_type: str, config) -> Activation:
    name = getattr(config, "hidden_act", None)
    kind = _GATED_ACTIVATIONS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise UnsupportedModelError(
            f"{model_type}: hidden_act={name!r} has no exact moe_core activation; supported gated activations: "
            f"{', '.join(sorted(_GATED_ACTIVATIONS))}"
        )
    return Activation(kind)


def _softmax_block(renormalize_attr: str | None, shared: bool = False) -> Callable:
    """Mixtral (always renormalizes), Qwen2-MoE, Qwen3-MoE, OLMoE (norm_topk_prob on the router)."""

    def describe(model_type: str, block: nn.Module, config) -> _BlockSpec:
        renormalize = True if renormalize_attr is None else bool(getattr(block.gate, renormalize_attr))
        return _BlockSpec(
            routing=Routing.softmax_topk(renormalize=renormalize),
            activation=_gated_activation(model_type, config),
            top_k=block.gate.top_k,
            router_attr="gate",
            shared_expert_attr="shared_expert" if shared else None,
            shared_expert_gate_attr="shared_expert_gate" if shared else None,
            jitter_noise=float(getattr(block, "jitter_noise", 0.0) or 0.0),
        )

    return describe


def _deepseek_v3_block(model_type: str, block: nn.Module, config) -> _BlockSpec:
    gate = block.gate
    return _BlockSpec(
        routing=Routing.deepseek_v3(num_expert_groups=gate.num_group, topk_groups=gate.topk_group,
                                    routed_scaling_factor=float(gate.routed_scaling_factor),
                                    renormalize=bool(gate.norm_topk_prob)),
        activation=_gated_activation(model_type, config),
        top_k=gate.top_k,
        router_attr="gate",
        correction_bias=gate.e_score_correction_bias.detach(),
        shared_expert_attr="shared_experts",
    )


def _gpt_oss_block(model_type: str, block: nn.Module, config) -> _BlockSpec:
    # softmax over the top-k logits equals softmax over all logits, top-k, renormalized.
    return _BlockSpec(
        routing=Routing.softmax_topk(renormalize=True),
        activation=Activation.swiglu_oai(alpha=float(block.experts.alpha), limit=float(block.experts.limit)),
        top_k=block.router.top_k,
        router_attr="router",
        returns_router_scores=True,
    )


@dataclass(frozen=True)
class _Architecture:
    block_class: str  # "module:Class" of the sparse MoE block inside transformers
    describe: Callable[[str, nn.Module, object], _BlockSpec]

    def load_block_class(self) -> type[nn.Module]:
        module, _, name = self.block_class.partition(":")
        return getattr(importlib.import_module(module), name)


_MODELS = "transformers.models"
_ARCHITECTURES: dict[str, _Architecture] = {
    "mixtral": _Architecture(f"{_MODELS}.mixtral.modeling_mixtral:MixtralSparseMoeBlock", _softmax_block(None)),
    "qwen2_moe": _Architecture(f"{_MODELS}.qwen2_moe.modeling_qwen2_moe:Qwen2MoeSparseMoeBlock",
                               _softmax_block("norm_topk_prob", shared=True)),
    "qwen3_moe": _Architecture(f"{_MODELS}.qwen3_moe.modeling_qwen3_moe:Qwen3MoeSparseMoeBlock",
                               _softmax_block("norm_topk_prob")),
    "olmoe": _Architecture(f"{_MODELS}.olmoe.modeling_olmoe:OlmoeSparseMoeBlock", _softmax_block("norm_topk_prob")),
    "deepseek_v3": _Architecture(f"{_MODELS}.deepseek_v3.modeling_deepseek_v3:DeepseekV3MoE", _deepseek_v3_block),
    "gpt_oss": _Architecture(f"{_MODELS}.gpt_oss.modeling_gpt_oss:GptOssMLP", _gpt_oss_block),
}


def supported_model_types() -> tuple[str, ...]:
    return tuple(sorted(_ARCHITECTURES))


# ---- expert tensors -> canonical ---------------------------------------------------------------


def _canonical_experts(where: str, experts: nn.Module) -> ExpertWeights:
    """The experts module's float weights as canonical `ExpertWeights` (views where possible).

    The layout comes from the flags transformers' `use_experts_implementation` decorator sets on
    the experts module; `moe_core.weights.hf` does the reading.
    """
    # has_post_expert_norm arrived after the others (transformers 5.17 lacks it): absent means no such norm.
    flags = ("has_gate", "has_bias", "is_transposed", "is_concatenated")
    missing = [f for f in flags if not hasattr(experts, f)]
    if missing:
        raise UnsupportedModelError(
            f"{where}: experts module {type(experts).__name__} does not declare its weight layout "
            f"(no {', '.join(missing)}: not a use_experts_implementation experts class; a transformers "
            "quantizer or another integration may have replaced it)"
        )
    if not experts.has_gate:
        raise UnsupportedModelError(f"{where}: non-gated experts (up_proj only) are not supported")
    if getattr(experts, "has_post_expert_norm", False):
        raise UnsupportedModelError(f"{where}: experts with a post-expert norm have no moe_core equivalent")
    gate_up = getattr(experts, "gate_up_proj", None)
    if not isinstance(gate_up, torch.Tensor) or gate_up.dim() != 3:
        raise UnsupportedModelError(f"{where}: experts.gate_up_proj is not a 3-D tensor (got {type(gate_up).__name__})")
    try:
        return experts_from_state_dict(experts.state_dict(), "", gate_up.shape[0],
                                       interleaved_gate_up=not experts.is_concatenated,
                                       transposed=experts.is_transposed)
    except ValueError as exc:
        raise UnsupportedModelError(f"{where}: cannot read the experts' weights: {exc}") from exc


# ---- the replacement block -----------------------------------------------------------------------


class FusedMoEBlock(nn.Module):
    """A transformers sparse MoE block whose routed experts run on `FusedMoE`.

    forward(hidden_states [..., K]) -> [..., K] (gpt-oss: (out, router_scores), as its block returns).
    """

    def __init__(self, moe: FusedMoE, router: nn.Module, spec: _BlockSpec,
                 shared_expert: nn.Module | None = None, shared_expert_gate: nn.Module | None = None) -> None:
        super().__init__()
        self.moe = moe
        self.router = router
        self.shared_expert = shared_expert
        self.shared_expert_gate = shared_expert_gate
        self.returns_router_scores = spec.returns_router_scores
        self.jitter_noise = spec.jitter_noise

    @property
    def plan(self) -> Plan:
        return self.moe.plan

    def forward(self, hidden_states: torch.Tensor):
        if self.training and self.jitter_noise > 0:
            raise RuntimeError(f"this block's model applies router_jitter_noise={self.jitter_noise} in training "
                               "mode, which the fused block does not reproduce; call model.eval() for inference")
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        router_logits, router_scores, _ = self.router(flat)
        out = self._routed_experts(flat, router_logits)
        if self.shared_expert is not None:
            shared = self.shared_expert(flat)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(flat)) * shared
            out = out + shared
        out = out.reshape(shape)
        return (out, router_scores) if self.returns_router_scores else out

    def _routed_experts(self, flat: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        limit = self.moe.config.max_num_tokens
        if flat.shape[0] <= limit:
            return self.moe(flat, router_logits)
        # Longer prompts than the layer's workspaces: run them in slices, tokens are independent.
        return torch.cat([self.moe(h, g) for h, g in zip(flat.split(limit), router_logits.split(limit))])


# ---- fuse ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FusedLayer:
    name: str  # the replaced module's path in the model, e.g. "model.layers.1.mlp"
    plan: Plan  # the oracle's choice for it; plan.explain() gives every candidate's reason

    @property
    def backend(self) -> str:
        return self.plan.backend


@dataclass(frozen=True)
class FuseReport:
    model_type: str
    layers: tuple[FusedLayer, ...]

    def explain(self) -> str:
        """Each replaced layer's candidate table (plan.explain())."""
        return "\n\n".join(f"== {layer.name}\n{layer.plan.explain()}" for layer in self.layers)

    def __str__(self) -> str:
        lines = [f"{self.model_type}: {len(self.layers)} MoE block(s) fused"]
        width = max(len(layer.name) for layer in self.layers)
        for layer in self.layers:
            plan = layer.plan
            lines.append(f"  {layer.name.ljust(width)}  {plan.backend}/{plan.experts_cls.name()}  "
                         f"{plan.config.describe()}")
        return "\n".join(lines)


def _resolve_device(where: str, requested: object, weights: torch.Tensor) -> torch.device:
    actual = weights.device
    if requested is None:
        return actual
    wanted = torch.device(requested)
    if wanted.type != actual.type or (wanted.index is not None and actual.index is not None
                                      and wanted.index != actual.index):
        raise ValueError(f"fuse: device={wanted} but {where} is on {actual}; move the model first "
                         f"(model.to({str(wanted)!r})) so the fused layers and the rest of the model share a device")
    return actual


def _build_block(model_type: str, name: str, block: nn.Module, spec: _BlockSpec, quant: MoEQuantConfig,
                 device: object, prefer: str | None) -> FusedMoEBlock:
    where = f"{model_type} block {name!r}"
    canonical = _canonical_experts(where, block.experts)
    try:
        config = MoEConfig(num_experts=canonical.num_experts, top_k=int(spec.top_k),
                           hidden_size=canonical.hidden_size, intermediate_size=canonical.intermediate_size,
                           activation=spec.activation, routing=spec.routing, dtype=canonical.w13.dtype,
                           has_bias=canonical.has_bias)
    except ValueError as exc:
        raise UnsupportedModelError(f"{where}: not expressible as a MoEConfig: {exc}") from exc
    moe = FusedMoE(config, quant, _resolve_device(where, device, canonical.w13), prefer)
    # Identity for unquantized layers; round-to-nearest quantization when `quant` asks for it.
    weights = ExpertWeights.from_float(canonical.w13, canonical.w2, moe.quant, canonical.w13_bias,
                                       canonical.w2_bias, dtype=config.dtype)
    moe.load_weights(weights, spec.correction_bias)
    shared = getattr(block, spec.shared_expert_attr) if spec.shared_expert_attr else None
    shared_gate = getattr(block, spec.shared_expert_gate_attr) if spec.shared_expert_gate_attr else None
    return FusedMoEBlock(moe, getattr(block, spec.router_attr), spec, shared, shared_gate)


def fuse(model: nn.Module, *, quant: MoEQuantConfig | None = None, device: object = None,
         prefer: str | None = None) -> FuseReport:
    """Replace, in place, every MoE block of a supported transformers model with a `FusedMoEBlock`.

    quant: the weight scheme the fused layers run (default unquantized: the model's own dtype);
    quantized schemes quantize the model's float experts round-to-nearest. device: where the fused
    layers run; it must be where the model already is (default: there). prefer: force a backend, as
    in `moe_core.select` (served or refused with its reason, never replaced).

    Raises UnsupportedModelError, naming the model type and what is unsupported, before any block
    is replaced; the oracle's errors (no backend, forced backend unavailable) likewise leave the
    model untouched.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    arch = _ARCHITECTURES.get(model_type)
    if arch is None:
        raise UnsupportedModelError(f"fuse: model_type {model_type!r} ({type(model).__name__}) is not supported; "
                                    f"supported: {', '.join(supported_model_types())}")
    quant = quant if quant is not None else unquantized()
    block_cls = arch.load_block_class()
    # Exact type: a subclass may compute something else.
    blocks = [(name, module) for name, module in model.named_modules() if type(module) is block_cls]
    if not blocks:
        raise UnsupportedModelError(f"fuse: {model_type} model {type(model).__name__} has no {block_cls.__name__} "
                                    "blocks (already fused, or the experts were replaced by another integration)")
    # Describe and build everything before swapping anything, so a refusal leaves the model intact.
    replacements = []
    for name, block in blocks:
        try:
            spec = arch.describe(model_type, block, config)
        except ValueError as exc:  # a descriptor rejected a value of this model
            if isinstance(exc, UnsupportedModelError):
                raise
            raise UnsupportedModelError(f"{model_type} block {name!r}: {exc}") from exc
        replacements.append((name, _build_block(model_type, name, block, spec, quant, device, prefer)))
    for name, fused in replacements:
        model.set_submodule(name, fused)
    return FuseReport(model_type, tuple(FusedLayer(name, fused.plan) for name, fused in replacements))
