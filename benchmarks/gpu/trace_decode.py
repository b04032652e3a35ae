"""Where a decode-size layer call's time goes: per-program timestamps of its launches in a CUDA graph.

The layer (layer_timing.py: the benchmark's triton FusedMoE) is captured in a CUDA graph with its
router and quantized GEMMs built with TRACE (`moe_triton._common.trace`): each program writes its
start, its release from the dependent-launch wait, the end of its K loop (GEMMs), its end (the
GPU's global timer, ns) and its SM. Each replay follows an L2 flush, as in the benchmark; per
replay, times are taken from the router's first start, and each launch is summarized (programs,
SMs, first/median/last start, release and end, the median program's time after its release, split
for the GEMMs into its K loop and its sink); the table gives medians over the replays. Launches the
trace does not cover (the alignment, fp8's activation quantization) show as gaps. Beside it, the
same layer untraced under the benchmark protocol (`time_layer`), and the traced graph's replay time
(CUDA events), to show what the tracing costs; at the end, each build of the quantized GEMM in the
process (registers, spills, shared memory, its PTX's memory instructions).

    python benchmarks/gpu/trace_decode.py --cells qwen3-30b-a3b/int4/1 qwen3-30b-a3b/int4/8 --out trace.json

A cell may name a variant after a fourth slash, as `ab_layer.py` takes them (`NAME=CHANGE[,CHANGE...]`,
e.g. `qwen3-30b-a3b/int4/1/gemm2-mma=ab_patches:mma_gemm2`): the layer is traced and timed with it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from ab_layer import Variant, parse_variant
from layer_timing import build_layer, input_sets, random_weights, time_layer

from moe_core.bench.timing import CUDA_L2_FLUSH_BYTES
from moe_core.presets import get_preset
from moe_triton._common import trace


def summarize(records: list[tuple[str, torch.Tensor]]) -> list[dict]:
    """Per launch: timestamps relative to the router's first start (us)."""
    # The GEMM launches in call order: gemm1, gemm2.
    gemms = iter(range(1, len(records) + 1))
    rows = [(f"gemm{next(gemms)}" if name == "gemm" else name, t.cpu()) for name, t in records]
    origin = min(int(t[t[:, 3] > 0, 0].min()) for _, t in rows if bool((t[:, 3] > 0).any()))
    out = []
    for name, t in rows:
        done = t[t[:, 3] > 0]
        if done.numel() == 0:
            out.append({"launch": name, "programs": int(t.shape[0]), "traced": 0})
            continue
        start, released, products, end = ((done[:, i] - origin).double() / 1e3 for i in range(4))
        per_sm = torch.bincount(done[:, 4])
        out.append({
            "launch": name, "programs": int(t.shape[0]), "traced": int(done.shape[0]),
            "sms": int((per_sm > 0).sum()), "max_per_sm": int(per_sm.max()),
            "start": [float(start.min()), float(start.median()), float(start.max())],
            "released": [float(released.min()), float(released.median()), float(released.max())],
            "end": [float(end.min()), float(end.median()), float(end.max())],
            "run_after_release_us": float((end - released).median()),
            "wait_us": float((released - start).median()),
        })
        if bool((done[:, 2] > 0).all()):  # a GEMM: its K loop and its sink apart
            out[-1]["products_us"] = float((products - released).median())
            out[-1]["sink_us"] = float((end - products).median())
    return out


def median_summary(replays: list[list[dict]]) -> list[dict]:
    """Each field's median over the replays (launches in the same order every replay)."""
    merged = []
    for i, first in enumerate(replays[0]):
        row = dict(first)
        for key, value in first.items():
            if isinstance(value, list):
                row[key] = [statistics.median(r[i][key][j] for r in replays) for j in range(len(value))]
            elif isinstance(value, float):
                row[key] = statistics.median(r[i][key] for r in replays)
        merged.append(row)
    return merged


def trace_cell(preset_name: str, dtype: str, tokens: int, variant: Variant, replays: int, dev: torch.device) -> dict:
    preset = get_preset(preset_name)
    weights = random_weights(preset, dtype, dev)
    layer = build_layer(preset, dtype, dev, weights)
    inputs = input_sets(preset, tokens, dev)
    with variant.active(layer, tokens):
        return _trace_cell(preset_name, dtype, tokens, variant, layer, inputs, replays, dev)


def _trace_cell(preset_name, dtype, tokens, variant, layer, inputs, replays, dev) -> dict:
    untraced_us = time_layer(layer, inputs)["us"]
    x, logits = inputs[0]
    with trace.recording() as first:  # an eager call: builds the traced kernels and the buffers
        layer(x, logits)
    torch.cuda.synchronize()
    layer(x, logits)
    graph = torch.cuda.CUDAGraph()
    with trace.recording(reuse=first) as captured, torch.cuda.graph(graph):
        layer(x, logits)
    if [n for n, _ in captured] != [n for n, _ in first]:
        raise RuntimeError("the captured call traced other launches than the eager one")
    flush = torch.empty(CUDA_L2_FLUSH_BYTES, dtype=torch.uint8, device=dev)
    summaries, replay_us = [], []
    for i in range(replays + 3):
        for _, t in first:
            t.zero_()
        flush.zero_()
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record()
        graph.replay()
        after.record()
        torch.cuda.synchronize()
        if i >= 3:
            summaries.append(summarize(first))
            replay_us.append(before.elapsed_time(after) * 1e3)
    launches = median_summary(summaries)
    span = max(row["end"][2] for row in launches if row.get("traced"))
    return {"preset": preset_name, "dtype": dtype, "tokens": tokens, "variant": variant.name,
            "changes": variant.describe(), "untraced_us": untraced_us,
            "traced_replay_us": statistics.median(replay_us), "traced_span_us": span, "launches": launches,
            "config": str(layer.experts.config_for(tokens)) if hasattr(layer.experts, "config_for") else ""}


def kernel_builds(dump: Path | None = None) -> list[dict]:
    """What Triton built of the quantized GEMMs (tl.dot and mma kernels) in this process: per build its
    registers, spills, shared memory and a count of the PTX's memory instructions (are the weight loads asynchronous
    copies the pipeline runs ahead, or register loads?). dump: a folder for each build's PTX and
    SASS (`build<i>.ptx`, `build<i>.sass`; the JSON's `dump` names them)."""
    from moe_triton.quant_gemm_details._kernel import _moe_wgemm_kernel
    from moe_triton.quant_gemm_details._mma import moe_mma_gemm_kernel

    builds = []
    for fn, keys in ((_moe_wgemm_kernel, ("WTYPE", "BLOCK_N", "SPLIT_K", "DIRECT", "SINK", "ACT", "TRACE")),
                     (moe_mma_gemm_kernel, ("BLOCK_N", "TILES", "STAGES", "DIRECT", "SINK", "ACT", "EARLY_WEIGHTS",
                                            "TRACE"))):
        builds += _builds(fn, keys, dump, len(builds))
    return builds


def _builds(fn, keys: tuple[str, ...], dump: Path | None, first: int) -> list[dict]:
    builds = []
    for caches in fn.device_caches.values():
        for kernel in caches[0].values():
            kernel._init_handles()
            ptx = kernel.asm["ptx"]
            # The build's compile-time arguments, keyed by argument index (a tuple) in Triton's source.
            constants = getattr(getattr(kernel, "src", None), "constants", {}) or {}
            named = {fn.arg_names[k[0]] if isinstance(k, tuple) else str(k): v for k, v in constants.items()}
            shape = {k: named[k] for k in keys if k in named}
            builds.append({
                "kernel": fn.fn.__name__, "shape": {k: str(v) for k, v in shape.items()},
                "regs": kernel.n_regs, "spills": kernel.n_spills, "shared": kernel.metadata.shared,
                "num_warps": kernel.metadata.num_warps, "num_stages": kernel.metadata.num_stages,
                **{op: ptx.count(op) for op in ("cp.async.cg", "cp.async.ca", "cp.async.bulk", "ld.global",
                                                "ld.global.v4", "wgmma.mma_async", "wgmma.wait_group", "mma.sync",
                                                "atom.global", "red.global")}})
            if dump is not None:
                builds[-1]["dump"] = _dump_build(kernel, ptx, dump / f"build{first + len(builds) - 1}")
    return builds


def _dump_build(kernel, ptx: str, stem: Path) -> str:
    """Writes a build's PTX and SASS (the GPU's own, disassembled by Triton's cuobjdump) beside stem."""
    from triton.tools.disasm import get_sass

    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".ptx").write_text(ptx)
    try:
        stem.with_suffix(".sass").write_text(get_sass(kernel.asm["cubin"]))
    except Exception as exc:  # the PTX stands alone where no disassembler ships with Triton
        stem.with_suffix(".sass").write_text(f"no SASS: {type(exc).__name__}: {exc}\n")
    return stem.name


def show(cell: dict) -> None:
    print(f"{cell['preset']} {cell['dtype']} M={cell['tokens']} {cell['variant']}: untraced {cell['untraced_us']:.1f} us, "
          f"traced replay {cell['traced_replay_us']:.1f} us, router start -> last end {cell['traced_span_us']:.1f} us  "
          f"{cell['config']}")
    print(f"  {'launch':8s} {'progs':>6s} {'SMs':>4s} {'/SM':>4s}  {'start first/med/last':>22s}  "
          f"{'released first/med/last':>24s}  {'end first/med/last':>22s}  {'run':>6s} {'loop':>6s} {'sink':>6s}")
    for r in cell["launches"]:
        if not r.get("traced"):
            print(f"  {r['launch']:8s} {r['programs']:6d}  (no program traced)")
            continue
        fmt = lambda v: "/".join(f"{x:6.2f}" for x in v)  # noqa: E731
        print(f"  {r['launch']:8s} {r['programs']:6d} {r['sms']:4d} {r['max_per_sm']:4d}  {fmt(r['start']):>22s}  "
              f"{fmt(r['released']):>24s}  {fmt(r['end']):>22s}  {r['run_after_release_us']:6.2f} "
              f"{r.get('products_us', float('nan')):6.2f} {r.get('sink_us', float('nan')):6.2f}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", nargs="+", required=True, metavar="PRESET/DTYPE/TOKENS")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--out", type=Path)
    p.add_argument("--dump", type=Path, help="a folder for each GEMM build's PTX and SASS")
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    cells = []
    for spec in args.cells:
        preset, dtype, tokens, *variant = spec.split("/", 3)
        cell = trace_cell(preset, dtype, int(tokens), parse_variant(variant[0] if variant else "shipped"),
                          args.replays, dev)
        show(cell)
        cells.append(cell)
        torch.cuda.empty_cache()
    try:
        builds = kernel_builds(args.dump)
    except Exception as exc:  # the trace stands without these (a Triton version's JIT cache laid out otherwise)
        builds = [{"error": f"{type(exc).__name__}: {exc}"}]
    for b in builds:
        print(b, flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                                        "cells": cells, "gemm_builds": builds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
