"""Eager calls replayed from CUDA graphs: the host work of a call paid once per input shape.

A layer called eagerly (as `generate` calls it) pays Python, argument binding and one driver launch
per kernel on every call; on an H200 host that is 200-1000 us where its kernels need 25-450 us, so
the GPU waits. `CallGraphs` wraps such a call: the second time the same input signature (shapes,
dtypes, strides, device and stream; the state the call reads unchanged) arrives it captures the call in
a CUDA graph, and from then on a call is one replay of a graph that begins by copying the call's
inputs into its static buffers; the output is returned without a copy. The replayed kernels
and their launch shapes are exactly those of the eager call (the same Python ran during capture),
so outputs are identical.

Outputs: the graph ends by copying the call's result into output buffers of its own, allocated
outside the graph memory pool, and the caller gets an alias of them (a tensor on the same storage). A graph is replayed only while
nothing references its outputs any more (the storage's use count is back to the graph's own); a
caller that keeps outputs gets another graph of the same signature (up to `_RING` per signature,
sharing the static inputs), and past that an eager call. So no output a caller holds is ever
overwritten.

Where it stays out of the way: not on CUDA, while compiling (`torch.compile` traces the layer's
custom op instead), while any stream is capturing (the caller's own graph, or `mode="reduce-overhead"`;
that mode's warm-ups, whose allocations go to its graph pool, the custom op keeps out: `moe_core._op`),
with grad mode on inputs that require grad, above `max_tokens` rows (a prompt length seen once
would cost a capture for nothing; large calls are GPU-bound), and for a signature whose capture
failed (logged once, then served eagerly).

Memory: each captured signature keeps static copies of its inputs and its outputs; intermediates come
from a graph memory pool shared by the graphs alive on a device and stream, so they cost the largest
call's, not the sum (a pool is freed with its last graph; the next capture starts another). Sharing is safe because graphs on one stream replay one after another
and keep nothing in the pool past their end (their outputs live outside it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from moe_core._graph_copy import CopyKernels

__all__ = ["ENV_GRAPHS", "CallGraphs", "graphs_enabled"]

_log = logging.getLogger(__name__)

ENV_GRAPHS = "MOE_CUDA_GRAPHS"
# Signatures seen once are remembered, not captured; this many distinct ones at most (prompt lengths
# vary without bound), then the oldest is forgotten.
_MAX_SEEN = 64
# Graphs per signature at most: a caller holding this many outputs of one signature at once gets eager calls.
_RING = 4


def graphs_enabled(requested: bool | None) -> bool:
    """`requested`, or the environment's MOE_CUDA_GRAPHS (0 or 1, default 1)."""
    if requested is not None:
        return bool(requested)
    flag = os.environ.get(ENV_GRAPHS, "1")
    if flag not in ("0", "1"):
        raise ValueError(f"{ENV_GRAPHS}={flag!r}: accepted values are 0 (eager calls only) and 1 (eager calls "
                         "replayed from CUDA graphs where they repeat, the default)")
    return flag == "1"


# The graphs captured per (device, stream). A memory pool lives only as long as a graph that uses it,
# so a new capture shares the pool of a graph still alive, or starts a new one.
_live_graphs: dict[tuple[int, int], weakref.WeakSet] = {}
_live_lock = threading.Lock()


def _shared_pool(where: tuple[int, int]) -> object | None:
    with _live_lock:
        for graph in _live_graphs.get(where, ()):
            return graph.graph.pool()
    return None


def _register(where: tuple[int, int], graph: _Graph) -> None:
    with _live_lock:
        _live_graphs.setdefault(where, weakref.WeakSet()).add(graph)


# Set while a graphable call runs its function (its first sighting, a capture's warm-up, the capture):
# graphed calls nested in it (a fused block's layer) run plain, since the outer graph holds their work.
_graphing = threading.local()


@contextlib.contextmanager
def _graphing_call():
    outer = getattr(_graphing, "active", False)
    _graphing.active = True
    try:
        yield
    finally:
        _graphing.active = outer


def _use_count(storage: int) -> int:
    return torch._C._storage_Use_Count(storage)


class _CudaGraphApi:
    """The device calls `CallGraphs` makes (CUDA's; the tests put a CPU stand-in in their place).

    A graph's inputs: on a slow host one copy launch costs more than the replay itself (7-9 us on an
    H200 host, against 5 for the graph launch), so where the CUDA driver is reachable the graph's first
    node is one kernel copying every input into the static buffers (`moe_core._graph_copy`), and each
    call points its sources at its own tensors (one driver call, host work only) before the launch."""

    device_type = "cuda"

    def __init__(self) -> None:
        self._copies = CopyKernels()

    @staticmethod
    def capturing() -> bool:
        return torch._C._cuda_isCurrentStreamCapturing()

    @staticmethod
    def where(device: torch.device) -> tuple[int, int]:
        """(device index, current raw stream): the graphs of one may not serve the other."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        return index, torch._C._cuda_getCurrentRawStream(index)

    def copies_in_graph(self, statics: tuple[torch.Tensor, ...], tensors: tuple[torch.Tensor, ...]) -> bool:
        """Whether graphs of this signature copy their inputs themselves (dense inputs of one device)."""
        device = statics[0].device
        return (all(t.is_contiguous() and t.device == device and t.numel() > 0 for t in (*statics, *tensors))
                and self._copies.prepare(device, len(statics)))

    def copy_in_graph(self, statics: tuple[torch.Tensor, ...], tensors: tuple[torch.Tensor, ...]) -> None:
        """While capturing a signature `copies_in_graph` accepted: the node copying `tensors` into `statics`."""
        self._copies.launch(statics, tensors)

    @staticmethod
    def capture(work: Callable[[], None], pool: object | None, where: tuple[int, int],
                keep_graph: bool) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph(keep_graph=keep_graph)
        with torch.cuda.device(where[0]), torch.cuda.graph(graph, pool=pool):  # the inputs' device, not the current one
            work()
        if keep_graph:
            graph.instantiate()
        return graph

    def input_pointer(self, graph: torch.cuda.CUDAGraph,
                      statics: tuple[torch.Tensor, ...]) -> Callable[[tuple[torch.Tensor, ...]], None]:
        """For a graph captured with `keep_graph` whose work began with `copy_in_graph(statics, ...)`: a
        function pointing that copy at a call's tensors."""
        return self._copies.pointer(graph, statics)

    @staticmethod
    def copy_inputs(statics: tuple[torch.Tensor, ...], tensors: tuple[torch.Tensor, ...]) -> None:
        torch._foreach_copy_(list(statics), list(tensors))


_api = _CudaGraphApi()


@dataclass(eq=False)  # identity: held in weak sets
class _Graph:
    graph: torch.cuda.CUDAGraph  # replay() and pool()
    # Points the graph's own input copies at a call's tensors; None: the caller copies them in first.
    point_inputs: Callable[[tuple[torch.Tensor, ...]], None] | None
    outputs: tuple[torch.Tensor, ...]  # written by the graph's last kernels, outside the pool
    storages: tuple[int, ...]  # the outputs' storages, and their use count while only this graph holds them
    idle_counts: tuple[int, ...]
    single: bool  # the call returned one tensor, not a tuple

    def idle(self) -> bool:
        if self.single:
            return _use_count(self.storages[0]) == self.idle_counts[0]
        return all(_use_count(s) == n for s, n in zip(self.storages, self.idle_counts))

    def result(self):
        # New tensors sharing the buffers' storage, so the caller's references are counted by `idle`
        # (`detach`: the cheapest such alias, ~0.25 us against 1.9 for `view(shape)`).
        if self.single:
            return self.outputs[0].detach()
        return tuple(o.detach() for o in self.outputs)


@dataclass
class _Signature:
    inputs: tuple[torch.Tensor, ...]  # static copies every graph of the signature reads
    copies_in_graph: bool  # each graph begins by copying a call's inputs into `inputs` (see _CudaGraphApi)
    graphs: list[_Graph] = field(default_factory=list)
    failed: bool = False


class CallGraphs:
    """`fn(*tensors) -> tensor | tuple of tensors`, replayed from a CUDA graph per input signature
    once that signature repeats (see the module docstring for when it stays eager).

    `rows_of(tensors)` gives a call's row count, compared with `max_tokens`. `fn` must depend on
    nothing but its tensor arguments and the state `version()` names (a value that changes with it:
    a count of weight loads, a forced launch configuration, parameter addresses); a call under a new
    version drops every graph captured under the old one (and the memory its buffers held).
    """

    def __init__(self, fn: Callable[..., object], name: str, max_tokens: int,
                 rows_of: Callable[[tuple[torch.Tensor, ...]], int], version: Callable[[], object]) -> None:
        self._fn = fn
        self._version = version
        self._name = name
        self._max_tokens = max_tokens
        self._rows_of = rows_of
        self._signatures: dict[tuple, _Signature] = {}
        self._seen: dict[tuple, None] = {}
        self._captured_version: object = None  # the version every graph in _signatures was captured under
        # Taken for a whole graphed call: the static inputs are shared by the signature's graphs.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Graphs captured."""
        return sum(len(sig.graphs) for sig in self._signatures.values())

    def __call__(self, *tensors: torch.Tensor):
        first = tensors[0]
        if (getattr(_graphing, "active", False) or first.device.type != _api.device_type
                or torch.compiler.is_compiling()
                or not 0 < self._rows_of(tensors) <= self._max_tokens or _api.capturing()
                or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))):
            return self._fn(*tensors)
        where = _api.where(first.device)
        key = (where, *[(t.shape, t.stride(), t.dtype, t.device) for t in tensors])
        version = self._version()
        with self._lock:
            if version != self._captured_version:  # the graphs read what the call no longer reads
                self._signatures.clear()
                self._seen.clear()
                self._captured_version = version
            sig = self._signatures.get(key)
            if sig is None:
                if key not in self._seen:  # first sighting: run it eagerly, remember it
                    self._seen[key] = None
                    if len(self._seen) > _MAX_SEEN:
                        del self._seen[next(iter(self._seen))]
                    with _graphing_call():
                        return self._fn(*tensors)
                # Made outside inference mode, so calls outside it (after a first one inside) can copy into them.
                with torch.inference_mode(False):
                    statics = tuple(t.clone() for t in tensors)
                sig = self._signatures[key] = _Signature(statics, _api.copies_in_graph(statics, tensors))
            if sig.failed:
                return self._fn(*tensors)
            for graph in sig.graphs:
                if graph.idle():
                    break
            else:
                graph = None
            if graph is None:
                if len(sig.graphs) >= _RING:  # the caller holds every graph's outputs
                    return self._fn(*tensors)
                graph = self._capture(sig, tensors, where)
                if graph is None:
                    return self._fn(*tensors)
            if graph.point_inputs is not None:
                graph.point_inputs(tensors)
            else:
                _api.copy_inputs(sig.inputs, tensors)
            graph.graph.replay()
            return graph.result()

    def _capture(self, sig: _Signature, tensors: tuple[torch.Tensor, ...], where: tuple[int, int]) -> _Graph | None:
        try:
            with _graphing_call():
                out = self._fn(*sig.inputs)  # its shapes, to allocate the output buffers outside the pool
                single = isinstance(out, torch.Tensor)
                outs = (out,) if single else tuple(out)
                if not all(isinstance(o, torch.Tensor) for o in outs):
                    raise TypeError(f"a graphed call must return tensors, got {[type(o).__name__ for o in outs]}")
                with torch.inference_mode(False):  # returned to callers in either mode, as the statics
                    buffers = tuple(torch.empty_like(o) for o in outs)

                def work() -> None:
                    if sig.copies_in_graph:  # the copy's sources are re-pointed at every call's tensors
                        _api.copy_in_graph(sig.inputs, tensors)
                    result = self._fn(*sig.inputs)
                    for buffer, o in zip(buffers, (result,) if single else result):
                        buffer.copy_(o)

                graph = _api.capture(work, _shared_pool(where), where, keep_graph=sig.copies_in_graph)
                point_inputs = _api.input_pointer(graph, sig.inputs) if sig.copies_in_graph else None
        except Exception as exc:  # a backend that cannot be captured (host sync, allocation): serve eagerly
            sig.failed = True
            _log.warning("%s: calls of shapes %s run eagerly: capturing them in a CUDA graph failed (%s: %s)",
                         self._name, [list(t.shape) for t in tensors], type(exc).__name__, exc)
            return None
        storages = tuple(b.untyped_storage()._cdata for b in buffers)
        captured = _Graph(graph, point_inputs, buffers, storages, tuple(_use_count(s) for s in storages), single)
        sig.graphs.append(captured)
        _register(where, captured)
        return captured
