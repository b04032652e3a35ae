"""`FusedMoE`: one MoE layer that owns its plan and its own kernel instance."""

from __future__ import annotations

import logging
import threading

import torch

from moe_core import _op
from moe_core._graphs import CallGraphs, graphs_enabled
from moe_core._progress import logged_step
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
from moe_core.weights.processor import PackedWeights

__all__ = ["FusedMoE"]

_log = logging.getLogger(__name__)

# Calls whose intermediates stay below this never query the device's free memory.
_WORKING_MEMORY_CHECK_BYTES = 256 << 20
# Most tokens an eager call is replayed from a CUDA graph for (`moe_core._graphs`): past this the
# kernels outlast the host work, and each distinct prompt length would hold static buffers.
GRAPH_MAX_TOKENS = 2048


class FusedMoE(torch.nn.Module):
    """forward(hidden_states [M, K], router_logits [M, E]) -> [M, K] in `config.dtype`.

    The backend is chosen at construction (see `plan.explain()`); weights come later through
    `load_weights`, in canonical form, from any reader in `moe_core.weights`. Loading again replaces
    the kernel's tensors, so the same weights always give the same output. `num_tokens`, the token
    count the layer is mostly called with, picks the bucket of a measured ranking
    (`moe_core.rankings`) where one covers the device; calls of any size up to
    `config.max_num_tokens` are still served.

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

    Inference only: no backend computes gradients, so a call with grad mode enabled on inputs that
    require grad raises RuntimeError (instead of returning an output that silently has none); call
    it under `torch.no_grad()` or `torch.inference_mode()`.

    Calls: eager calls on a CUDA device whose shapes repeat (decode steps) are replayed from a CUDA
    graph of the same call (`moe_core._graphs`; `cuda_graphs=False` or MOE_CUDA_GRAPHS=0 turns that
    off; single-device layers of at most GRAPH_MAX_TOKENS tokens). Under `torch.compile` the layer
    is one custom op, `torch.ops.moe_core.fused_moe` (`moe_core._op`), so a model compiles with
    `fullgraph=True`. Loading weights waits for calls in flight and is seen whole by the next call.
    """

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig | None = None, device: object = None,
                 prefer: str | None = None, ep_group: object = None, parallel: object = None,
                 num_tokens: int | None = None, cuda_graphs: bool | None = None) -> None:
        super().__init__()
        if prefer is not None and not isinstance(prefer, str):
            raise TypeError(f"FusedMoE: prefer must be a backend name (str) or None, got {prefer!r}")
        self.config = config
        self.plan: Plan = select(config, quant, device, prefer, num_tokens=num_tokens)
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
        self._device_type = self.device.type
        # Kernels launch on the current device (Triton's rule), which need not be the layer's: a model
        # spread over GPUs (accelerate's device_map) calls its layers without switching devices.
        self._cuda_index = (self.device.index if self.device.index is not None else torch.cuda.current_device()
                            ) if self._device_type == "cuda" else None
        # The device inputs must be on (where a device type has no index, the full check decides).
        self._input_device = torch.device("cuda", self._cuda_index) if self._cuda_index is not None else self.device
        # Collectives stay eager: every rank would have to capture together.
        self._graphed = graphs_enabled(cuda_graphs) and mode is None and self._device_type == "cuda"
        self._loads = 0
        self._init_call_state()

    def _init_call_state(self) -> None:
        """What calls share and a copy of the layer must not: its op key, its lock, its graphs."""
        self._op_key = _op.layer_key(self)
        # Held by a call's host work and by load_weights: a reload never mixes with a call in flight.
        self._state_lock = threading.Lock()
        self._graphs = CallGraphs(self._run, f"FusedMoE({self.config.describe()})",
                                  min(GRAPH_MAX_TOKENS, self.config.max_num_tokens),
                                  lambda tensors: tensors[0].shape[0], self._graph_version) if self._graphed else None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_op_key", "_state_lock", "_graphs"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._init_call_state()

    @property
    def device(self) -> torch.device:
        return self.plan.device.torch_device

    def load_weights(self, weights: ExpertWeights, correction_bias: torch.Tensor | None = None) -> None:
        """Validate `weights` against the layer (shapes, dtypes, finite values) and convert them to the
        kernel's layout; weights or a correction bias these checks refuse leave the layer as it was."""
        if not isinstance(weights, ExpertWeights):
            raise TypeError(f"load_weights takes moe_core.weights.ExpertWeights (ExpertWeights.random, "
                            f"ExpertWeights.from_float or a reader in moe_core.weights), got {type(weights).__name__}")
        routing = self.config.routing
        bias = None
        if routing.has_correction_bias:
            E = self.config.num_experts
            if not isinstance(correction_bias, torch.Tensor) or tuple(correction_bias.shape) != (E,):
                got = (list(correction_bias.shape) if isinstance(correction_bias, torch.Tensor)
                       else None if correction_bias is None else type(correction_bias).__name__)
                raise ValueError(f"this layer's routing uses a correction bias: pass correction_bias of shape [{E}], "
                                 f"got {got}")
            bias = correction_bias.detach().to(self.device, torch.float32).clone()
            bad = (~torch.isfinite(bias)).nonzero().flatten().tolist()
            if bad:
                raise ValueError(f"correction_bias holds NaN or Inf for experts {_ids_text(bad)}: a selection bias "
                                 "must be finite")
        elif correction_bias is not None:
            raise ValueError("correction_bias was given but the layer's routing has no correction bias")
        local = self.config.num_local_experts
        if (local != self.config.num_experts and isinstance(weights.w13, torch.Tensor)
                and weights.num_experts == self.config.num_experts):
            raise ValueError(f"this layer holds {local} of the {self.config.num_experts} experts (expert parallelism, "
                             f"rank {self.config.parallel.ep_rank}), but all {weights.num_experts} were given: load "
                             "moe_core.parallel.local_weights(weights, config)")
        weights.validate(self.config, self.quant)
        _refuse_unusable_values(weights)
        with self._state_lock, logged_step(
                _log, f"converting {self.config.num_local_experts} experts' {self.quant.weight} weights "
                      f"to {self.plan.weight_layout} for {self.plan.experts_cls.name()}"):
            self.experts.load_weights(weights)
            self.correction_bias = bias
            self._loads += 1  # graphs of this layer (and of blocks around it) read the old weights' addresses

    # `state_dict()` carries the loaded experts in this layer's kernel layout (under `<prefix>_extra_state`),
    # so a fused model's state dict round-trips through torch.save into a layer of the same plan, and
    # loading it anywhere else fails loudly instead of leaving experts out.
    def get_extra_state(self) -> dict:
        packed = self.experts.packed_state()
        return {"layer": self._state_identity(), "correction_bias": self.correction_bias,
                "tensors": None if packed is None else dict(packed.tensors)}

    def set_extra_state(self, state: object) -> None:
        if not isinstance(state, dict) or set(state) != {"layer", "tensors", "correction_bias"}:
            raise ValueError("FusedMoE.set_extra_state: expected the dict a FusedMoE's state_dict() holds")
        if state["layer"] != self._state_identity():
            saved, here = state["layer"], self._state_identity()
            raise ValueError(f"this FusedMoE state was saved from {saved}; this layer is {here}: a state dict "
                             "holds the experts in its kernel's layout, so it loads into a layer of the same "
                             "configuration, scheme and kernel only (load other weights with load_weights)")
        if state["tensors"] is None:
            raise ValueError(f"this FusedMoE state ({state['layer']}) was saved before any weights were loaded")
        device = self.device
        tensors = {name: t.to(device) for name, t in state["tensors"].items()}
        bias = state["correction_bias"]
        with self._state_lock:
            self.experts.restore_packed(PackedWeights(self.plan.weight_layout, tensors))
            self.correction_bias = None if bias is None else bias.to(device)
            self._loads += 1

    def _state_identity(self) -> str:
        return (f"{self.config.describe()}, {self.quant.name}, {self.plan.experts_cls.name()} "
                f"({self.plan.weight_layout})")

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        E = self.config.num_experts
        if router_logits.dim() != 2 or router_logits.shape[1] != E:  # fewer columns would route among fewer experts
            raise ValueError(f"router_logits must be [M, {E}] (tokens, global experts), got {list(router_logits.shape)}")
        return self.plan.router(router_logits, self.config.routing, self.config.top_k, self.correction_bias)

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        self._check_inputs(hidden_states, router_logits)  # while compiling: once, at trace time
        if torch.compiler.is_compiling():
            return torch.ops.moe_core.fused_moe(hidden_states, router_logits, self._op_key)
        return self.call_eager(hidden_states, router_logits)

    def call_eager(self, hidden_states: torch.Tensor, router_logits: torch.Tensor,
                   graphs: bool = True) -> torch.Tensor:
        """One call without the input checks of `forward` (the custom op's implementation); `graphs=False`
        runs it plain, never from or into a graph of the layer's own."""
        with self._state_lock:
            if self._cuda_index is not None and torch._C._cuda_getDevice() != self._cuda_index:
                with torch.cuda.device(self._cuda_index):
                    return self._call(hidden_states, router_logits, graphs)
            return self._call(hidden_states, router_logits, graphs)

    def _call(self, hidden_states: torch.Tensor, router_logits: torch.Tensor, graphs: bool) -> torch.Tensor:
        if graphs and self._graphs is not None:
            return self._graphs(hidden_states, router_logits)
        return self._run(hidden_states, router_logits)

    def _graph_version(self) -> object:
        """What a graphed call depends on beyond its inputs: the load and a forced launch shape."""
        return self._loads, getattr(self.experts, "config_override", None)

    def _check_inputs(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> None:
        cfg = self.config
        # The accepted case in one expression (a call's host time is the budget here); anything else
        # goes through the checks below, which name what is wrong.
        try:
            h, g = hidden_states.shape, router_logits.shape
            if (len(h) == 2 and len(g) == 2 and h[1] == cfg.hidden_size and g[0] == h[0] and g[1] == cfg.num_experts
                    and h[0] <= cfg.max_num_tokens and hidden_states.dtype == cfg.dtype
                    and router_logits.dtype.is_floating_point and hidden_states.device == self._input_device
                    and router_logits.device == self._input_device
                    and not (torch.is_grad_enabled() and (hidden_states.requires_grad or router_logits.requires_grad))):
                return
        except AttributeError:  # not tensors: said below
            pass
        for name, t in (("hidden_states", hidden_states), ("router_logits", router_logits)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        _refuse_autograd(hidden_states, router_logits)
        if hidden_states.dim() != 2 or hidden_states.shape[1] != cfg.hidden_size:
            raise ValueError(f"hidden_states must be [M, {cfg.hidden_size}], got {list(hidden_states.shape)}")
        M = hidden_states.shape[0]
        if router_logits.dim() != 2 or router_logits.shape[0] != M or router_logits.shape[1] != cfg.num_experts:
            raise ValueError(f"router_logits must be [{M}, {cfg.num_experts}] (tokens, global experts), "
                             f"got {list(router_logits.shape)}")
        if hidden_states.dtype != cfg.dtype:
            raise ValueError(f"hidden_states dtype {hidden_states.dtype} differs from the layer dtype {cfg.dtype}")
        if not router_logits.dtype.is_floating_point:
            raise ValueError(f"router_logits must be floating point, got {router_logits.dtype}")
        for name, t in (("hidden_states", hidden_states), ("router_logits", router_logits)):
            device = t.device
            if device.type != self._device_type or (self._cuda_index is not None and device.index != self._cuda_index):
                raise ValueError(f"{name} is on {device}, the layer on {self._input_device}")
        if cfg.max_num_tokens < M:
            raise ValueError(f"{M} tokens exceed MoEConfig.max_num_tokens={cfg.max_num_tokens}; split the batch "
                             "or build the layer with a larger max_num_tokens")

    def _run(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        M = hidden_states.shape[0]
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
        if need < _WORKING_MEMORY_CHECK_BYTES or (self._device_type == "cuda" and torch.cuda.is_current_stream_capturing()):
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


def _refuse_unusable_values(weights: ExpertWeights) -> None:
    """Weights without data (meta tensors) or with NaN/Inf values would make every output they touch
    garbage, silently: refuse them, naming the tensor and the experts (checked per expert, so the
    check allocates no full-size temporary; one host sync per tensor, at load only)."""
    e8m0_scales = weights.key.scale is not None and weights.key.scale.dtype == "e8m0"
    for name, t in weights.tensors().items():
        if t.is_meta:
            raise ValueError(f"ExpertWeights.{name} is a meta tensor and holds no values; load real tensors")
        if t.dtype.is_floating_point:
            # fp16 holds every fp8 value, Inf and NaN included (CUDA has no isfinite for fp8)
            wide = torch.float16 if t.element_size() == 1 else t.dtype
            bad = torch.stack([~torch.isfinite(t[e].to(wide)).all() for e in range(t.shape[0])])
        elif e8m0_scales and name.endswith("_scale"):
            bad = (t == 0xFF).flatten(1).any(1)  # e8m0's NaN encoding
        else:
            continue
        experts = bad.nonzero().flatten().tolist()
        if experts:
            raise ValueError(f"ExpertWeights.{name} holds NaN or Inf values in experts {_ids_text(experts)}; every "
                             "weight, scale and bias must be finite (check the checkpoint or the quantization that "
                             "produced them)")


def _ids_text(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:8])) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")


def _refuse_autograd(hidden_states: torch.Tensor, router_logits: torch.Tensor) -> None:
    """FusedMoE has no backward: refuse a call that autograd would record (no device sync needed)."""
    if not torch.is_grad_enabled():
        return
    needing = [name for name, t in (("hidden_states", hidden_states), ("router_logits", router_logits))
               if t.requires_grad]
    if needing:
        raise RuntimeError(
            f"FusedMoE is inference-only and computes no gradients, but {' and '.join(needing)} "
            f"require{'s' if len(needing) == 1 else ''} grad with grad mode enabled (training, or a call outside "
            "torch.no_grad()); its output would silently carry no gradient. Call the layer (or the model fused "
            "by moe_core.integrations.transformers.fuse) under torch.no_grad() or torch.inference_mode()")
