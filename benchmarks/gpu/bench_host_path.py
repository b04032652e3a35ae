"""What one eager call costs on the host, against what its kernels need on the GPU.

For each preset, scheme and token count: a `FusedMoE` on the triton backend, or the one --backend
names (layer_timing.build_layer; a backend that refuses the cell says so), or, with --block, the transformers MoE block of that preset after `fuse()` (router projection and
shared experts included), called as `generate` calls it. Per cell:

- host_us: median host time of one call (perf_counter around the call; the stream is drained every
  8 calls, outside the timed calls, so a full launch queue never blocks the host); host_p10_us and
  host_p90_us its spread; host_by_position_us the median at each place after a drain (0: the GPU
  idle; later places: the previous calls still queued or running where they take longer than the
  host); host_idle_us the median with the stream drained before every call;
- eager_us: GPU time per call of back-to-back eager calls (CUDA events around a loop over rotating
  input sets; no L2 flush);
- graph_us: the same loop replaying one CUDA graph per input set (same protocol, so eager_us / graph_us
  is what the host path costs the GPU);
- graph_nodes: the nodes of the graph the eager calls replay (the driver's work per launch);
- host_state: the machine's 1-minute load average, the CPU the process last ran on and that CPU's
  clock, and the process's Python threads, read after the cell (a cell's host time can move by ~20 us for stretches of consecutive
  cells, with the same code and graph: this tells host interference apart);
- ok: eager_us <= 1.1 * graph_us + 10 and host_us <= the target (30 us a layer, 45 a block).

--profile writes cProfile statistics of 200 eager calls of each cell (DIR/profile-CELL.txt).

    python3 bench_host_path.py --out DIR [--presets ...] [--schemes ...] [--tokens ...] [--backend NAME]
                               [--block] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import json
import pstats
import statistics
import threading
import time
from pathlib import Path

import torch
from layer_timing import DTYPES, build_layer, input_sets, layer_quant

from moe_core.presets import get_preset

HOST_TARGET_US = {"layer": 30.0, "block": 45.0}
CALLS = 200
DRAIN_EVERY = 8


def host_times(call, inputs, drain_every: int = DRAIN_EVERY) -> list[float]:
    samples = []
    for i in range(CALLS):
        if i % drain_every == 0:
            torch.cuda.synchronize()
        x, logits = inputs[i % len(inputs)]
        t0 = time.perf_counter()
        call(x, logits)
        samples.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return samples


def gpu_us_per_call(fns, loops: int = 50) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    start.record()
    for i in range(loops):
        fns[i % len(fns)]()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / loops


def graphs(call, inputs):
    replays = []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for x, logits in inputs:
            call(x, logits)
    torch.cuda.current_stream().wait_stream(stream)
    for x, logits in inputs:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            call(x, logits)
        replays.append(g.replay)
    return replays


class BlockCall:
    """A fused transformers block called on [1, M, K] hidden states, as the decoder layer calls it."""

    def __init__(self, preset_name: str, scheme: str, device: torch.device) -> None:
        from hf_models import fused_block

        self.block, self.dtype = fused_block(preset_name, layer_quant(get_preset(preset_name), scheme), device)

    def __call__(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        out = self.block(x.unsqueeze(0))
        return out[0] if isinstance(out, tuple) else out


def measure(call, inputs, what: str) -> dict:
    with torch.no_grad():
        for x, logits in inputs:  # compile every kernel this size needs
            call(x, logits)
        torch.cuda.synchronize()
        samples = [t * 1e6 for t in host_times(call, inputs)]
        idle = statistics.median(host_times(call, inputs, drain_every=1)) * 1e6
        eager = gpu_us_per_call([lambda x=x, g=g: call(x, g) for x, g in inputs])
        graph = gpu_us_per_call(graphs(call, inputs))
    host = statistics.median(samples)
    deciles = statistics.quantiles(samples, n=10)
    by_position = [round(statistics.median(samples[p::DRAIN_EVERY]), 1) for p in range(DRAIN_EVERY)]
    return {"host_us": round(host, 1), "host_p10_us": round(deciles[0], 1), "host_p90_us": round(deciles[-1], 1),
            "host_by_position_us": by_position, "host_idle_us": round(idle, 1),
            "eager_us": round(eager, 1), "graph_us": round(graph, 1), "eager_over_graph": round(eager / graph, 3),
            "ok": bool(eager <= 1.1 * graph + 10 and host <= HOST_TARGET_US[what])}


def graph_nodes(call) -> int | None:
    """Nodes of the first graph the layer's (or block's) CallGraphs captured, None where none was kept."""
    from moe_core import _graph_copy

    owner = call.block if isinstance(call, BlockCall) else call
    graphs = [g for sig in owner._graphs._signatures.values() if sig.copies_in_graph for g in sig.graphs]
    lib = _graph_copy._load_driver()
    if not graphs or lib is None:
        return None
    count = ctypes.c_size_t(0)
    if lib.cuGraphGetNodes(torch.cuda.CUDAGraph.raw_cuda_graph(graphs[0].graph), None, ctypes.byref(count)):
        return None
    return count.value


def host_state() -> dict:
    """Load average, the CPU this process last ran on and its current clock (Linux /proc), and the
    process's Python threads."""
    try:
        load = float(Path("/proc/loadavg").read_text().split()[0])
        cpu = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[36])
        mhz = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("cpu MHz")]
        return {"loadavg_1m": load, "cpu": cpu, "cpu_mhz": round(mhz[cpu], 0) if cpu < len(mhz) else None,
                "python_threads": threading.active_count()}  # others may take the GIL a call releases
    except (OSError, ValueError, IndexError):
        return {}


def profile(call, inputs, path: Path) -> None:
    with torch.no_grad():
        prof = cProfile.Profile()
        prof.enable()
        host_times(call, inputs)
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    path.write_text(text.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--presets", nargs="+", default=["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3",
                                                          "gpt-oss-120b"])
    parser.add_argument("--schemes", nargs="+", default=["bf16", "int4", "int8", "fp8-channel", "fp8-block",
                                                          "mxfp4"], choices=DTYPES)
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 8, 64, 512, 2048])
    parser.add_argument("--backend", default="triton", help="the layer's backend (not with --block)")
    parser.add_argument("--block", action="store_true", help="time the fused transformers block instead")
    parser.add_argument("--profile", action="store_true", help="also write cProfile statistics per cell")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    what = "block" if args.block else "layer"
    rows = []
    if args.block and args.backend != "triton":
        parser.error("--block times the triton block only")
    tag = "" if args.backend == "triton" else f"-{args.backend}"
    path = args.out / f"host-path-{what}{tag}-{'-'.join(args.presets)}.json"
    print(f"{'preset':<16} {'scheme':<12} {'M':>5} {'host us':>8} {'p10-p90':>11} {'idle':>6} {'eager us':>9} "
          f"{'graph us':>9} {'e/g':>6} ok  nodes host us by place after a drain", flush=True)
    for name in args.presets:
        preset = get_preset(name)
        for scheme in args.schemes:
            try:
                call = BlockCall(name, scheme, dev) if args.block else build_layer(preset, scheme, dev, backend=args.backend)
            except Exception as exc:  # a scheme the backend refuses for this shape: say so, go on
                rows.append({"preset": name, "scheme": scheme, "refused": f"{type(exc).__name__}: {exc}"[:300]})
                print(f"{name:<16} {scheme:<12} refused: {rows[-1]['refused'][:120]}", flush=True)
                continue
            for M in args.tokens:
                inputs = input_sets(preset, M, dev, sets=4 if M <= 512 else 2)
                row = {"preset": name, "scheme": scheme, "tokens": M, **measure(call, inputs, what),
                       "graph_nodes": graph_nodes(call), "host_state": host_state()}
                rows.append(row)
                spread = f"{row['host_p10_us']:.0f}-{row['host_p90_us']:.0f}"
                print(f"{name:<16} {scheme:<12} {M:>5} {row['host_us']:>8.1f} {spread:>11} {row['host_idle_us']:>6.1f} "
                      f"{row['eager_us']:>9.1f} {row['graph_us']:>9.1f} {row['eager_over_graph']:>6.2f} "
                      f"{'yes' if row['ok'] else 'NO ':<3} {row['graph_nodes']!s:>5} {row['host_by_position_us']}",
                      flush=True)
                if args.profile:
                    profile(call, inputs, args.out / f"profile-{what}-{name}-{scheme}-{M}.txt")
                path.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "what": what, "backend": args.backend, "rows": rows}, indent=1))
            del call
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
