"""Where a decode step of a fused transformers model spends its time: host calls and GPU kernels.

Builds a real-shape model (hf_models.build_model, fewer layers where asked), fuses it with the given
schemes one process each, and profiles `generate` (16-token prompt, batch B) under torch.profiler:
the step time, the top GPU kernels by total time, the host-side CUDA API calls (graph launches
against kernel launches: a layer replaying its graphs makes one graph launch per block and step), and
each fused block's graph state (signatures captured, signatures whose capture failed).

With --compile-mode, decode runs compiled the way transformers compiles it: into one static cache
that every call reuses, with `generate` compiling the model's call itself (`GenerationConfig.compile_config`,
one compile); the row adds dynamo's counters (graphs, graph breaks, recompiles) and the host events
that took the most time (the compiled regions, the fused op, generate's own work between them).

    python3 profile_decode.py --model qwen3-30b-a3b --layers 8 --experts int4 mxfp4 --batch 1 --out DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch


def profile_generate(model, prompt: torch.Tensor, new: int, cache=None) -> dict:
    """ms/step of greedy decode after two warm-up calls, then one profiled `generate` of `new` tokens
    (into `cache` where given): the top GPU kernels, the host's CUDA API calls, and each fused block's
    graph state."""
    from bench_e2e import generate_greedy
    from torch.profiler import ProfilerActivity, profile

    from moe_core.integrations.transformers import FusedMoEBlock

    row: dict = {}
    with torch.inference_mode():
        for _ in range(2):  # kernels compiled, graphs captured
            for n in (2, 2 + new):
                generate_greedy(model, prompt, n, cache)
        times = {}
        for n in (2, 2 + new):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            generate_greedy(model, prompt, n, cache)
            torch.cuda.synchronize()
            times[n] = time.perf_counter() - t0
        row["ms_per_step"] = round((times[2 + new] - times[2]) / new * 1e3, 3)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            generate_greedy(model, prompt, 2 + new, cache)
            torch.cuda.synchronize()
    events = prof.key_averages()
    gpu = sorted((e for e in events if e.device_time_total > 0), key=lambda e: -e.device_time_total)
    row["gpu_kernels_top"] = [{"name": e.key[:120], "count": e.count, "total_us": round(e.device_time_total, 1)}
                              for e in gpu[:25]]
    api = [e for e in events if e.key.startswith(("cuda", "cu"))]
    row["cuda_api"] = {e.key: {"count": e.count, "total_us": round(e.cpu_time_total, 1)}
                       for e in sorted(api, key=lambda e: -e.cpu_time_total)[:12]}
    host = sorted((e for e in events if e.cpu_time_total > 0), key=lambda e: -e.cpu_time_total)
    row["host_events_top"] = [{"name": e.key[:120], "count": e.count, "total_us": round(e.cpu_time_total, 1),
                               "self_us": round(e.self_cpu_time_total, 1)} for e in host[:30]]
    from torch._dynamo.utils import counters

    row["dynamo"] = {k: dict(counters[k]) for k in ("stats", "frames", "graph_break", "recompiles") if k in counters}
    row["generate_compiled_its_call"] = hasattr(model, "_compiled_call")
    blocks = [m for m in model.modules() if isinstance(m, FusedMoEBlock)]
    graphs = [b._graphs for b in blocks if b._graphs is not None]
    row["blocks"] = len(blocks)
    row["block_graphs_captured"] = [len(g) for g in graphs][:4]
    row["block_signatures_failed"] = sum(s.failed for g in graphs for s in g._signatures.values())
    row["layer_graphs_captured"] = [len(b.moe._graphs) for b in blocks if b.moe._graphs is not None][:4]
    return row


def profile_one(model_name: str, layers: int, experts: str, batch: int, new: int, compile_mode: str | None) -> dict:
    from bench_e2e import PROMPT, compile_for_generate, decode_cache
    from hf_models import build_model
    from layer_timing import layer_quant

    from moe_core.integrations.transformers import fuse
    from moe_core.presets import get_preset

    dev = torch.device("cuda")
    model = build_model(model_name, layers, dev)
    if experts != "transformers":
        preset = get_preset(model_name if model_name != "gpt-oss-20b" else "gpt-oss-120b")
        fuse(model, quant=layer_quant(preset, experts), prefer="triton")
    cache = None
    if compile_mode is not None:
        compile_for_generate(model, compile_mode)
        cache = decode_cache(model, new)
    gen = torch.Generator(device=dev).manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (batch, PROMPT), device=dev, generator=gen)
    return {"model": model_name, "layers": layers, "experts": experts, "batch": batch, "compile_mode": compile_mode,
            **profile_generate(model, prompt, new, cache)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-30b-a3b")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--experts", nargs="+", default=["int4", "mxfp4"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new", type=int, default=8)
    parser.add_argument("--compile-mode", default=None, help="decode compiled by generate in this torch.compile mode")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        row = profile_one(args.model, args.layers, args.experts[0], args.batch, args.new, args.compile_mode)
        print("RESULT " + json.dumps(row), flush=True)
        return 0
    rows = []
    for experts in args.experts:  # one process each: a fresh GPU, and one crash hides nothing else
        proc = subprocess.run([sys.executable, __file__, "--one", "--model", args.model, "--layers", str(args.layers),
                               "--experts", experts, "--batch", str(args.batch), "--new", str(args.new),
                               "--out", str(args.out),
                               *(["--compile-mode", args.compile_mode] if args.compile_mode else [])],
                              capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"{experts}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", flush=True)
            continue
        rows.append(json.loads(lines[-1].removeprefix("RESULT ")))
        print(json.dumps(rows[-1], indent=1), flush=True)
    mode = f"-compiled-{args.compile_mode}" if args.compile_mode else ""
    path = args.out / f"profile-decode-{args.model}-{args.layers}l-b{args.batch}{mode}.json"
    path.write_text(json.dumps(rows, indent=1))
    return 0 if len(rows) == len(args.experts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
