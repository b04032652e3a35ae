"""Side by side on one GPU: moe-triton against each moe-cuda backend that serves the same cell.

Per cell (preset x scheme x tokens) every backend gets its own `FusedMoE` (forced with `prefer=`) over
the same canonical weights; its output on one input set is compared with Triton's (relative L2
difference; each backend's own accuracy against the fp32 reference is the tests' business), then each
is timed with `triton.testing.do_bench` on eager calls (median; L2 flushed before every call), so the
torch ops around the vendor GEMMs count. A backend that refuses the cell, or fails, gets the reason.

    python benchmarks/gpu/bench_moe_cuda.py --out $OUT [--budget-s 300]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton.testing

from moe_core.layer import FusedMoE
from moe_core.presets import get_preset
from moe_core.quant import MoEQuantConfig, fp8_w8a8, int4_w4a16, unquantized
from moe_core.weights.canonical import ExpertWeights

# (preset, scheme, backends after the Triton baseline, token counts)
CELLS = (
    ("qwen3-30b-a3b", "bf16", ("torch_grouped_mm",), (1, 32, 512, 4096)),
    ("qwen3-30b-a3b", "int4", ("marlin",), (1, 32, 512, 4096)),
    ("mixtral-8x7b", "int4", ("marlin",), (1, 32, 512)),
    ("qwen3-30b-a3b", "fp8-channel", ("torch_grouped_mm",), (1, 32, 512, 4096)),
    ("qwen3-30b-a3b", "fp8-block", ("sglang_fp8_block",), (1, 32, 512, 4096)),
    ("deepseek-v3", "fp8-block", ("sglang_fp8_block",), (1, 128, 2048)),
)


def scheme(name: str, group_size: int) -> MoEQuantConfig:
    return {"bf16": unquantized, "int4": lambda: int4_w4a16(group_size),
            "fp8-channel": lambda: fp8_w8a8("channel"), "fp8-block": lambda: fp8_w8a8("block")}[name]()


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def bench_cell(preset_name: str, scheme_name: str, backends: tuple[str, ...], tokens: tuple[int, ...]) -> list[dict]:
    preset = get_preset(preset_name)
    config, quant = preset.config, scheme(scheme_name, preset.int4_group_size)
    weights = ExpertWeights.random(config, quant, seed=0, device="cuda")
    bias = torch.randn(config.num_experts, device="cuda") * 0.2 if config.routing.has_correction_bias else None
    layers: dict[str, FusedMoE | str] = {}
    for backend in ("triton", *backends):
        try:
            layer = FusedMoE(config, quant, device="cuda", prefer=backend)
            layer.load_weights(weights, bias)
            layers[backend] = layer
        except Exception as exc:  # a refusal or a load failure is a result of the benchmark
            layers[backend] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for m in tokens:
        x = torch.randn(m, config.hidden_size, generator=gen, device="cuda").to(config.dtype)
        logits = torch.randn(m, config.num_experts, generator=gen, device="cuda")
        baseline = None
        for backend, layer in layers.items():
            row = {"preset": preset_name, "scheme": scheme_name, "M": m, "backend": backend}
            if isinstance(layer, str):
                rows.append(row | {"error": layer})
                continue
            try:
                with torch.no_grad():
                    start = time.perf_counter()
                    out = layer(x, logits)
                    torch.cuda.synchronize()
                    row["first_call_s"] = round(time.perf_counter() - start, 3)
                    if baseline is None:
                        baseline = out
                    row["rel_diff_vs_triton"] = rel_diff(out, baseline)
                    row["us"] = 1e3 * triton.testing.do_bench(lambda layer=layer, x=x, logits=logits: layer(x, logits),
                                                              warmup=10, rep=50, return_mode="median")
                    row["experts"] = layer.plan.experts_cls.name()
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    del layers, weights
    torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| preset | scheme | M | backend | us | x Triton | rel. diff vs Triton | note |",
             "|---|---|---|---|---|---|---|---|"]
    triton_us = {(r["preset"], r["scheme"], r["M"]): r.get("us") for r in rows if r["backend"] == "triton"}
    for r in rows:
        base = triton_us.get((r["preset"], r["scheme"], r["M"]))
        us = r.get("us")
        ratio = f"{base / us:.2f}" if us and base else ""
        lines.append(f"| {r['preset']} | {r['scheme']} | {r['M']} | {r['backend']} | "
                     f"{us:.1f} | {ratio} | {r.get('rel_diff_vs_triton', float('nan')):.1e} | {r.get('error', '')} |"
                     if us else f"| {r['preset']} | {r['scheme']} | {r['M']} | {r['backend']} |  |  |  | "
                     f"{r.get('error', '')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=300.0, help="skip the cells left after this long")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name().replace(" ", "_")
    rows: list[dict] = []
    start = time.perf_counter()
    for cell in CELLS:
        if time.perf_counter() - start > args.budget_s:
            rows.append({"preset": cell[0], "scheme": cell[1], "M": 0, "backend": "-", "error": "skipped: budget"})
            continue
        rows += bench_cell(*cell)
    payload = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    (out / f"bench_moe_cuda_{device}.json").write_text(json.dumps(payload, indent=1))
    table = markdown(rows)
    (out / f"bench_moe_cuda_{device}.md").write_text(table)
    print(table)
    return 0 if all(r.get("error", "skipped").startswith("skipped") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
