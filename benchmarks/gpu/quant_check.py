"""Time TritonWna16Experts (int4) on the anchor shapes (anchors-h100.md or -h200.md, by device), against the floor.

Protocol as the anchors: the whole layer (routing + align + GEMM1 + activation + GEMM2 + top-k
sum) captured in a CUDA graph, `triton.testing.do_bench` median over replays (it flushes L2
between calls); floor = the anchor file's floor (time x floor fraction), and our own floor from the
copy bandwidth measured in the same run. Weights are random codes and scales made on the GPU
(correctness at real shapes is tests/test_quant.py's GPU part).

The table reports the layer as shipped (a tuned file's launch shapes, else the `pick_config`
heuristic); `--sweep-ms` also times the tuner's candidates (`moe_triton.tune.quant_candidates`: the
heuristic and its neighbours) at those M (reported per cell under "variants", never folded into
the table's time).
A compact line per cell is printed; the last lines are the table.

usage: python benchmarks/gpu/quant_check.py OUT_DIR [--models a,b] [--ms 1,8] [--sweep-ms 8,512]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch
import triton

# The same ceilings, floor and random int4 layer as the protocol benchmark beside this script.
from bench_triton import floor_us, measure_ceilings

from moe_core.presets import get_preset
from moe_triton.routing import route
from moe_triton.tune import _graph_time_us, _random_int4_layer, quant_candidates

MODELS = ["qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v3"]
MS = [1, 8, 32, 128, 512, 2048, 8192]
def _anchors(device_name: str) -> dict:
    """The int4 anchor table measured on the same kind of device (H100 or H200)."""
    name = "anchors_h200.json" if "H200" in device_name else "anchors_h100.json"
    return json.loads((pathlib.Path(__file__).parent / name).read_text())["tables"]["int4"]


def time_layer(experts, cfg, M: int, correction) -> float:
    gen = torch.Generator(device="cuda").manual_seed(M)
    x = torch.randn(M, cfg.hidden_size, device="cuda", generator=gen).to(torch.bfloat16)
    logits = torch.randn(M, cfg.num_experts, device="cuda", generator=gen)

    def layer():
        tw, ids = route(logits, cfg.routing, cfg.top_k, correction)
        return experts.apply(x, tw, ids)

    return _graph_time_us(layer, rep_ms=80)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--sweep-ms", default="", help="M values at which to also time tile/split variants")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name()
    ceilings = measure_ceilings()
    print(f"device {device_name}, copy bandwidth {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, matmul "
          f"{ceilings['matmul_flop_per_s'] / 1e12:.0f} TFLOP/s, triton {triton.__version__}", flush=True)
    anchors = _anchors(device_name)
    rows = []
    for name in args.models.split(","):
        preset = get_preset(name)
        cfg = preset.config
        t0 = time.time()
        experts = _random_int4_layer(preset, torch.device("cuda"))
        correction = (torch.randn(cfg.num_experts, device="cuda") * 0.01
                      if cfg.routing.has_correction_bias else None)
        print(f"{name}: weights ready in {time.time() - t0:.1f}s", flush=True)
        for M in map(int, args.ms.split(",")):
            # shipped: a tuned file's entry, else the heuristic; the sweep: the tuner's candidates.
            variants = {"shipped": None}
            if str(M) in args.sweep_ms.split(","):
                variants.update(quant_candidates(experts.heuristic_config(M)))
            times = {}
            for vname, launch in variants.items():
                experts.config_override = launch
                try:
                    us = time_layer(experts, cfg, M, correction)
                except Exception as exc:  # a variant that does not compile is reported, not fatal
                    print(f"  {name} M={M} {vname}: failed {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                finally:
                    experts.config_override = None
                times[vname] = round(us, 1)
            if "shipped" not in times:
                continue
            us = times["shipped"]
            best = min(times, key=times.get)
            anchor = anchors[name][str(M)]
            floor = anchor["us"] * anchor["floor_fraction"]
            own_floor, _ = floor_us(cfg, M, 0.5 + 2 / preset.int4_group_size, ceilings)
            row = {"model": name, "M": M, "us": us, "variants": times, "config": str(experts.config_for(M)),
                   "floor_us": round(floor, 1), "floor_fraction": round(floor / us, 3),
                   "own_floor_us": round(own_floor, 1), "anchor_us": anchor["us"],
                   "speedup_vs_anchor": round(anchor["us"] / us, 2)}
            rows.append(row)
            print(f"  {name:16s} M={M:5d} {us:9.1f} us  floor {floor:8.1f} ({floor / us:.2f})  "
                  f"anchor {anchor['us']:8.1f} (x{anchor['us'] / us:.1f})  best {best} {times[best]}", flush=True)
        del experts
        torch.cuda.empty_cache()
    (out / "quant_int4.json").write_text(json.dumps({"device": device_name, "ceilings": ceilings,
                                                     "triton": triton.__version__, "torch": torch.__version__,
                                                     "rows": rows}, indent=1))
    print("\n| model | M | us | floor fraction | x anchor |")
    for r in rows:
        print(f"| {r['model']} | {r['M']} | {r['us']} | {r['floor_fraction']} | {r['speedup_vs_anchor']} |")


if __name__ == "__main__":
    main()
