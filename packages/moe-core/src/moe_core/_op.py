"""`torch.ops.moe_core.fused_moe`: a `FusedMoE` call as one PyTorch custom op.

`torch.compile` cannot trace into a layer's call (plugin lookups, Triton launchers, vendor
libraries, locks), so while compiling, `FusedMoE.forward` calls this op instead, and the traced
graph holds one opaque node per layer: no graph break, and inductor (or `mode="reduce-overhead"`'s
CUDA graphs) runs the layer's own eager path at run time. The op takes the tensors and a string that
names the layer (the way engines register theirs, e.g. vLLM's `direct_register_custom_op` with the
layer's prefix), and finds the layer in a registry of live layers; its fake implementation gives
the output's shape and dtype ([M, K] in the input's dtype) without running anything. Eager calls do
not go through the dispatcher (a few microseconds a call): they run the same implementation
directly.

Under `mode="reduce-overhead"` inductor calls the op only to warm up and record its own CUDA graph
(CUDA graph trees), with every allocation of the warm-up going to that graph's memory pool; a graph of
the layer's own (`moe_core._graphs`: static inputs and outputs kept past the call) must not be made
there, so those calls run the layer plain. Other compiled calls replay the layer's graphs.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from moe_core.layer import FusedMoE

__all__ = ["OP_NAME", "layer_key", "registered_layer"]

OP_NAME = "moe_core::fused_moe"

_layers: dict[str, weakref.ref] = {}
_keys = itertools.count()
_lock = threading.Lock()


def layer_key(layer: FusedMoE) -> str:
    """A new key naming `layer` in the op's calls; the registry forgets it when the layer is collected."""
    with _lock:
        key = f"layer{next(_keys)}"
        _layers[key] = weakref.ref(layer, lambda _, key=key: _layers.pop(key, None))
    return key


def registered_layer(key: str) -> FusedMoE:
    ref = _layers.get(key)
    layer = ref() if ref is not None else None
    if layer is None:
        raise RuntimeError(f"{OP_NAME}: no live FusedMoE is registered as {key!r} (the layer was deleted, or a "
                           "compiled graph from another process names a layer this process never built)")
    return layer


_lib = torch.library.Library("moe_core", "FRAGMENT")
_lib.define("fused_moe(Tensor hidden_states, Tensor router_logits, str layer) -> Tensor")


def _inductor_graph_trees_warming_up(device: torch.device) -> bool:
    """Whether inductor's CUDA graph trees are warming up or recording a graph on this thread and device.
    Their manager is private API: where it is missing this says no, so only reduce-overhead mode would
    fail (on the trees' own pool check), never a plain compiled call."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    get_manager = getattr(trees, "get_manager", None)
    if get_manager is None or device.type != "cuda":
        return False
    manager = get_manager(device.index, create_if_none_exists=False)
    return manager is not None and bool(getattr(manager, "in_warmup", False) or getattr(manager, "in_recording", False))


def _fused_moe(hidden_states: torch.Tensor, router_logits: torch.Tensor, layer: str) -> torch.Tensor:
    graphs = not _inductor_graph_trees_warming_up(hidden_states.device)
    return registered_layer(layer).call_eager(hidden_states, router_logits, graphs=graphs)


def _fused_moe_fake(hidden_states: torch.Tensor, router_logits: torch.Tensor, layer: str) -> torch.Tensor:
    return hidden_states.new_empty(hidden_states.shape)


# One backend-agnostic kernel: the layer itself knows its device and backend.
_lib.impl("fused_moe", _fused_moe, "CompositeExplicitAutograd")
torch.library.register_fake(OP_NAME, _fused_moe_fake, lib=_lib)
