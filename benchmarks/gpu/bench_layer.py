"""Whole-layer benchmark of moe-triton on one GPU, against the roofline floor and the anchors.

Per model preset x M x {bf16, int4 W4A16} (and, with --dtypes mxfp4, MXFP4 weights with bf16
activations: time and floor only, the anchor tables have no such column): the layer as users run
it, `moe_core.FusedMoE` on the triton backend (its experts class's router, alignment, GEMM1 +
activation, GEMM2, top-k reduce), captured in CUDA graphs (8 rotating input sets, 2 above 512
tokens), timed by moe_core.bench.time_cuda_layer (L2 flushed before every replay; median). Ceilings are
measured in the same run (`moe_core.bench.measure_ceilings`): device-to-device copy bandwidth
(bytes read + written), a plain read of the same bytes, and the 8192^3 bf16 and fp8 matmul rates.
floor = `moe_core.bench.roofline_floor`, the one `moe bench` uses: max(distinct experts the timed
inputs' routing selects x weight bytes per expert with their scales / the faster of copy and read,
2*M*topk*3*N*K / the matmul rate of the scheme's compute type: fp8 for fp8 W8A8, bf16 otherwise).
The SM clock is sampled (NVML, where pynvml is installed) while the matmul ceiling and each cell
are timed: the heaviest layers reach the board's power limit within their timing window and run
below the clock of the ceiling's short synchronized matmuls.

    python benchmarks/gpu/bench_layer.py --out DIR [--preset ...] [--m ...] [--dtypes bf16 int4 mxfp4]

Writes DIR/bench_triton_<device>.{json,md,png}. Weights, inputs and the timing protocol:
layer_timing.py. With --compile-only it calls each cell's layer once and times nothing: its kernels
land in Triton's on-disk cache, so several such processes side by side take the compiling off a
timed run's clock (benchmarks/gpu/bench_mxfp4.sh).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
from layer_timing import (
    DTYPES,
    PRESETS,
    TOKEN_COUNTS,
    build_layer,
    correction_bias,
    input_sets,
    mhz,
    random_weights,
    reference_error,
    time_layer,
)

from moe_core.bench import IMPOSSIBLE_FRACTION, measure_ceilings, roofline_floor, routed_work

HERE = Path(__file__).parent


def bench_cell(layer, preset, dtype: str, weights, M: int, dev: torch.device, ceilings) -> dict:
    """The layer timed over M tokens against the floor of the experts those tokens select, with the
    reference error (bf16, up to 512 tokens)."""
    bias = correction_bias(preset, dev)
    inputs = input_sets(preset, M, dev)
    floor = roofline_floor(preset.config, layer.quant, routed_work(preset.config, [lg for _, lg in inputs], bias),
                           ceilings)
    check = dtype == "bf16" and M <= 512
    err = reference_error(layer, preset, weights, *inputs[0], bias) if check else None
    return {"floor_us": floor.seconds * 1e6, "bound": floor.bound[0], "distinct_experts": floor.distinct_experts,
            "floor_matmul_dtype": floor.matmul_dtype, "err": err, **time_layer(layer, inputs)}


def run(args) -> dict:
    import triton

    from moe_core.backends import detect_device
    from moe_core.oracle import BackendUnavailableError
    from moe_core.presets import get_preset

    dev = torch.device("cuda")
    info = detect_device(dev)
    # Anchors were measured on H100 and H200; compare only on the same kind of device.
    anchor_file = HERE / ("anchors_h200.json" if "H200" in info.name else "anchors_h100.json")
    anchors = json.loads(anchor_file.read_text())["tables"] if "H100" in info.name or "H200" in info.name else {}
    ceilings = measure_ceilings(dev, torch.bfloat16)
    rates = ", ".join(f"{t} {r / 1e12:.0f}" for t, r in ceilings.matmul_flop_per_s.items())
    print(f"device {info.name}: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s, read "
          f"{ceilings.read_bytes_per_s / 1e12:.2f} TB/s, matmul {rates} TFLOP/s at {mhz(ceilings.matmul_sm_clock_mhz)}",
          flush=True)
    cells = []
    for name in args.preset:
        preset = get_preset(name)
        for dtype in args.dtypes:
            weights = random_weights(preset, dtype, dev)
            try:
                layer = build_layer(preset, dtype, dev, weights)
            except BackendUnavailableError as exc:
                cells.append({"model": name, "dtype": dtype, "skipped": str(exc).splitlines()[0]})
                continue
            experts = layer.experts
            router = f"{layer.plan.router.__module__}.{layer.plan.router.__name__}"
            for M in args.m:
                cell = {"model": name, "dtype": dtype, "M": M, "experts": experts.name(), "router": router}
                try:
                    cell.update(bench_cell(layer, preset, dtype, weights, M, dev, ceilings))
                except Exception as exc:  # recorded in the results, never hidden
                    cell["error"] = f"{type(exc).__name__}: {exc}"[:300]
                    print(f"{name} {dtype} M={M}: {cell['error']}", flush=True)
                    cells.append(cell)
                    continue
                if hasattr(experts, "config_for"):
                    cell["config"] = str(experts.config_for(M))
                floor_us, bound = cell["floor_us"], cell["bound"]
                cell["floor_fraction"] = floor_us / cell["us"]
                anchor = anchors.get(dtype, {}).get(name, {}).get(str(M))
                if anchor:
                    cell["anchor_us"] = anchor["us"]
                    cell["anchor"] = anchor["anchor"]
                    cell["speedup_vs_anchor"] = anchor["us"] / cell["us"]
                cells.append(cell)
                print(f"{name:16s} {dtype:5s} M={M:5d} {cell['us']:9.1f} us  floor {floor_us:8.1f} ({bound}) "
                      f"frac {cell['floor_fraction']:.2f}{'!' if cell['floor_fraction'] > IMPOSSIBLE_FRACTION else ''}"
                      f"  vs anchor {cell.get('speedup_vs_anchor', 0):.2f}x "
                      f"err {cell['err'] if cell['err'] is not None else '-'}  SM {mhz(cell['sm_clock_mhz'])}",
                      flush=True)
            del layer, experts, weights
            torch.cuda.empty_cache()
    return {"device": info.name, "capability": list(info.capability or ()), "torch": torch.__version__,
            "triton": triton.__version__, "started": args.started, "ceilings": asdict(ceilings), "cells": cells,
            "anchors": anchor_file.name if anchors else "none for this device",
            "protocol": __doc__.split("\n\n")[1].replace("\n", " ")}


def compile_only(args) -> None:
    """Each cell's layer (`--preset` x `--dtypes` x `--m`) called once on one input set, nothing timed."""
    from moe_core.presets import get_preset

    dev = torch.device("cuda")
    for name in args.preset:
        preset = get_preset(name)
        for dtype in args.dtypes:
            started = time.time()
            weights = random_weights(preset, dtype, dev)
            layer = build_layer(preset, dtype, dev, weights)
            for M in args.m:
                layer(*input_sets(preset, M, dev, sets=1)[0])
            torch.cuda.synchronize()
            print(f"{name} {dtype}: compiled M={args.m} in {time.time() - started:.0f} s", flush=True)
            del layer, weights
            torch.cuda.empty_cache()


def write_markdown(result: dict, path: Path) -> None:
    c = result["ceilings"]
    lines = [f"# moe-triton whole-layer benchmark on {result['device']}", "",
             f"torch {result['torch']}, triton {result['triton']}, started {result['started']}.", "",
             f"Ceilings measured in this run: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s (read+write), plain read "
             f"{c['read_bytes_per_s'] / 1e12:.2f} TB/s (the floor takes the faster), "
             "8192^3 matmuls " + ", ".join(f"{t} {r / 1e12:.0f}" for t, r in c["matmul_flop_per_s"].items())
             + f" TFLOP/s (median SM clock while they ran: {mhz(c.get('matmul_sm_clock_mhz'))}).", "",
             result["protocol"], "",
             f"Cells: time us (floor/time; `!`: above {IMPOSSIBLE_FRACTION}, which no layer can reach: the floor "
             "or the timing is wrong there); `vs anchor` = anchor best time / our time (>1: faster than the "
             f"fastest anchor; anchors from {result['anchors']}, measured on the same kind of device).", ""]
    for dtype in DTYPES:
        rows = [x for x in result["cells"] if x["dtype"] == dtype]
        if not rows:
            continue
        lines += [f"## {dtype}", ""]
        layers = sorted({f"{x['experts']}, routed by {x['router']}" for x in rows if "router" in x})
        if layers:
            lines += [f"Layer: FusedMoE with {'; '.join(layers)}.", ""]
        skipped = [x for x in rows if "skipped" in x]
        for x in skipped:
            lines.append(f"- {x['model']}: skipped: {x['skipped']}")
        rows = [x for x in rows if "skipped" not in x]
        if rows:
            lines += ["| model | M | floor us | time us (floor frac) | anchor us | vs anchor | err | SM clock "
                      "| config |", "|---|---|---|---|---|---|---|---|---|"]
            for x in rows:
                if "error" in x:
                    lines.append(f"| {x['model']} | {x['M']} | | error: {x['error']} | | | | | |")
                    continue
                err = f"{x['err']:.1e}" if x.get("err") is not None else ""
                lines.append(f"| {x['model']} | {x['M']} | {x['floor_us']:.1f} {x['bound']} ({x['distinct_experts']:g} "
                             f"experts) | {x['us']:.1f} "
                             f"({x['floor_fraction']:.2f}{'!' if x['floor_fraction'] > IMPOSSIBLE_FRACTION else ''}) | "
                             f"{x.get('anchor_us', '')} {x.get('anchor', '')} | "
                             f"{x.get('speedup_vs_anchor', 0):.2f} | {err} | {mhz(x.get('sm_clock_mhz'))} | "
                             f"{x.get('config', '')} |")
        lines.append("")
    path.write_text("\n".join(lines))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for ax, dtype in zip(axes, ("bf16", "int4")):
        for model in PRESETS:
            rows = [x for x in result["cells"] if x["dtype"] == dtype and x["model"] == model and "us" in x]
            if rows:
                ax.plot([x["M"] for x in rows], [x["floor_fraction"] for x in rows], marker="o", label=model)
            arows = [x for x in rows if "anchor_us" in x]
            if arows:
                ax.plot([x["M"] for x in arows], [x["floor_us"] / x["anchor_us"] for x in arows], ls=":",
                        color=ax.lines[-1].get_color())
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype}: floor / time (solid: moe-triton, dotted: best anchor)")
        ax.set_xlabel("tokens M")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of roofline floor")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"moe-triton whole MoE layer on {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--preset", nargs="*", default=list(PRESETS))
    p.add_argument("--m", nargs="*", type=int, default=list(TOKEN_COUNTS))
    p.add_argument("--dtypes", nargs="*", default=["bf16", "int4"], choices=DTYPES)
    p.add_argument("--compile-only", action="store_true",
                   help="call each cell's layer once (filling Triton's cache), time and write nothing")
    args = p.parse_args(argv)
    if args.compile_only:
        compile_only(args)
        return 0
    args.started = time.strftime("%Y-%m-%d %H:%M:%S")
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    tag = result["device"].replace(" ", "_")
    (args.out / f"bench_triton_{tag}.json").write_text(json.dumps(result, indent=1))
    write_markdown(result, args.out / f"bench_triton_{tag}.md")
    plot(result, args.out / f"bench_triton_{tag}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
