"""Eager calls replayed from CUDA graphs: the host work of a call paid once per input shape.

A layer called eagerly (as `generate` calls it) pays Python, argument binding and one driver launch
per kernel on every call; on an H200 host that is 200-1000 us where its kernels need 25-450 us, so
the GPU waits. `CallGraphs` wraps such a call: the second time the same input signature (shapes,
dtypes, strides, device, stream) arrives it captures the call in a CUDA graph, and from then on a
call is: copy the inputs into the graph's static buffers, replay, copy the outputs out. The
replayed kernels and their launch shapes are exactly those of the eager call (the same Python ran
during capture), so outputs are identical.

Where it stays out of the way: not on CUDA, while compiling (`torch.compile` traces the layer's
custom op instead), while any stream is capturing (the caller's own graph, or `mode="reduce-overhead"`),
with grad mode on inputs that require grad, above `max_tokens` rows (a prompt length seen once
would cost a capture for nothing; large calls are GPU-bound), and for a signature whose capture
failed (logged once, then served eagerly).

Memory: each captured signature keeps static copies of its inputs and outputs; intermediates come
from one graph memory pool per device and stream, shared by every graph on it, so they cost the
largest call's, not the sum. Sharing is safe because replays on one stream run one after another
and each graph's outputs are copied out before the next replay (under one lock per pool: threads
sharing a stream cannot interleave a replay and its copy-out).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["ENV_GRAPHS", "CallGraphs", "graphs_enabled"]

_log = logging.getLogger(__name__)

ENV_GRAPHS = "MOE_CUDA_GRAPHS"
# Signatures seen once are remembered, not captured; this many distinct ones at most (prompt lengths
# vary without bound), then the oldest is forgotten.
_MAX_SEEN = 64


def graphs_enabled(requested: bool | None) -> bool:
    """`requested`, or the environment's MOE_CUDA_GRAPHS (0 or 1, default 1)."""
    if requested is not None:
        return bool(requested)
    flag = os.environ.get(ENV_GRAPHS, "1")
    if flag not in ("0", "1"):
        raise ValueError(f"{ENV_GRAPHS}={flag!r}: accepted values are 0 (eager calls only) and 1 (eager calls "
                         "replayed from CUDA graphs where they repeat, the default)")
    return flag == "1"


@dataclass
class _Pool:
    """One graph memory pool (per device and stream) and the lock its replays take."""

    handle: object
    lock: threading.Lock = field(default_factory=threading.Lock)


_pools: dict[tuple[int, int], _Pool] = {}
_pools_lock = threading.Lock()


def _pool(device: torch.device, stream: torch.cuda.Stream) -> _Pool:
    key = (device.index if device.index is not None else torch.cuda.current_device(), stream.cuda_stream)
    pool = _pools.get(key)
    if pool is None:
        with _pools_lock:
            pool = _pools.setdefault(key, _Pool(torch.cuda.graph_pool_handle()))
    return pool


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # static copies the graph reads
    outputs: tuple[torch.Tensor, ...]  # what the graph writes (in its pool)
    single: bool  # the call returned one tensor, not a tuple
    pool: _Pool


class CallGraphs:
    """`fn(*tensors) -> tensor | tuple of tensors`, replayed from a CUDA graph per input signature
    once that signature repeats (see the module docstring for when it stays eager).

    `rows_of(tensors)` gives a call's row count, compared with `max_tokens`. `fn` must depend on
    nothing but its tensor arguments and the state `version()` names (a hashable value that changes
    with it: the loaded weights, a forced launch configuration); a graph captured under another
    version is never replayed. `clear()` drops every graph (and the memory its buffers hold).
    """

    def __init__(self, fn: Callable[..., object], name: str, max_tokens: int,
                 rows_of: Callable[[tuple[torch.Tensor, ...]], int], version: Callable[[], object]) -> None:
        self._fn = fn
        self._version = version
        self._name = name
        self._max_tokens = max_tokens
        self._rows_of = rows_of
        self._graphs: dict[tuple, _Graph | None] = {}  # None: capture failed, serve eagerly
        self._seen: dict[tuple, None] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._graphs.clear()
            self._seen.clear()

    def __len__(self) -> int:
        return sum(g is not None for g in self._graphs.values())

    def __call__(self, *tensors: torch.Tensor):
        first = tensors[0]
        if (first.device.type != "cuda" or torch.compiler.is_compiling()
                or not 0 < self._rows_of(tensors) <= self._max_tokens or torch.cuda.is_current_stream_capturing()
                or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))):
            return self._fn(*tensors)
        stream = torch.cuda.current_stream(first.device)
        key = (stream.cuda_stream, self._version(), *((t.shape, t.stride(), t.dtype, t.device) for t in tensors))
        graph = self._graphs.get(key, False)
        if graph is None:
            return self._fn(*tensors)
        if graph is False:
            with self._lock:
                if key not in self._seen:  # first sighting: run it eagerly, remember it
                    self._seen[key] = None
                    if len(self._seen) > _MAX_SEEN:
                        del self._seen[next(iter(self._seen))]
                    return self._fn(*tensors)
                graph = self._graphs[key] = self._capture(tensors, stream)
            if graph is None:
                return self._fn(*tensors)
        with graph.pool.lock:
            for static, t in zip(graph.inputs, tensors):
                static.copy_(t)
            graph.graph.replay()
            outs = tuple(o.clone() for o in graph.outputs)
        return outs[0] if graph.single else outs

    def _capture(self, tensors: tuple[torch.Tensor, ...], stream: torch.cuda.Stream) -> _Graph | None:
        pool = _pool(tensors[0].device, stream)
        statics = tuple(t.clone() for t in tensors)
        try:
            with pool.lock:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool.handle):
                    out = self._fn(*statics)
        except Exception as exc:  # a backend that cannot be captured (host sync, allocation): serve eagerly
            _log.warning("%s: calls of shapes %s run eagerly: capturing them in a CUDA graph failed (%s: %s)",
                         self._name, [list(t.shape) for t in tensors], type(exc).__name__, exc)
            return None
        single = isinstance(out, torch.Tensor)
        outs = (out,) if single else tuple(out)
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise TypeError(f"{self._name}: a graphed call must return tensors, got {[type(o).__name__ for o in outs]}")
        return _Graph(graph, statics, outs, single, pool)

