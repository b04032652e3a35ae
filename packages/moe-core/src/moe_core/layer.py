"""`FusedMoE`: one MoE layer that owns its plan and its own kernel instance."""

from __future__ import annotations

import torch

from moe_core.backends import available_memory_bytes
from moe_core.config import MoEConfig
from moe_core.oracle import Plan, apply_layer, select
from moe_core.parallel import (
    AllToAll,
    AllToAllDispatch,
    ExpertParallelReduce,
    ParallelPlan,
    Replicate,
    resolve_parallel,
)
from moe_core.quant import MoEQuantConfig
from moe_core.weights.canonical import ExpertWeights

__all__ = ["FusedMoE"]

# Calls whose intermediates stay below this never query the device's free memory.
_WORKING_MEMORY_CHECK_BYTES = 256 << 20


class FusedMoE(torch.nn.Module):
    """forward(hidden_states [M, K], router_logits [M, E]) -> [M, K] in `config.dtype`.

    The backend is chosen at construction (see `plan.explain()`); weights come later through
    `load_weights`, in canonical form, from any reader in `moe_core.weights`. Loading again replaces
    the kernel's tensors, so the same weights always give the same output.

    With `config.parallel.ep_size > 1` the layer holds this rank's experts only (load
    `moe_core.parallel.local_weights(all_weights, config)`: the experts of
    `config.parallel.local_experts(E)`, in that order) and `parallel` says how tokens move over
    `ep_group` (default: the whole initialized world); `parallel_plan.explain()` says which and why:
    - None or `moe_core.parallel.Replicate()`: every rank gets the same tokens and the output is
      summed over the group (`ExpertParallelReduce`). `ep_group="partial"` skips the sum and returns
      this rank's share (its local experts' contributions), e.g. to run one slice of a layer alone.
    - `moe_core.parallel.AllToAll(...)`: every rank gets its own tokens and router logits; they are
      routed here, sent to the ranks holding their experts and combined back (`AllToAllDispatch`);
      the output is the layer output for this rank's tokens. Every rank must call forward together.
    """

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig | None = None, device: object = None,
                 prefer: str | None = None, ep_group: object = None, parallel: object = None) -> None:
        super().__init__()
        self.config = config
        self.plan: Plan = select(config, quant, device, prefer)
        self.quant = self.plan.quant
        self.experts = self.plan.make_experts()
        self.correction_bias: torch.Tensor | None = None
        self.parallel_plan: ParallelPlan = resolve_parallel(config, parallel, self.plan.experts_cls.monolithic,
                                                            self.plan.experts_cls.name(), ep_group)
        self._finalize: ExpertParallelReduce | None = None
        self._dispatch: AllToAllDispatch | None = None
        mode = self.parallel_plan.mode
        if isinstance(mode, Replicate) and ep_group != "partial":
            self._finalize = ExpertParallelReduce(config, ep_group)
        elif isinstance(mode, AllToAll):
            self._dispatch = AllToAllDispatch(config, mode, ep_group)

    @property
    def device(self) -> torch.device:
        return self.plan.device.torch_device

    def load_weights(self, weights: ExpertWeights, correction_bias: torch.Tensor | None = None) -> None:
        routing = self.config.routing
        if routing.has_correction_bias:
            E = self.config.num_experts
            if correction_bias is None or tuple(correction_bias.shape) != (E,):
                got = None if correction_bias is None else list(correction_bias.shape)
                raise ValueError(f"this layer's routing uses a correction bias: pass correction_bias of shape [{E}], "
                                 f"got {got}")
            self.correction_bias = correction_bias.detach().to(self.device, torch.float32).clone()
        elif correction_bias is not None:
            raise ValueError("correction_bias was given but the layer's routing has no correction bias")
        self.experts.load_weights(weights)

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.plan.router(router_logits, self.config.routing, self.config.top_k, self.correction_bias)

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if hidden_states.dim() != 2 or hidden_states.shape[1] != cfg.hidden_size:
            raise ValueError(f"hidden_states must be [M, {cfg.hidden_size}], got {list(hidden_states.shape)}")
        M = hidden_states.shape[0]
        if tuple(router_logits.shape) != (M, cfg.num_experts):
            raise ValueError(f"router_logits must be [{M}, {cfg.num_experts}] (tokens, global experts), "
                             f"got {list(router_logits.shape)}")
        if hidden_states.dtype != cfg.dtype:
            raise ValueError(f"hidden_states dtype {hidden_states.dtype} differs from the layer dtype {cfg.dtype}")
        if not router_logits.dtype.is_floating_point:
            raise ValueError(f"router_logits must be floating point, got {router_logits.dtype}")
        for name, t in (("hidden_states", hidden_states), ("router_logits", router_logits)):
            if t.device.type != self.device.type:
                raise ValueError(f"{name} is on {t.device}, the layer on {self.device}")
        if cfg.max_num_tokens < M:
            raise ValueError(f"{M} tokens exceed MoEConfig.max_num_tokens={cfg.max_num_tokens}; split the batch "
                             "or build the layer with a larger max_num_tokens")
        self._check_working_memory(M)
        if self._dispatch is not None:  # every rank joins the exchange, even with no tokens of its own
            topk_weights, topk_ids = self.route(router_logits) if M else (
                router_logits.new_empty((0, cfg.top_k), dtype=torch.float32),
                router_logits.new_empty((0, cfg.top_k), dtype=torch.int32))
            return self._dispatch(self.experts, hidden_states, topk_weights, topk_ids)
        if M == 0 and self._finalize is None:  # every rank must still join the collective
            return hidden_states.new_empty((0, cfg.hidden_size))
        out = apply_layer(self.experts, hidden_states, router_logits, self.correction_bias)
        return out if self._finalize is None else self._finalize(out)

    def _check_working_memory(self, num_tokens: int) -> None:
        """Refuse a call whose intermediates cannot fit, before any is allocated (an out-of-memory kill
        would take the process with it). Only large calls pay for the memory query."""
        cfg = self.config
        pairs = num_tokens * cfg.top_k
        # fp32 bounds on what any backend keeps at once: GEMM1's gate/up rows, the activation's output,
        # GEMM2's rows, and the output with its accumulator.
        need = 4 * (pairs * (cfg.w13_rows + cfg.intermediate_size_per_partition + cfg.hidden_size)
                    + 2 * num_tokens * cfg.hidden_size)
        if need < _WORKING_MEMORY_CHECK_BYTES or (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return  # small, or inside a CUDA graph capture (checked when the call ran eagerly first)
        have = available_memory_bytes(self.device)
        if need > have:
            raise MemoryError(f"{num_tokens} tokens need about {need / 2**30:.1f} GiB of intermediates in this layer "
                              f"({cfg.describe()}), but {have / 2**30:.1f} GiB is available on {self.device}: "
                              "split the batch")

    def extra_repr(self) -> str:
        parallel = "" if self.parallel_plan.mode is None else f", parallel={self.parallel_plan.mode_name}"
        return (f"{self.config.describe()}, {self.quant.name}, backend={self.plan.backend}/"
                f"{self.plan.experts_cls.name()}{parallel}")
