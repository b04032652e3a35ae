"""Declarative descriptions of transformers MoE blocks: where the router, experts, shared experts and
scales live, and what they compute, in `moe_core` terms.

A `BlockDescriptor` names attributes of the block (dotted paths such as "gate.weight"); `At` marks a
value read from the block at fuse time (e.g. `At("gate.top_k")`), anything else is a constant. The
table of every model type lives in `moe_core.integrations._models`; `transformers.fuse` interprets it
against a model's blocks. `ConfigFields` says where the model's config holds each value `fuse` reads
from the block, so `moe_core.hf_config` derives the same layer from config.json alone.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from moe_core.config import GroupScoring, Scoring

__all__ = [
    "At",
    "BlockDescriptor",
    "Check",
    "ClampedSilu",
    "ConfigFields",
    "ExpertsLayout",
    "Fixed",
    "Mapped",
    "Refused",
    "RouterDescriptor",
    "RoutingDescriptor",
    "Select",
    "SharedDescriptor",
    "SwigluOAI",
    "UnsupportedModelError",
    "resolve",
]


class UnsupportedModelError(ValueError):
    """A model, or one of its MoE blocks, that the descriptors cannot express exactly; the message says why."""


@dataclass(frozen=True)
class At:
    """A value read from the block at fuse time: `path` is dotted from the block ("gate.top_k")."""

    path: str
    default: object = None  # used when an attribute on the path is missing or None; None: the value is required


@dataclass(frozen=True)
class Select:
    """A value chosen by what the block holds at `path`: `cases` maps each accepted value to a result
    (a constant or an `At`); any other value is refused, naming the accepted ones."""

    path: str
    cases: tuple[tuple[object, object], ...]


@dataclass(frozen=True)
class Check:
    """A condition the block must meet to be expressed exactly; otherwise `fuse` refuses with `reason`."""

    path: str  # dotted from the block, as `At.path`
    accepted: tuple  # the values under which the descriptor is exact
    reason: str  # what the other values compute that moe_core does not


@dataclass(frozen=True)
class RouterDescriptor:
    """Router logits [M, E] = x @ weight.T (+ bias), recomputed by the fused block from these tensors."""

    weight: str  # dotted path of the [E, K] projection weight
    bias: str | None = None  # dotted path of an [E] logit bias (gpt-oss); None: no bias
    fp32: bool = False  # True: fp32 copies of input and weight (DeepSeek-V3 style); False: the weight's dtype


@dataclass(frozen=True)
class RoutingDescriptor:
    """The fields of `moe_core.Routing` plus top-k; each a constant or an `At`."""

    top_k: At | Select | int
    scoring: At | Select | Scoring | str = Scoring.SOFTMAX  # an `At` may read a model's name ("sigmoid", "sqrtsoftplus")
    renormalize: At | Select | bool = False
    renormalize_eps: float = 0.0
    num_expert_groups: At | Select | int = 1  # At(...) reading None means no grouping
    topk_groups: At | Select | int = 1
    group_scoring: GroupScoring = GroupScoring.TOP2_SUM
    correction_bias: Select | str | None = None  # dotted path of the [E] selection bias; None: none
    correction_bias_on_logits: bool = False
    routed_scaling_factor: At | Select | float = 1.0
    weight_on_input: bool = False


@dataclass(frozen=True)
class SwigluOAI:
    """gpt-oss's clamped SwiGLU on [gate | up]: clamp, gate * sigmoid(alpha * gate) * (up + 1)."""

    alpha: At | float
    limit: At | float


@dataclass(frozen=True)
class ClampedSilu:
    """SiLU-gated experts with clamps before the activation: gate <= limit, -limit <= up <= limit."""

    limit: At | float


@dataclass(frozen=True)
class SharedDescriptor:
    """Shared experts: run on every token and added to the routed output (kept as the model's modules)."""

    module: str  # dotted path of the shared MLP
    gate: str | None = None  # Linear(K, 1): shared output *= sigmoid(gate(x)); None: ungated
    optional: bool = False  # the block may lack the module (no shared experts in this config)
    combine_scale: At | Select | float = 1.0  # (routed + shared) *= this when the shared experts are present


@dataclass(frozen=True)
class Fixed:
    """A block attribute its module sets to a constant, whatever the config says."""

    value: object


@dataclass(frozen=True)
class Mapped:
    """A block attribute derived from config attribute `name`: `cases` maps config values to the block's
    (e.g. moe_latent_size None -> an "Identity" projection); other values pass through unchanged."""

    name: str
    cases: tuple[tuple[object, object], ...]


# The config attribute each block path is built from, unless a model's `ConfigFields.paths` says
# otherwise (the block modules copy these from their config in __init__).
_CONFIG_ATTRIBUTES: dict[str, str] = {
    "gate.top_k": "num_experts_per_tok",
    "router.top_k": "num_experts_per_tok",
    "gate.norm_topk_prob": "norm_topk_prob",
    "gate.num_group": "n_group",
    "gate.topk_group": "topk_group",
    "gate.topk_method": "topk_method",
    "gate.routed_scaling_factor": "routed_scaling_factor",
    "routed_scaling_factor": "routed_scaling_factor",
    "gate.expert_selection_fn": "expert_selection_fn",
    "shared_expert_combination_strategy": "shared_expert_combination_strategy",
    "use_expert_bias": "use_expert_bias",
    "experts.alpha": "swiglu_alpha",
    "experts.limit": "swiglu_limit",
    "experts.swiglu_alpha": "swiglu_alpha",
    "experts.swiglu_limit": "swiglu_limit",
}


@dataclass(frozen=True)
class ConfigFields:
    """Where a model type's (text) config holds what `fuse` reads from its MoE block: the names its
    modules read (transformers' config attribute names; the class's attribute_map aliases apply)."""

    num_experts: str = "num_experts"
    intermediate_size: str = "moe_intermediate_size"  # the routed experts' N
    hidden_act: str | Fixed = "hidden_act"  # the experts' act_fn name (unused with a descriptor activation)
    has_bias: bool = False  # the experts carry biases
    paths: tuple[tuple[str, str | Fixed | Mapped], ...] = ()  # block path -> its source, beyond the defaults

    def source(self, path: str) -> str | Fixed | Mapped:
        """The config attribute (or constant) block path `path` is built from; KeyError if none is known."""
        return dict(self.paths).get(path) or _CONFIG_ATTRIBUTES[path]


class ExpertsLayout(enum.Enum):
    """How expert tensors are read when the experts module does not declare its layout itself."""

    DECLARED = "declared"  # use_experts_implementation flags on the module (transformers 5)
    TRANSPOSED_CONCATENATED = "transposed_concatenated"  # gate_up_proj [E, K, 2N], down_proj [E, N, K]


@dataclass(frozen=True)
class BlockDescriptor:
    """One model type's sparse MoE block.

    Output = post_module(output_scale * combine_scale * (routed + shared)), each part only where
    present; routed = the `FusedMoE` layer (routing, experts, routed scaling).
    """

    block: str  # "module:Class" inside transformers.models; matched by exact type
    router: RouterDescriptor
    routing: RoutingDescriptor
    experts: str = "experts"  # dotted path of the experts module
    experts_layout: ExpertsLayout = ExpertsLayout.DECLARED
    activation: SwigluOAI | ClampedSilu | None = None  # for experts whose activation is not an `act_fn` module
    shared: SharedDescriptor | None = None
    output_scale: At | Select | float = 1.0  # multiplies the block output (routed + shared)
    post_module: str | None = None  # a module of the block applied last, to the whole output (a norm)
    router_output: tuple[str, int] | None = None  # (module, i): the block also returns output i of that
    #                                               router module (gpt-oss, Llama 4); None: one output
    flat_output: bool = False  # the block returns [tokens, K] whatever its input's shape (Llama 4)
    jitter_noise: str | None = None  # dotted path of a training-only input noise (Mixtral style)
    checks: tuple[Check, ...] = ()  # conditions for exactness
    takes_extra_inputs: bool = False  # forward(hidden, ...) takes more arguments that the fused block ignores
    config: ConfigFields = ConfigFields()  # where config.json holds the same values (`moe_core.hf_config`)
    note: str = ""  # shown in docs/models.md: what the block does beyond plain top-k routing

    def __post_init__(self) -> None:
        module, sep, name = self.block.partition(":")
        if not sep or not module or not name:
            raise ValueError(f"BlockDescriptor.block={self.block!r} is invalid: expected 'module:Class'")


@dataclass(frozen=True)
class Refused:
    """A model type `fuse` refuses, with the reason (the unsupported semantics)."""

    reason: str
    kind: str = "unsupported"  # "unsupported" semantics, or "no_moe": a model type without MoE blocks

    def __post_init__(self) -> None:
        if self.kind not in ("unsupported", "no_moe"):
            raise ValueError(f"Refused.kind={self.kind!r} is invalid: expected 'unsupported' or 'no_moe'")


def resolve(spec: object, read: Callable[[str], object], where: str, field: str, source: str) -> object:
    """A descriptor field's value: a constant as it is; `At` and `Select` paths through `read(path)`
    (None where nothing is set), from `source` ("this block", "its config"); `where` and `field`
    name the value in errors."""
    if isinstance(spec, At):
        value = read(spec.path)
        if value is None:
            if spec.default is None:
                raise UnsupportedModelError(f"{where}: {field} is read from '{spec.path}', which {source} does not set")
            return spec.default
        return value
    if isinstance(spec, Select):
        value = read(spec.path)
        for accepted, result in spec.cases:
            if value == accepted:
                return resolve(result, read, where, field, source)
        accepted = ", ".join(repr(a) for a, _ in spec.cases)
        raise UnsupportedModelError(f"{where}: {spec.path}={value!r} is not supported for {field} "
                                    f"(supported: {accepted})")
    return spec
