"""Host cost of one Triton launch on this machine: the JIT entry (`kernel[grid](...)`) against a launch
through the compiled kernel's handle (what `moe_triton._common.launch` does after the first call), and a
torch launch for scale; then what a graphed layer call pays besides Python: the replay of a CUDA graph
and the copy of a one-token call's two inputs into the graph's buffers (`_foreach_copy_` before the replay,
against re-pointing copies that are the graph's own nodes, as `moe_core._graphs` does, for sources that
move and for sources where they were); and that re-point plus replay for a graph whose previous launch
is still queued or running on the GPU against one whose previous launch has finished (bench_host_path
drains the stream every 8 calls, so where kernels take longer than the host work most of its calls are
of the first kind).
Prints microseconds per launch (median of 20 rounds of 200 launches; per call: median of 400 calls)."""

from __future__ import annotations

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


def per_call_us(fn, drain_every: int, calls: int = 400) -> float:
    """Median host time of one `fn()`, the stream drained before every `drain_every`-th call."""
    samples = []
    for i in range(calls):
        if i % drain_every == 0:
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
        for static, t in zip(statics, inputs):
            static.copy_(t)
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
    print(f"graphed call us: inputs copied in by _foreach_copy_ {foreach:.2f}  replay {replay:.2f}  "
          f"the graph's own copies re-pointed {moving:.2f} (sources where they were: {unmoved:.2f})")

    def copy_then_spin() -> None:  # a call whose kernels take ~100 us, longer than its host work
        for static, t in zip(statics, inputs):
            static.copy_(t)
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


if __name__ == "__main__":
    main()
