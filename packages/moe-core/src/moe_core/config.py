"""Layer descriptors: what an MoE layer computes, independent of any kernel.

Each descriptor is frozen and validated on construction; every error names the field, the value
it got and what is accepted. A model whose block cannot be expressed exactly by these descriptors
is refused (see `moe_core.integrations`), never approximated.
"""

from __future__ import annotations

import enum
import functools
import math
import operator
from dataclasses import dataclass, field

import torch

__all__ = [
    "SUPPORTED_DTYPES",
    "Activation",
    "ActivationKind",
    "ExpertPlacement",
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
    clamp: float | None = None  # SILU only, optional (clamped SiLU): gate <= clamp, -clamp <= up <= clamp
    #                             before silu(gate) * up; None: no clamp

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
        elif self.alpha is not None or self.limit is not None:
            raise ValueError(
                f"Activation(kind={self.kind.value!r}) takes no alpha/limit (got alpha={self.alpha}, "
                f"limit={self.limit}); only swiglu_oai has them"
            )
        if self.clamp is not None:
            if self.kind is not ActivationKind.SILU:
                raise _fail("Activation", "clamp", self.clamp, f"None for {self.kind.value} (only silu is clamped)")
            if not (math.isfinite(self.clamp) and self.clamp > 0):
                raise _fail("Activation", "clamp", self.clamp, "a finite float > 0 (clamped SiLU) or None")

    @property
    def gated(self) -> bool:
        return self.kind.gated

    @property
    def features(self) -> frozenset[Feature]:
        if self.clamp is not None:
            return frozenset({Feature.CLAMPED_SILU})
        return frozenset()

    def __str__(self) -> str:
        if self.kind is ActivationKind.SWIGLU_OAI:
            return f"swiglu_oai(alpha={self.alpha}, limit={self.limit})"
        if self.clamp is not None:
            return f"{self.kind.value}(clamp={self.clamp})"
        return self.kind.value

    @staticmethod
    def silu(clamp: float | None = None) -> Activation:
        """silu(gate) * up; with `clamp`, gate and up are clamped first (clamped SiLU)."""
        return Activation(ActivationKind.SILU, clamp=clamp)

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
    """How router logits become scores (fp32)."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"
    SQRT_SOFTPLUS = "sqrt_softplus"  # sqrt(softplus(logits)), per expert (DeepSeek-V4 style)


class GroupScoring(enum.StrEnum):
    """How group-limited routing scores a group of experts."""

    TOP2_SUM = "top2_sum"  # sum of its best two choice values (DeepSeek-V3; max if a group has one expert)
    MAX = "max"  # its best choice value (DeepSeek-V2 group_limited_greedy)


class Feature(enum.StrEnum):
    """Semantics beyond the baseline every experts class implements. A layer that uses one is served
    only by classes whose `Capability.features` lists it, so no kernel silently ignores it."""

    SQRT_SOFTPLUS_SCORES = "sqrt_softplus_scores"  # Scoring.SQRT_SOFTPLUS
    GROUP_SCORE_MAX = "group_score_max"  # GroupScoring.MAX
    SELECTION_BIAS_ON_LOGITS = "selection_bias_on_logits"  # correction bias added to logits, not scores
    CLAMPED_SILU = "clamped_silu"  # Activation(SILU, clamp=c): gate <= c, |up| <= c, then silu(gate) * up


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

    scores = softmax(logits), sigmoid(logits) or sqrt(softplus(logits)); choice = scores +
    correction_bias (if any; logits + correction_bias with `correction_bias_on_logits`), except
    that a softmax over ungrouped experts without a bias chooses by the logits themselves (the same
    top-k, without the ties fp32 rounding makes among nearly equal or underflowing probabilities);
    with groups: keep the `topk_groups` groups that score highest by `group_scoring`, mask the rest
    with -inf; ids = top-k of choice; weights = scores[ids] (never the biased values); if
    renormalize: weights /= (sum(weights) + renormalize_eps); weights *= routed_scaling_factor.
    Infinite logits (+Inf chooses its expert; a row of -Inf chooses none): `moe_core.routing`.
    """

    scoring: Scoring = Scoring.SOFTMAX
    renormalize: bool = False
    renormalize_eps: float = 0.0  # DeepSeek-V3 adds 1e-20; Mixtral/Qwen/gpt-oss add nothing
    num_expert_groups: int = 1  # DeepSeek-V3: n_group; 1 = no grouping
    topk_groups: int = 1  # groups kept per token; must be <= num_expert_groups
    has_correction_bias: bool = False  # a per-expert bias added for selection only (e_score_correction_bias)
    correction_bias_on_logits: bool = False  # the bias is added to the logits, not the scores; needs the bias
    group_scoring: GroupScoring = GroupScoring.TOP2_SUM  # how a group is scored; only read when grouped
    routed_scaling_factor: float = 1.0  # multiplies the final weights (DeepSeek-V3: 2.5)
    weight_on_input: bool = False  # Llama4: hidden * weight before the experts; needs top_k == 1

    def __post_init__(self) -> None:
        if not isinstance(self.scoring, Scoring):
            try:
                object.__setattr__(self, "scoring", Scoring(self.scoring))
            except ValueError:
                raise _fail("Routing", "scoring", self.scoring, f"one of {[s.value for s in Scoring]}") from None
        if not isinstance(self.group_scoring, GroupScoring):
            try:
                object.__setattr__(self, "group_scoring", GroupScoring(self.group_scoring))
            except ValueError:
                raise _fail("Routing", "group_scoring", self.group_scoring,
                            f"one of {[g.value for g in GroupScoring]}") from None
        if self.correction_bias_on_logits and not self.has_correction_bias:
            raise _fail("Routing", "correction_bias_on_logits", True, "False when has_correction_bias=False")
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
    def chooses_by_logit(self) -> bool:
        """A softmax over ungrouped experts without a bias: the top-k of its logits (see above)."""
        return self.scoring is Scoring.SOFTMAX and not self.grouped and not self.has_correction_bias

    @property
    def features(self) -> frozenset[Feature]:
        found = set()
        if self.scoring is Scoring.SQRT_SOFTPLUS:
            found.add(Feature.SQRT_SOFTPLUS_SCORES)
        if self.grouped and self.group_scoring is GroupScoring.MAX:
            found.add(Feature.GROUP_SCORE_MAX)
        if self.correction_bias_on_logits:
            found.add(Feature.SELECTION_BIAS_ON_LOGITS)
        return frozenset(found)

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
            if self.group_scoring is not GroupScoring.TOP2_SUM:
                parts.append(f"by {self.group_scoring.value}")
        if self.has_correction_bias:
            parts.append("correction bias on logits" if self.correction_bias_on_logits else "correction bias")
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


def _expert_id(value: object) -> int:
    """An integer id (int, numpy or torch integer scalar); int() would truncate 1.7 or parse "1"."""
    if isinstance(value, bool):
        raise TypeError("a bool is not an expert id")
    return operator.index(value)


def _format_ids(ids: tuple[int, ...]) -> str:
    """Global expert ids as runs: (0, 1, 2, 5, 7, 8) -> '0-2,5,7-8'."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass(frozen=True)
class ExpertPlacement:
    """Which rank holds which global experts: `ranks[r][j]` is the global id of rank r's local expert j.

    An expert held by several ranks is a redundant replica of a hot expert (all-to-all mode only):
    each routed choice of it is served by one replica, picked deterministically from the token's
    row (`moe_core.parallel`). Build one with `contiguous` or `moe_core.parallel.balanced_placement`.
    """

    num_experts: int  # global experts E; every id in [0, E) is held by at least one rank
    ranks: tuple[tuple[int, ...], ...]  # per rank, its experts' global ids in local order; none empty, no repeats

    def __post_init__(self) -> None:
        _check_positive_int("ExpertPlacement", "num_experts", self.num_experts)
        try:
            ranks = tuple(tuple(_expert_id(i) for i in held) for held in self.ranks)
        except TypeError:
            raise _fail("ExpertPlacement", "ranks", self.ranks,
                        "a sequence (per rank) of integer global expert ids") from None
        object.__setattr__(self, "ranks", ranks)
        if not ranks:
            raise _fail("ExpertPlacement", "ranks", ranks, "at least one rank")
        for r, held in enumerate(ranks):
            if not held:
                raise _fail("ExpertPlacement", f"ranks[{r}]", held, "at least one expert per rank")
            if len(set(held)) != len(held):
                raise _fail("ExpertPlacement", f"ranks[{r}]", held, "distinct expert ids (a rank holds an expert once)")
            if not all(0 <= i < self.num_experts for i in held):
                raise _fail("ExpertPlacement", f"ranks[{r}]", held, f"expert ids in [0, {self.num_experts})")
        missing = sorted(set(range(self.num_experts)).difference(*map(set, ranks)))
        if missing:
            raise _fail("ExpertPlacement", "ranks", ranks, f"every expert placed; missing {_format_ids(tuple(missing))}")

    @staticmethod
    def contiguous(num_experts: int, num_ranks: int) -> ExpertPlacement:
        """vLLM's layout: rank r holds a contiguous block, the first `num_experts % num_ranks` one more.
        One instance per size, built and checked once: a layer reads it on every call."""
        _check_positive_int("ExpertPlacement.contiguous", "num_experts", num_experts)
        _check_positive_int("ExpertPlacement.contiguous", "num_ranks", num_ranks)
        if num_ranks > num_experts:
            raise _fail("ExpertPlacement.contiguous", "num_ranks", num_ranks, f"<= num_experts={num_experts}")
        return _contiguous_placement(num_experts, num_ranks)

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    @property
    def num_slots(self) -> int:
        """Experts held over all ranks: num_experts plus the redundant replicas."""
        return sum(map(len, self.ranks))

    @property
    def has_replicas(self) -> bool:
        return self.num_slots > self.num_experts

    def replicas(self, expert: int) -> tuple[tuple[int, int], ...]:
        """(rank, local id) of every copy of `expert`, by rank."""
        return tuple((r, held.index(expert)) for r, held in enumerate(self.ranks) if expert in held)

    def describe(self) -> str:
        """One line per rank: 'rank 0: 5 experts 0-4'."""
        replicated = [e for e in range(self.num_experts) if len(self.replicas(e)) > 1]
        lines = [f"rank {r}: {len(held)} experts {_format_ids(held)}" for r, held in enumerate(self.ranks)]
        if replicated:
            lines.append(f"replicated experts: {_format_ids(tuple(replicated))}")
        return "\n".join(lines)


@functools.lru_cache(maxsize=64)
def _contiguous_placement(num_experts: int, num_ranks: int) -> ExpertPlacement:
    base, extra = divmod(num_experts, num_ranks)
    starts = [r * base + min(r, extra) for r in range(num_ranks + 1)]
    return ExpertPlacement(num_experts, tuple(tuple(range(starts[r], starts[r + 1])) for r in range(num_ranks)))


@dataclass(frozen=True)
class ParallelConfig:
    """How one layer is split across ranks.

    Tensor parallel shards every expert's intermediate dimension (N / tp_size per rank). Expert
    parallel gives each rank whole experts, as `placement` says; without one, rank r owns a
    contiguous block, the first `num_experts % ep_size` ranks one more (vLLM's layout). `expert_map`
    sends every global id to its local id on this rank or -1. How tokens reach the experts
    (replicated + all-reduce, or all-to-all) is the layer's choice: `FusedMoE(..., parallel=...)`.
    """

    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1
    ep_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    placement: ExpertPlacement | None = None  # expert parallel only: ranks == ep_size; None = contiguous blocks

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
        if self.placement is not None:
            if not isinstance(self.placement, ExpertPlacement):
                raise _fail("ParallelConfig", "placement", self.placement, "an ExpertPlacement or None")
            if self.placement.num_ranks != self.ep_size:
                raise _fail("ParallelConfig", "placement", f"<{self.placement.num_ranks} ranks>",
                            f"an ExpertPlacement of ep_size={self.ep_size} ranks")

    @property
    def use_ep(self) -> bool:
        return self.ep_size > 1

    def expert_placement(self, num_experts: int) -> ExpertPlacement:
        """`placement`, or the contiguous blocks; its num_experts must be the layer's."""
        if self.placement is None:
            return ExpertPlacement.contiguous(num_experts, self.ep_size)
        if self.placement.num_experts != num_experts:
            raise _fail("ParallelConfig", "placement.num_experts", self.placement.num_experts,
                        f"the layer's num_experts={num_experts}")
        return self.placement

    def local_experts(self, num_experts: int) -> tuple[int, ...]:
        """Global ids of this rank's experts, in local order (load their weights in this order)."""
        return self.expert_placement(num_experts).ranks[self.ep_rank]

    def local_expert_range(self, num_experts: int) -> range:
        """This rank's experts as a range; only for contiguous placements (else see `local_experts`)."""
        local = self.local_experts(num_experts)
        if local != tuple(range(local[0], local[0] + len(local))):
            raise ValueError(f"ParallelConfig: rank {self.ep_rank} holds experts {_format_ids(local)}, not a "
                             "contiguous range; use local_experts(num_experts)")
        return range(local[0], local[0] + len(local))

    def expert_map(self, num_experts: int, device: torch.device | str | None = None) -> torch.Tensor | None:
        """int32 [num_experts]: local id of each global expert, -1 where this rank holds no copy."""
        if not self.use_ep:
            return None
        local = self.local_experts(num_experts)
        m = torch.full((num_experts,), -1, dtype=torch.int32)
        m[list(local)] = torch.arange(len(local), dtype=torch.int32)
        return m.to(device) if device is not None else m

    def describe(self) -> str:
        if self.use_ep:
            kind = "contiguous" if self.placement is None else "custom"
            return f"expert parallel: rank {self.ep_rank} of {self.ep_size}, {kind} placement"
        if self.tp_size > 1:
            return f"tensor parallel: rank {self.tp_rank} of {self.tp_size}"
        return "single rank"


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
        return len(self.parallel.local_experts(self.num_experts))

    @property
    def w13_rows(self) -> int:
        """Output rows of GEMM1 per expert: 2N gated, N non-gated."""
        n = self.intermediate_size_per_partition
        return 2 * n if self.activation.gated else n

    def expert_map(self, device: torch.device | str | None = None) -> torch.Tensor | None:
        return self.parallel.expert_map(self.num_experts, device)

    @property
    def features(self) -> frozenset[Feature]:
        """The optional semantics this layer uses; an experts class must declare each to serve it."""
        return self.routing.features | self.activation.features

    def describe(self) -> str:
        n = self.intermediate_size_per_partition
        return (f"E={self.num_experts} top-{self.top_k} K={self.hidden_size} N={n} {self.activation} "
                f"{str(self.dtype).removeprefix('torch.')} routing: {self.routing}")
