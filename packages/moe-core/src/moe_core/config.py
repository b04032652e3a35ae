"""Layer descriptors: what an MoE layer computes, independent of any kernel.

Each descriptor is frozen and validated on construction; every error names the field, the value
it got and what is accepted. A model whose block cannot be expressed exactly by these descriptors
is refused (see `moe_core.integrations`), never approximated.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import torch

__all__ = [
    "SUPPORTED_DTYPES",
    "Activation",
    "ActivationKind",
    "MoEConfig",
    "ParallelConfig",
    "Routing",
    "RoutingMethod",
    "Scoring",
]

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _fail(owner: str, field_name: str, value: object, accepted: str) -> ValueError:
    return ValueError(f"{owner}.{field_name}={value!r} is invalid: expected {accepted}")


def _check_positive_int(owner: str, name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _fail(owner, name, value, "a positive int")


# ---- activation -----------------------------------------------------------------------------


class ActivationKind(enum.StrEnum):
    SILU = "silu"  # gated: silu(gate) * up
    GELU = "gelu"  # gated: gelu(gate) * up (erf form)
    GELU_TANH = "gelu_tanh"  # gated: gelu(gate, approximate="tanh") * up
    SWIGLU_OAI = "swiglu_oai"  # gated, gpt-oss: clamp, gate * sigmoid(alpha * gate) * (up + 1)
    RELU2 = "relu2"  # non-gated: relu(x) ** 2 (Nemotron-H style)

    @property
    def gated(self) -> bool:
        return self is not ActivationKind.RELU2


@dataclass(frozen=True)
class Activation:
    """The expert MLP's activation with every parameter that changes its math.

    Gated kinds read w13's output as [gate | up] halves (canonical order: gate first, whatever the
    checkpoint's layout; gpt-oss's interleaved rows are de-interleaved by its reader).
    """

    kind: ActivationKind
    alpha: float | None = None  # SWIGLU_OAI only: sigmoid slope (gpt-oss: 1.702); None elsewhere
    limit: float | None = None  # SWIGLU_OAI only: gate <= limit, -limit <= up <= limit (gpt-oss: 7.0)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ActivationKind):
            try:
                object.__setattr__(self, "kind", ActivationKind(self.kind))
            except ValueError:
                raise _fail("Activation", "kind", self.kind, f"one of {[k.value for k in ActivationKind]}") from None
        if self.kind is ActivationKind.SWIGLU_OAI:
            if self.alpha is None or not self.alpha > 0:
                raise _fail("Activation", "alpha", self.alpha, "a positive float for swiglu_oai (gpt-oss uses 1.702)")
            if self.limit is None or not self.limit > 0:
                raise _fail("Activation", "limit", self.limit, "a positive float for swiglu_oai (gpt-oss uses 7.0)")
        else:
            if self.alpha is not None or self.limit is not None:
                raise ValueError(
                    f"Activation(kind={self.kind.value!r}) takes no alpha/limit (got alpha={self.alpha}, "
                    f"limit={self.limit}); only swiglu_oai has them"
                )

    @property
    def gated(self) -> bool:
        return self.kind.gated

    def __str__(self) -> str:
        if self.kind is ActivationKind.SWIGLU_OAI:
            return f"swiglu_oai(alpha={self.alpha}, limit={self.limit})"
        return self.kind.value

    @staticmethod
    def silu() -> Activation:
        return Activation(ActivationKind.SILU)

    @staticmethod
    def gelu() -> Activation:
        return Activation(ActivationKind.GELU)

    @staticmethod
    def gelu_tanh() -> Activation:
        return Activation(ActivationKind.GELU_TANH)

    @staticmethod
    def swiglu_oai(alpha: float = 1.702, limit: float = 7.0) -> Activation:
        return Activation(ActivationKind.SWIGLU_OAI, alpha=alpha, limit=limit)

    @staticmethod
    def relu2() -> Activation:
        return Activation(ActivationKind.RELU2)


# ---- routing --------------------------------------------------------------------------------


class Scoring(enum.StrEnum):
    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class RoutingMethod(enum.StrEnum):
    """Coarse routing family, the unit in which monolithic (router-fused) kernels declare support."""

    SOFTMAX_TOPK = "softmax_topk"  # softmax over all experts, top-k, weights not renormalized
    SOFTMAX_TOPK_RENORM = "softmax_topk_renorm"  # ... renormalized to sum 1 (Mixtral, Qwen3, gpt-oss)
    SIGMOID_TOPK = "sigmoid_topk"  # sigmoid scores, top-k (optionally renormalized)
    GROUPED_TOPK = "grouped_topk"  # DeepSeek-V3: groups, correction bias, scaling factor
    LLAMA4 = "llama4"  # top-1 on logits, sigmoid weight, applied to the input


@dataclass(frozen=True)
class Routing:
    """How router logits [M, E] become (topk_weights, topk_ids). Computed in fp32.

    scores = softmax(logits) or sigmoid(logits); choice = scores + correction_bias (if any);
    with groups: keep the `topk_groups` groups whose best two choice values sum highest (max if a
    group has one expert), mask the rest; ids = top-k of choice; weights = scores[ids] (never the
    biased values); if renormalize: weights /= (sum(weights) + renormalize_eps);
    weights *= routed_scaling_factor.
    """

    scoring: Scoring = Scoring.SOFTMAX
    renormalize: bool = False
    renormalize_eps: float = 0.0  # DeepSeek-V3 adds 1e-20; Mixtral/Qwen/gpt-oss add nothing
    num_expert_groups: int = 1  # DeepSeek-V3: n_group; 1 = no grouping
    topk_groups: int = 1  # groups kept per token; must be <= num_expert_groups
    has_correction_bias: bool = False  # a per-expert bias added for selection only (e_score_correction_bias)
    routed_scaling_factor: float = 1.0  # multiplies the final weights (DeepSeek-V3: 2.5)
    weight_on_input: bool = False  # Llama4: hidden * weight before the experts; needs top_k == 1

    def __post_init__(self) -> None:
        if not isinstance(self.scoring, Scoring):
            try:
                object.__setattr__(self, "scoring", Scoring(self.scoring))
            except ValueError:
                raise _fail("Routing", "scoring", self.scoring, "'softmax' or 'sigmoid'") from None
        _check_positive_int("Routing", "num_expert_groups", self.num_expert_groups)
        _check_positive_int("Routing", "topk_groups", self.topk_groups)
        if self.topk_groups > self.num_expert_groups:
            raise _fail("Routing", "topk_groups", self.topk_groups, f"<= num_expert_groups={self.num_expert_groups}")
        if not (math.isfinite(self.routed_scaling_factor) and self.routed_scaling_factor > 0):
            raise _fail("Routing", "routed_scaling_factor", self.routed_scaling_factor, "a finite float > 0")
        if not (self.renormalize_eps >= 0 and math.isfinite(self.renormalize_eps)):
            raise _fail("Routing", "renormalize_eps", self.renormalize_eps, "a finite float >= 0")
        if self.renormalize_eps and not self.renormalize:
            raise _fail("Routing", "renormalize_eps", self.renormalize_eps, "0 when renormalize=False")

    @property
    def grouped(self) -> bool:
        return self.num_expert_groups > 1

    @property
    def method(self) -> RoutingMethod:
        if self.weight_on_input:
            return RoutingMethod.LLAMA4
        if self.grouped or self.has_correction_bias:
            return RoutingMethod.GROUPED_TOPK
        if self.scoring is Scoring.SIGMOID:
            return RoutingMethod.SIGMOID_TOPK
        return RoutingMethod.SOFTMAX_TOPK_RENORM if self.renormalize else RoutingMethod.SOFTMAX_TOPK

    def __str__(self) -> str:
        parts = [self.scoring.value, "top-k"]
        if self.renormalize:
            parts.append("renormalized")
        if self.grouped:
            parts.append(f"groups {self.topk_groups}/{self.num_expert_groups}")
        if self.has_correction_bias:
            parts.append("correction bias")
        if self.routed_scaling_factor != 1.0:
            parts.append(f"x{self.routed_scaling_factor}")
        if self.weight_on_input:
            parts.append("weight on input")
        return " ".join(parts)

    # Named forms of the routers in current transformers MoE blocks.
    @staticmethod
    def softmax_topk(renormalize: bool) -> Routing:
        """Mixtral, Qwen3-MoE (norm_topk_prob=True), OLMoE/Qwen2-MoE (False); gpt-oss (True)."""
        return Routing(Scoring.SOFTMAX, renormalize=renormalize)

    @staticmethod
    def sigmoid_topk(renormalize: bool) -> Routing:
        return Routing(Scoring.SIGMOID, renormalize=renormalize)

    @staticmethod
    def deepseek_v3(num_expert_groups: int = 8, topk_groups: int = 4, routed_scaling_factor: float = 2.5,
                    renormalize: bool = True) -> Routing:
        return Routing(Scoring.SIGMOID, renormalize=renormalize, renormalize_eps=1e-20 if renormalize else 0.0,
                       num_expert_groups=num_expert_groups, topk_groups=topk_groups, has_correction_bias=True,
                       routed_scaling_factor=routed_scaling_factor)

    @staticmethod
    def llama4() -> Routing:
        return Routing(Scoring.SIGMOID, weight_on_input=True)


# ---- parallelism ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ParallelConfig:
    """How one layer is split across ranks.

    Tensor parallel shards every expert's intermediate dimension (N / tp_size per rank). Expert
    parallel gives each rank whole experts: rank r owns a contiguous block, the first
    `num_experts % ep_size` ranks one more (vLLM's layout), and `expert_map` sends every global id
    to its local id or -1.
    """

    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1
    ep_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0

    def __post_init__(self) -> None:
        for size, rank in (("tp_size", "tp_rank"), ("ep_size", "ep_rank"), ("dp_size", "dp_rank")):
            _check_positive_int("ParallelConfig", size, getattr(self, size))
            r = getattr(self, rank)
            if not isinstance(r, int) or not 0 <= r < getattr(self, size):
                raise _fail("ParallelConfig", rank, r, f"an int in [0, {size}={getattr(self, size)})")
        if self.tp_size > 1 and self.ep_size > 1:
            raise ValueError(
                f"ParallelConfig: tp_size={self.tp_size} and ep_size={self.ep_size} are both > 1; a layer is "
                "either tensor-sharded or expert-sharded (flatten the ranks into one of them)"
            )

    @property
    def use_ep(self) -> bool:
        return self.ep_size > 1

    def local_expert_range(self, num_experts: int) -> range:
        base, extra = divmod(num_experts, self.ep_size)
        start = self.ep_rank * base + min(self.ep_rank, extra)
        return range(start, start + base + (1 if self.ep_rank < extra else 0))

    def expert_map(self, num_experts: int, device: torch.device | str | None = None) -> torch.Tensor | None:
        """int32 [num_experts]: local id of each global expert, -1 where another rank owns it."""
        if not self.use_ep:
            return None
        local = self.local_expert_range(num_experts)
        m = torch.full((num_experts,), -1, dtype=torch.int32)
        m[local.start:local.stop] = torch.arange(len(local), dtype=torch.int32)
        return m.to(device) if device is not None else m


# ---- the layer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MoEConfig:
    """One MoE layer: E experts, each MLP K -> N (x2 if gated) -> K, top-k routing."""

    num_experts: int  # global experts E
    top_k: int  # experts per token
    hidden_size: int  # K
    intermediate_size: int  # N per expert before tensor-parallel sharding
    activation: Activation = field(default_factory=Activation.silu)
    routing: Routing = field(default_factory=lambda: Routing.softmax_topk(renormalize=True))
    dtype: torch.dtype = torch.bfloat16  # activations in and out
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    has_bias: bool = False  # per-expert biases on both GEMMs (gpt-oss)
    max_num_tokens: int = 8192  # largest M one forward call may receive (sizes workspaces)

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "hidden_size", "intermediate_size", "max_num_tokens"):
            _check_positive_int("MoEConfig", name, getattr(self, name))
        if self.top_k > self.num_experts:
            raise _fail("MoEConfig", "top_k", self.top_k, f"<= num_experts={self.num_experts}")
        if not isinstance(self.activation, Activation):
            raise _fail("MoEConfig", "activation", self.activation, "an Activation, e.g. Activation.silu()")
        if not isinstance(self.routing, Routing):
            raise _fail("MoEConfig", "routing", self.routing, "a Routing, e.g. Routing.softmax_topk(True)")
        if not isinstance(self.parallel, ParallelConfig):
            raise _fail("MoEConfig", "parallel", self.parallel, "a ParallelConfig")
        if self.dtype not in SUPPORTED_DTYPES:
            raise _fail("MoEConfig", "dtype", self.dtype, "torch.bfloat16, torch.float16 or torch.float32")
        r = self.routing
        if r.grouped:
            if self.num_experts % r.num_expert_groups:
                raise _fail("MoEConfig", "routing.num_expert_groups", r.num_expert_groups,
                            f"a divisor of num_experts={self.num_experts}")
            per_group = self.num_experts // r.num_expert_groups
            if r.topk_groups * per_group < self.top_k:
                raise ValueError(
                    f"MoEConfig: top_k={self.top_k} exceeds the experts in the kept groups "
                    f"(topk_groups={r.topk_groups} x {per_group} experts per group)"
                )
        if r.weight_on_input and self.top_k != 1:
            raise _fail("MoEConfig", "top_k", self.top_k, "1 when routing.weight_on_input is set (Llama4)")
        if self.intermediate_size % self.parallel.tp_size:
            raise _fail("MoEConfig", "intermediate_size", self.intermediate_size,
                        f"divisible by parallel.tp_size={self.parallel.tp_size}")
        if self.parallel.ep_size > self.num_experts:
            raise _fail("MoEConfig", "parallel.ep_size", self.parallel.ep_size,
                        f"<= num_experts={self.num_experts}")

    @property
    def intermediate_size_per_partition(self) -> int:
        return self.intermediate_size // self.parallel.tp_size

    @property
    def num_local_experts(self) -> int:
        return len(self.parallel.local_expert_range(self.num_experts))

    @property
    def w13_rows(self) -> int:
        """Output rows of GEMM1 per expert: 2N gated, N non-gated."""
        n = self.intermediate_size_per_partition
        return 2 * n if self.activation.gated else n

    def expert_map(self, device: torch.device | str | None = None) -> torch.Tensor | None:
        return self.parallel.expert_map(self.num_experts, device)

    def describe(self) -> str:
        n = self.intermediate_size_per_partition
        return (f"E={self.num_experts} top-{self.top_k} K={self.hidden_size} N={n} {self.activation} "
                f"{str(self.dtype).removeprefix('torch.')} routing: {self.routing}")
