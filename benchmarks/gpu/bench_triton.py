"""Whole-layer benchmark of moe-triton on one GPU, with the anchors-h100.md protocol.

Per model preset x M x {bf16, int4 W4A16} (and, with --dtypes mxfp4, MXFP4 weights with bf16
activations: time and floor only, the anchor tables have no such column): the layer as users run
it, `moe_core.FusedMoE` on the triton backend (its experts class's router, alignment, GEMM1 +
activation, GEMM2, top-k reduce), captured in CUDA graphs (8 rotating input sets, 2 above 512
tokens), timed with triton.testing.do_bench (L2 flushed before every call; median). Ceilings are
measured in the same run: device-to-device copy bandwidth (bytes read + written) and the
8192^3 bf16 matmul rate. floor = max(expected distinct experts' weight bytes / bandwidth,
2*M*topk*3*N*K / matmul rate), expected distinct experts = E*(1-(1-topk/E)^M). The SM clock is
sampled (NVML, where pynvml is installed) while the matmul ceiling and each cell are timed: the
heaviest layers reach the board's power limit within their timing window and run below the
clock of the ceiling's short synchronized matmuls.

    python benchmarks/gpu/bench_triton.py --out DIR [--preset ...] [--m ...] [--dtypes bf16 int4 mxfp4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).parent
PRESETS = ("qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v3")
MS = (1, 8, 32, 128, 512, 2048, 8192)


class ClockSampler:
    """Median SM clock (MHz) over a block, sampled every 5 ms from NVML (`torch.cuda.clock_rate`) on a
    thread; `median` is None where NVML cannot be read (no pynvml, or not an NVIDIA GPU)."""

    PERIOD_S = 0.005

    def __init__(self, device: torch.device):
        self.device = device
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.PERIOD_S):
            self.samples.append(torch.cuda.clock_rate(self.device))

    def __enter__(self) -> ClockSampler:
        try:
            self.samples.append(torch.cuda.clock_rate(self.device))
        except Exception:  # no NVML here: the benchmark runs without clocks
            return self
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self._thread is not None else None


def _mhz(clock: float | None) -> str:
    return f"{clock:.0f} MHz" if clock is not None else "n/a"


def measure_ceilings() -> dict:
    n = 1 << 30  # 2 GiB of bf16
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    times = []
    for _ in range(23):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    copy_bw = 2 * src.numel() * 2 / statistics.median(times[3:])
    del src, dst
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    times = []
    with ClockSampler(x.device) as clock:
        for _ in range(23):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            x @ y
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
    rate = 2 * 8192**3 / statistics.median(times[3:])
    del x, y
    torch.cuda.empty_cache()
    return {"copy_bytes_per_s": copy_bw, "matmul_flop_per_s": rate, "matmul_sm_clock_mhz": clock.median}


def floor_us(cfg, M: int, bytes_per_param: float, ceilings: dict) -> tuple[float, str]:
    E, k, K, N = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    distinct = E * (1 - (1 - k / E) ** M)
    mem = distinct * 3 * N * K * bytes_per_param / ceilings["copy_bytes_per_s"]
    comp = 2 * M * k * 3 * N * K / ceilings["matmul_flop_per_s"]
    return max(mem, comp) * 1e6, ("m" if mem >= comp else "c")


def _bf16_weights(cfg, dev):
    from moe_core.quant import unquantized
    from moe_core.weights.canonical import ExpertWeights

    E, R, K, N = cfg.num_experts, cfg.w13_rows, cfg.hidden_size, cfg.intermediate_size
    g = torch.Generator(device=dev).manual_seed(0)
    w = ExpertWeights(
        unquantized().weight,
        w13=torch.randn(E, R, K, device=dev, generator=g, dtype=torch.bfloat16) * K**-0.5,
        w2=torch.randn(E, K, N, device=dev, generator=g, dtype=torch.bfloat16) * N**-0.5,
        w13_bias=torch.randn(E, R, device=dev, generator=g) * 0.1 if cfg.has_bias else None,
        w2_bias=torch.randn(E, K, device=dev, generator=g) * 0.1 if cfg.has_bias else None,
    )
    return unquantized(), w


def _mxfp4_weights(cfg, dev):
    """(quant, ExpertWeights) of an MXFP4 layer: random e2m1 codes, e8m0 scales around 2^-6."""
    from moe_core.quant import mxfp4_w4a16
    from moe_core.weights.canonical import ExpertWeights

    quant = mxfp4_w4a16()
    E, R, K, N = cfg.num_experts, cfg.w13_rows, cfg.hidden_size, cfg.intermediate_size
    g = torch.Generator(device=dev).manual_seed(0)
    weights = ExpertWeights(
        quant.weight,
        w13=torch.randint(0, 256, (E, R, K // 2), dtype=torch.uint8, device=dev, generator=g),
        w2=torch.randint(0, 256, (E, K, N // 2), dtype=torch.uint8, device=dev, generator=g),
        w13_scale=torch.randint(118, 124, (E, R, K // 32), dtype=torch.uint8, device=dev, generator=g),
        w2_scale=torch.randint(118, 124, (E, K, N // 32), dtype=torch.uint8, device=dev, generator=g),
        w13_bias=torch.randn(E, R, device=dev, generator=g) * 0.1 if cfg.has_bias else None,
        w2_bias=torch.randn(E, K, device=dev, generator=g) * 0.1 if cfg.has_bias else None,
    )
    return quant, weights


def _reference_touched(x, w, cfg, tw, ti) -> torch.Tensor:
    """fp32 reference over the experts the tokens touch (the full dequantized copy would not fit)."""
    from moe_core.reference import apply_activation

    out = torch.zeros(x.shape[0], cfg.hidden_size, device=x.device)
    for e in ti.unique().tolist():
        tok, slot = (ti == e).nonzero(as_tuple=True)
        h = x[tok].float() @ w.w13[e].float().T
        if w.has_bias:
            h = h + w.w13_bias[e].float()
        y = apply_activation(h, cfg.activation) @ w.w2[e].float().T
        if w.has_bias:
            y = y + w.w2_bias[e].float()
        out.index_add_(0, tok, y * tw[tok, slot, None])
    return out


def correction_bias(cfg, dev) -> torch.Tensor | None:
    """The layer's correction bias where its routing has one (DeepSeek-V3): small, so the routing stays
    close to uniform, which the floor's expected count of distinct experts assumes (a 0.1 bias
    concentrated DeepSeek's choices on fewer experts)."""
    if not cfg.routing.has_correction_bias:
        return None
    return torch.randn(cfg.num_experts, device=dev, generator=torch.Generator(device=dev).manual_seed(0)) * 1e-3


def bench_cell(layer_fn, cfg, M: int, dev, check, bias: torch.Tensor | None) -> dict:
    """layer_fn(x, logits) timed over M tokens; `bias`: the correction bias it routes with (or None)."""
    from triton.testing import do_bench

    sets = 8 if M <= 512 else 2
    gen = torch.Generator(device=dev).manual_seed(M)
    inputs = [(torch.randn(M, cfg.hidden_size, device=dev, generator=gen, dtype=torch.bfloat16),
               torch.randn(M, cfg.num_experts, device=dev, generator=gen)) for _ in range(sets)]
    from moe_core.routing import route_torch

    distinct = statistics.mean(
        route_torch(logits, cfg.routing, cfg.top_k, bias)[1].unique().numel() for _, logits in inputs)
    err = check(inputs[0][0], inputs[0][1]) if check is not None else None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for x, logits in inputs[:1]:
            layer_fn(x, logits)  # compiles and warms up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graphs = []
    for x, logits in inputs:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            layer_fn(x, logits)
        graphs.append(g)
    turn = [0]

    def replay():
        graphs[turn[0] % sets].replay()
        turn[0] += 1

    with ClockSampler(dev) as clock:
        t = do_bench(replay, warmup=10, rep=60, return_mode="median") * 1e3
    graphs.clear()  # free the captured memory before the next cell
    return {"us": t, "err": err, "distinct_experts": distinct, "sm_clock_mhz": clock.median}


def run(args) -> dict:
    import triton

    from moe_core import FusedMoE
    from moe_core.backends import detect_device
    from moe_core.oracle import BackendUnavailableError
    from moe_core.presets import get_preset
    from moe_core.routing import route_torch
    from moe_triton.tune import random_int4_weights

    dev = torch.device("cuda")
    info = detect_device(dev)
    # Anchors were measured on H100 and H200; compare only on the same kind of device.
    anchor_file = HERE / ("anchors_h200.json" if "H200" in info.name else "anchors_h100.json")
    anchors = json.loads(anchor_file.read_text())["tables"] if "H100" in info.name or "H200" in info.name else {}
    ceilings = measure_ceilings()
    print(f"device {info.name}: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"matmul {ceilings['matmul_flop_per_s'] / 1e12:.0f} TFLOP/s at {_mhz(ceilings['matmul_sm_clock_mhz'])}",
          flush=True)
    cells = []
    for name in args.preset:
        preset = get_preset(name)
        cfg = preset.config
        bias = correction_bias(cfg, dev)
        for dtype in args.dtypes:
            if dtype == "int4":
                quant, weights = random_int4_weights(cfg, preset.int4_group_size, dev)
                bpp = 0.5 + 2 / preset.int4_group_size
            elif dtype == "mxfp4":
                quant, weights = _mxfp4_weights(cfg, dev)
                bpp = 0.5 + 1 / 32
            else:
                quant, weights = _bf16_weights(cfg, dev)
                bpp = 2.0
            try:
                layer = FusedMoE(cfg, quant, device=dev, prefer="triton")
            except BackendUnavailableError as exc:
                cells.append({"model": name, "dtype": dtype, "skipped": str(exc).splitlines()[0]})
                continue
            layer.load_weights(weights, correction_bias=bias)
            experts = layer.experts
            router = f"{layer.plan.router.__module__}.{layer.plan.router.__name__}"

            def check(x, logits, layer=layer, cfg=cfg, weights=weights, dtype=dtype, bias=bias):
                if dtype != "bf16":
                    return None
                tw, ti = route_torch(logits, cfg.routing, cfg.top_k, bias)
                ref = _reference_touched(x, weights, cfg, tw, ti)
                out = layer(x, logits).float()
                return float((out - ref).norm() / ref.norm())

            for M in args.m:
                floor, bound = floor_us(cfg, M, bpp, ceilings)
                cell = {"model": name, "dtype": dtype, "M": M, "floor_us": floor, "bound": bound,
                        "experts": experts.name(), "router": router}
                try:
                    cell.update(bench_cell(layer, cfg, M, dev, check if M <= 512 else None, bias))
                except Exception as exc:  # recorded in the results, never hidden
                    cell["error"] = f"{type(exc).__name__}: {exc}"[:300]
                    print(f"{name} {dtype} M={M}: {cell['error']}", flush=True)
                    cells.append(cell)
                    continue
                if hasattr(experts, "config_for"):
                    cell["config"] = str(experts.config_for(M))
                cell["floor_fraction"] = floor / cell["us"]
                anchor = anchors.get(dtype, {}).get(name, {}).get(str(M))
                if anchor:
                    cell["anchor_us"] = anchor["us"]
                    cell["anchor"] = anchor["anchor"]
                    cell["speedup_vs_anchor"] = anchor["us"] / cell["us"]
                cells.append(cell)
                print(f"{name:16s} {dtype:5s} M={M:5d} {cell['us']:9.1f} us  floor {floor:8.1f} ({bound}) "
                      f"frac {cell['floor_fraction']:.2f}  vs anchor {cell.get('speedup_vs_anchor', 0):.2f}x "
                      f"err {cell['err'] if cell['err'] is not None else '-'}  SM {_mhz(cell['sm_clock_mhz'])}",
                      flush=True)
            del layer, experts, weights
            torch.cuda.empty_cache()
    return {"device": info.name, "capability": list(info.capability or ()), "torch": torch.__version__,
            "triton": triton.__version__, "started": args.started, "ceilings": ceilings, "cells": cells,
            "anchors": anchor_file.name if anchors else "none for this device",
            "protocol": __doc__.split("\n\n")[1].replace("\n", " ")}


def write_markdown(result: dict, path: Path) -> None:
    c = result["ceilings"]
    lines = [f"# moe-triton whole-layer benchmark on {result['device']}", "",
             f"torch {result['torch']}, triton {result['triton']}, started {result['started']}.", "",
             f"Ceilings measured in this run: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s (read+write), "
             f"8192^3 bf16 matmul {c['matmul_flop_per_s'] / 1e12:.0f} TFLOP/s (median SM clock while it ran: "
             f"{_mhz(c.get('matmul_sm_clock_mhz'))}).", "",
             result["protocol"], "",
             f"Cells: time us (floor/time); `vs anchor` = anchor best time / our time (>1: faster than the "
             f"fastest anchor; anchors from {result['anchors']}, measured on the same kind of device).", ""]
    for dtype in ("bf16", "int4", "mxfp4"):
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
                    lines.append(f"| {x['model']} | {x['M']} | {x['floor_us']:.1f} | error: {x['error']} | | | | | |")
                    continue
                err = f"{x['err']:.1e}" if x.get("err") is not None else ""
                lines.append(f"| {x['model']} | {x['M']} | {x['floor_us']:.1f} {x['bound']} | {x['us']:.1f} "
                             f"({x['floor_fraction']:.2f}) | {x.get('anchor_us', '')} {x.get('anchor', '')} | "
                             f"{x.get('speedup_vs_anchor', 0):.2f} | {err} | {_mhz(x.get('sm_clock_mhz'))} | "
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
    p.add_argument("--m", nargs="*", type=int, default=list(MS))
    p.add_argument("--dtypes", nargs="*", default=["bf16", "int4"], choices=["bf16", "int4", "mxfp4"])
    args = p.parse_args(argv)
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
