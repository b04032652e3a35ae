"""Host cost of one Triton launch on this machine: the JIT entry (`kernel[grid](...)`) against a launch
through the compiled kernel's handle (what `moe_triton._common.launch` does after the first call), and a
torch launch for scale; then what a graphed layer call pays besides Python: the replay of a CUDA graph
and the copy of a one-token call's two inputs into the graph's buffers (`_foreach_copy_` before the replay,
against re-pointing the graph's own copy kernel, as `moe_core._graphs` does, for sources that move and
for sources where they were, and against re-pointing one memcpy node per input); and that re-point plus replay for a graph whose previous launch
is still queued or running on the GPU against one whose previous launch has finished (bench_host_path
drains the stream every 8 calls, so where kernels take longer than the host work most of its calls are
of the first kind); and the first such call after a drain, by what came before the drain: the GPU busy
for T ms while the host waited in `synchronize`, or the GPU idle while the host spun or slept for T ms
(bench_host_path's first place after a drain costs up to ~10x its later places in cells whose calls
run for milliseconds: this tells the driver's part from the host's).
Prints microseconds per launch (median of 20 rounds of 200 launches; per call: median of 400 calls)."""

from __future__ import annotations

import ctypes
import statistics
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _copy(src, dst, n, a, b, c, d, e, f, g, h, BLOCK: tl.constexpr, FLAG: tl.constexpr, OTHER: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def per_launch_us(fn, rounds: int = 20, n: int = 200) -> float:
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    torch.cuda.synchronize()
    return statistics.median(samples) * 1e6


def per_call_us(fn, drain_every: int, calls: int = 400, before=None) -> float:
    """Median host time of one `fn()`, the stream drained before every `drain_every`-th call (and,
    given `before`, that run between two drains first)."""
    samples = []
    for i in range(calls):
        if i % drain_every == 0:
            torch.cuda.synchronize()
            if before is not None:
                before()
                torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(samples) * 1e6


def main() -> None:
    x = torch.randn(4096, device="cuda")
    y = torch.empty_like(x)
    args = (x, y, 4096, 1, 2, 3, 4, 5, 6, 7, 8)
    kernel = _copy[(4,)](*args, BLOCK=1024, FLAG=True, OTHER=3)
    stream = torch.cuda.current_stream().cuda_stream
    full = (*args, 1024, True, 3)
    jit = per_launch_us(lambda: _copy[(4,)](*args, BLOCK=1024, FLAG=True, OTHER=3))
    handle = per_launch_us(lambda: kernel.run(4, 1, 1, stream, kernel.function, kernel.packed_metadata, None, None,
                                              None, *full))
    raw_stream = per_launch_us(lambda: kernel.run(4, 1, 1, torch._C._cuda_getCurrentRawStream(0), kernel.function,
                                                  kernel.packed_metadata, None, None, None, *full))
    torch_op = per_launch_us(lambda: y.copy_(x))
    empty = per_launch_us(lambda: torch.empty(64, 2048, device="cuda", dtype=torch.bfloat16))
    torch.testing.assert_close(y, x)
    print(f"launch us: jit {jit:.2f}  handle {handle:.2f}  handle+stream query {raw_stream:.2f}  "
          f"torch copy_ {torch_op:.2f}  torch.empty {empty:.2f}")

    from moe_core import _graphs

    # A graphed call's two inputs at one token (qwen3-30b-a3b), copied in before the replay or by the graph.
    inputs = (torch.randn(1, 2048, device="cuda").bfloat16(), torch.randn(1, 128, device="cuda"))
    statics = tuple(t.clone() for t in inputs)
    plain = torch.cuda.CUDAGraph()
    with torch.cuda.graph(plain):
        statics[0].mul_(2)
    api = _graphs._api
    assert api.copies_in_graph(statics, inputs)

    def copy_then_work() -> None:
        api.copy_in_graph(statics, inputs)
        statics[0].mul_(2)

    pointed = api.capture(copy_then_work, None, (0, 0), keep_graph=True)
    point = api.input_pointer(pointed, statics)
    foreach = per_launch_us(lambda: api.copy_inputs(statics, inputs))
    replay = per_launch_us(plain.replay)
    # Sources that move on every call (two input sets in turn), and sources where they were (the
    # re-pointing skips the driver then).
    sets, calls = (inputs, tuple(t.clone() for t in inputs)), [0]

    def next_set() -> tuple[torch.Tensor, ...]:
        calls[0] += 1
        return sets[calls[0] % 2]

    moving = per_launch_us(lambda: point(next_set()))
    unmoved = per_launch_us(lambda: point(inputs))
    fresh = tuple(t.clone() for t in inputs)
    point(fresh)
    pointed.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(statics[0], fresh[0] * 2, rtol=0, atol=0)
    torch.testing.assert_close(statics[1], fresh[1], rtol=0, atol=0)
    memcpy_nodes = memcpy_node_repoint_us(statics, sets)
    print(f"graphed call us: inputs copied in by _foreach_copy_ {foreach:.2f}  replay {replay:.2f}  "
          f"the graph's copy kernel re-pointed {moving:.2f} (sources where they were: {unmoved:.2f}); "
          f"two memcpy nodes re-pointed instead {memcpy_nodes:.2f}")

    def copy_then_spin() -> None:  # a call whose kernels take ~100 us, longer than its host work
        api.copy_in_graph(statics, inputs)
        torch.cuda._sleep(200_000)

    busy = api.capture(copy_then_spin, None, (0, 0), keep_graph=True)
    point_busy = api.input_pointer(busy, statics)

    def call() -> None:
        point_busy(next_set())
        busy.replay()

    idle = per_call_us(call, drain_every=1)
    queued = per_call_us(call, drain_every=8)
    replay_only = per_call_us(busy.replay, drain_every=8)
    print(f"re-point + replay of a ~100 us graph, us per call: previous launch finished {idle:.2f}  "
          f"drained every 8 calls {queued:.2f}  (replay alone, drained every 8: {replay_only:.2f})")

    for ms in (0.1, 1.0, 5.0):
        gpu_busy, host_spun, host_slept = (
            per_call_us(call, drain_every=1, calls=AFTER_SAMPLES, before=before)
            for before in (lambda ms=ms: torch.cuda._sleep(int(ms * SLEEP_CYCLES_PER_MS)), lambda ms=ms: spin(ms),
                           lambda ms=ms: time.sleep(ms / 1e3)))
        print(f"first re-point + replay after a drain, us (median of {AFTER_SAMPLES}), {ms} ms before it: "
              f"GPU busy, host in synchronize {gpu_busy:.2f}  GPU idle, host spinning {host_spun:.2f}  "
              f"GPU idle, host asleep {host_slept:.2f}")


SLEEP_CYCLES_PER_MS = 1_980_000  # torch.cuda._sleep counts SM clock cycles; the H200 runs at ~1980 MHz
AFTER_SAMPLES = 40


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


class _PitchedPtr(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("pitch", ctypes.c_size_t), ("xsize", ctypes.c_size_t),
                ("ysize", ctypes.c_size_t)]


class _Memcpy3DParms(ctypes.Structure):  # cudaMemcpy3DParms
    _fields_ = [("srcArray", ctypes.c_void_p), ("srcPos", ctypes.c_size_t * 3), ("srcPtr", _PitchedPtr),
                ("dstArray", ctypes.c_void_p), ("dstPos", ctypes.c_size_t * 3), ("dstPtr", _PitchedPtr),
                ("extent", ctypes.c_size_t * 3), ("kind", ctypes.c_int)]


def memcpy_node_repoint_us(statics, sets) -> float:
    """The alternative to one copy kernel: the inputs copied by one memcpy node each (`copy_`), every
    node re-pointed by `cudaGraphExecMemcpyNodeSetParams1D` when its source moves."""
    with open("/proc/self/maps") as maps:
        (path,) = {line.split()[-1] for line in maps if "libcudart.so" in line}
    rt = ctypes.CDLL(path)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        for static, t in zip(statics, sets[0]):
            static.copy_(t)
    graph.instantiate()
    count = ctypes.c_size_t(0)
    raw = ctypes.c_void_p(torch.cuda.CUDAGraph.raw_cuda_graph(graph))
    rt.cudaGraphGetNodes(raw, None, ctypes.byref(count))
    nodes = (ctypes.c_void_p * count.value)()
    rt.cudaGraphGetNodes(raw, nodes, ctypes.byref(count))
    by_dst = {}
    for node in nodes:
        params = _Memcpy3DParms()
        if rt.cudaGraphMemcpyNodeGetParams(ctypes.c_void_p(node), ctypes.byref(params)) == 0:
            by_dst[params.dstPtr.ptr] = node
    targets = [(ctypes.c_void_p(by_dst[s.data_ptr()]), ctypes.c_void_p(s.data_ptr()), s.numel() * s.element_size())
               for s in statics]
    exec_ = ctypes.c_void_p(torch.cuda.CUDAGraph.raw_cuda_graph_exec(graph))
    set_params = rt.cudaGraphExecMemcpyNodeSetParams1D
    set_params.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t, ctypes.c_int]
    calls = [0]

    def repoint() -> None:
        calls[0] += 1
        for (node, dst, nbytes), t in zip(targets, sets[calls[0] % 2]):
            assert set_params(exec_, node, dst, t.data_ptr(), nbytes, 3) == 0  # cudaMemcpyDeviceToDevice

    return per_launch_us(repoint)


if __name__ == "__main__":
    main()
