"""Where one whole-layer call spends its time: GPU time per kernel, from torch.profiler.

Same layer, weights and inputs as bench_layer.py (layer_timing.py; the first two input sets); the
L2 cache is flushed (a bitwise_not over 256 MiB, left out of the table) before each of the profiled
calls, as do_bench does. The table lists each kernel's GPU time per layer call and the sum; the gap
between that sum and the graph replay time of bench_layer is launch and idle time. A kernel launched
more than once per call (GEMM1 and GEMM2 of one kernel) is listed per launch, in launch order:
"name #1", "name #2".
With --graph the profiled calls are replays of a CUDA graph of the layer, as bench_layer times
them, and each cell also reports the span from the first kernel's start to the last one's end
(median over the calls): span - sum is the idle time between the layer's kernels.

    python benchmarks/gpu/profile_layer.py --out DIR [--preset ...] [--m ...] [--dtypes bf16 int4 mxfp4] [--graph]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import torch
from layer_timing import DTYPES, PRESETS, build_layer, input_sets

CALLS = 10


def profile_cell(layer, preset, M: int, dev, graph: bool) -> tuple[list[tuple[str, float, int]], float | None]:
    """(kernel name, GPU us per call, launches per call) rows, and with `graph` the median span."""
    inputs = input_sets(preset, M, dev)[:2]
    flush = torch.empty(64 << 20, dtype=torch.int32, device=dev)
    for x, logits in inputs:
        layer(x, logits)
    torch.cuda.synchronize()
    calls = [lambda x=x, logits=logits: layer(x, logits) for x, logits in inputs]
    if graph:
        graphs = []
        for call in calls:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                call()
            graphs.append(g)
        calls = [g.replay for g in graphs]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            flush.bitwise_not_()
            calls[i % 2]()
        torch.cuda.synchronize()
    per_launch: dict[tuple[str, int], list[float]] = defaultdict(list)  # (name, n-th launch in its call)
    spans: list[list[float]] = []  # [first start, last end] of each call's kernels
    seen: dict[str, int] = defaultdict(int)  # launches of each kernel so far in the current call
    for ev in sorted(prof.events(), key=lambda ev: ev.time_range.start):
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if "bitwise_not" in ev.name:
            spans.append([float("inf"), 0.0])
            seen.clear()
            continue
        seen[ev.name] += 1
        per_launch[ev.name, seen[ev.name]].append(
            ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time)
        if spans:
            spans[-1][0] = min(spans[-1][0], ev.time_range.start)
            spans[-1][1] = max(spans[-1][1], ev.time_range.end)
    repeated = {name for name, n in per_launch if n > 1}
    rows = [(name[:90] + (f" #{n}" if name in repeated else ""), sum(ts) / CALLS, len(ts) // CALLS)
            for (name, n), ts in per_launch.items()]
    span = statistics.median(end - start for start, end in spans) if graph and spans else None
    return sorted(rows, key=lambda r: -r[1]), span


def main(argv=None) -> int:
    from moe_core.backends import detect_device
    from moe_core.presets import get_preset

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--preset", nargs="*", default=["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3"], choices=PRESETS)
    p.add_argument("--m", nargs="*", type=int, default=[1, 8, 512, 2048])
    p.add_argument("--dtypes", nargs="*", default=["bf16", "int4"], choices=DTYPES)
    p.add_argument("--graph", action="store_true", help="profile CUDA graph replays and report each call's span")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    info = detect_device(dev)
    result = {"device": info.name, "torch": torch.__version__, "cells": []}
    for name in args.preset:
        preset = get_preset(name)
        for dtype in args.dtypes:
            layer = build_layer(preset, dtype, dev)
            for M in args.m:
                rows, span = profile_cell(layer, preset, M, dev, args.graph)
                total = sum(r[1] for r in rows)
                result["cells"].append({"model": name, "dtype": dtype, "M": M, "kernels": rows, "sum_us": total,
                                        "span_us": span})
                spanned = f", span {span:.1f} us" if span is not None else ""
                print(f"\n{name} {dtype} M={M}: {total:.1f} us of kernels, {sum(r[2] for r in rows)} launches"
                      f"{spanned}")
                for kname, us, count in rows:
                    print(f"  {us:8.1f} us  x{count}  {kname}")
            del layer
            torch.cuda.empty_cache()
    (args.out / f"profile_{info.name.replace(' ', '_')}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
