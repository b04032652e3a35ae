"""Eager calls replayed from CUDA graphs: the host work of a call paid once per input shape.

A layer called eagerly (as `generate` calls it) pays Python, argument binding and one driver launch
per kernel on every call; on an H200 host that is 200-1000 us where its kernels need 25-450 us, so
the GPU waits. `CallGraphs` wraps such a call: the second time the same input signature (shapes,
dtypes, strides, device and stream; the state the call reads unchanged) arrives it captures the call in
a CUDA graph, and from then on a call is a copy of the inputs into the graph's static buffers (one
`cudaMemcpyAsync` each) and one replay; the output is returned without a copy. The replayed kernels
and their launch shapes are exactly those of the eager call (the same Python ran during capture),
so outputs are identical.

Outputs: the graph ends by copying the call's result into output buffers of its own, allocated
outside the graph memory pool, and the caller gets a view of them. A graph is replayed only while
nothing references its outputs any more (the storage's use count is back to the graph's own); a
caller that keeps outputs gets another graph of the same signature (up to `_RING` per signature,
sharing the static inputs), and past that an eager call. So no output a caller holds is ever
overwritten.

Where it stays out of the way: not on CUDA, while compiling (`torch.compile` traces the layer's
custom op instead), while any stream is capturing (the caller's own graph, or `mode="reduce-overhead"`),
with grad mode on inputs that require grad, above `max_tokens` rows (a prompt length seen once
would cost a capture for nothing; large calls are GPU-bound), and for a signature whose capture
failed (logged once, then served eagerly).

Memory: each captured signature keeps static copies of its inputs and its outputs; intermediates come
from a graph memory pool shared by the graphs alive on a device and stream, so they cost the largest
call's, not the sum (a pool is freed with its last graph; the next capture starts another). Sharing is safe because graphs on one stream replay one after another
and keep nothing in the pool past their end (their outputs live outside it).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

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


def _use_count(storage: int) -> int:
    return torch._C._storage_Use_Count(storage)


def _load_cudart() -> ctypes.CDLL | None:
    """The CUDA runtime library this process already loaded (torch's), or None where none is found."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        return None
    if len(paths) != 1:
        return None
    lib = ctypes.CDLL(paths.pop())
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudaMemcpyAsync.restype = ctypes.c_int
    lib.cudaGetErrorString.argtypes = [ctypes.c_int]
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    return lib


_MEMCPY_DEVICE_TO_DEVICE = 3  # cudaMemcpyKind


class _CudaGraphApi:
    """The device calls `CallGraphs` makes (CUDA's; the tests put a CPU stand-in in their place)."""

    device_type = "cuda"

    def __init__(self) -> None:
        self._cudart: ctypes.CDLL | bool | None = False  # False: not looked up yet

    @staticmethod
    def capturing() -> bool:
        return torch._C._cuda_isCurrentStreamCapturing()

    @staticmethod
    def where(device: torch.device) -> tuple[int, int]:
        """(device index, current raw stream): the graphs of one may not serve the other."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        return index, torch._C._cuda_getCurrentRawStream(index)

    @staticmethod
    def capture(work: Callable[[], None], pool: object | None, where: tuple[int, int]) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(where[0]), torch.cuda.graph(graph, pool=pool):  # the inputs' device, not the current one
            work()
        return graph

    def input_copier(self, statics: tuple[torch.Tensor, ...], stream: int) -> Callable[[tuple[torch.Tensor, ...]], None]:
        """A function copying a call's inputs (of the signature `statics` were cloned from) into `statics`
        on `stream`. Dense inputs are copied by one `cudaMemcpyAsync` each: on a slow host that costs a
        few microseconds where `copy_` (dispatch, TensorIterator) costs 10; others by one `_foreach_copy_`."""
        if self._cudart is False:
            self._cudart = _load_cudart()
        cudart = self._cudart
        targets = list(statics)

        def foreach_copy(tensors: tuple[torch.Tensor, ...]) -> None:
            torch._foreach_copy_(targets, list(tensors))

        device = statics[0].device
        if cudart is None or not all(t.is_contiguous() and t.device == device for t in statics):
            return foreach_copy
        spans = tuple((t.data_ptr(), t.numel() * t.element_size()) for t in statics)
        memcpy = cudart.cudaMemcpyAsync

        def copy(tensors: tuple[torch.Tensor, ...]) -> None:
            if torch._C._cuda_getDevice() != device.index:  # the runtime call needs the stream's device current
                return foreach_copy(tensors)
            for (dst, nbytes), src in zip(spans, tensors):
                if nbytes:
                    err = memcpy(dst, src.data_ptr(), nbytes, _MEMCPY_DEVICE_TO_DEVICE, stream)
                    if err:
                        raise RuntimeError(f"cudaMemcpyAsync of a graphed call's input failed: "
                                           f"{cudart.cudaGetErrorString(err).decode()}")
        return copy

    @staticmethod
    def replay(graph: torch.cuda.CUDAGraph) -> None:
        torch._C._CUDAGraph.replay(graph)  # the method itself: no Python frame of the subclass's wrapper


_api = _CudaGraphApi()


@dataclass(eq=False)  # identity: held in weak sets
class _Graph:
    graph: torch.cuda.CUDAGraph  # replay() and pool()
    outputs: tuple[torch.Tensor, ...]  # written by the graph's last kernels, outside the pool
    storages: tuple[int, ...]  # the outputs' storages, and their use count while only this graph holds them
    idle_counts: tuple[int, ...]
    single: bool  # the call returned one tensor, not a tuple

    def idle(self) -> bool:
        return all(_use_count(s) == n for s, n in zip(self.storages, self.idle_counts))

    def result(self):
        views = tuple(o.view(o.shape) for o in self.outputs)  # a view: the caller's reference is counted
        return views[0] if self.single else views


@dataclass
class _Signature:
    inputs: tuple[torch.Tensor, ...]  # static copies every graph of the signature reads
    copy_inputs: Callable[[tuple[torch.Tensor, ...]], None]  # a call's inputs into `inputs`, on the signature's stream
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
        if (first.device.type != _api.device_type or torch.compiler.is_compiling()
                or not 0 < self._rows_of(tensors) <= self._max_tokens or _api.capturing()
                or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))):
            return self._fn(*tensors)
        where = _api.where(first.device)
        key = (where, *((t.shape, t.stride(), t.dtype, t.device) for t in tensors))
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
                    return self._fn(*tensors)
                statics = tuple(t.clone() for t in tensors)  # same strides: the key fixes them
                sig = self._signatures[key] = _Signature(statics, _api.input_copier(statics, where[1]))
            if sig.failed:
                return self._fn(*tensors)
            graph = next((g for g in sig.graphs if g.idle()), None)
            if graph is None:
                if len(sig.graphs) >= _RING:  # the caller holds every graph's outputs
                    return self._fn(*tensors)
                graph = self._capture(sig, tensors, where)
                if graph is None:
                    return self._fn(*tensors)
            sig.copy_inputs(tensors)
            _api.replay(graph.graph)
            return graph.result()

    def _capture(self, sig: _Signature, tensors: tuple[torch.Tensor, ...], where: tuple[int, int]) -> _Graph | None:
        try:
            out = self._fn(*sig.inputs)  # its shapes, to allocate the output buffers outside the pool
            single = isinstance(out, torch.Tensor)
            outs = (out,) if single else tuple(out)
            if not all(isinstance(o, torch.Tensor) for o in outs):
                raise TypeError(f"a graphed call must return tensors, got {[type(o).__name__ for o in outs]}")
            buffers = tuple(torch.empty_like(o) for o in outs)

            def work() -> None:
                result = self._fn(*sig.inputs)
                for buffer, o in zip(buffers, (result,) if single else result):
                    buffer.copy_(o)

            graph = _api.capture(work, _shared_pool(where), where)
        except Exception as exc:  # a backend that cannot be captured (host sync, allocation): serve eagerly
            sig.failed = True
            _log.warning("%s: calls of shapes %s run eagerly: capturing them in a CUDA graph failed (%s: %s)",
                         self._name, [list(t.shape) for t in tensors], type(exc).__name__, exc)
            return None
        storages = tuple(b.untyped_storage()._cdata for b in buffers)
        captured = _Graph(graph, buffers, storages, tuple(_use_count(s) for s in storages), single)
        sig.graphs.append(captured)
        _register(where, captured)
        return captured
