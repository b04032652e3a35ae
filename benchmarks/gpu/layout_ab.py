"""A/B of the 4-bit weights' memory order on one GPU: tile-major vs untiled.

The codes are [E, N, K tiles, words per tile] (`quant_gemm`'s docstring) and the kernel reads them
through strides, so the same values can sit in several orders:
- tile-major ([E, K tile, N, word] in memory): a program's K tile is one run of
  block_n * block_k / 2 bytes (shipped for the int16 quads);
- untiled: for the quads row-major ([E, N, K tile, word]: 64-byte pieces of block_n rows), for
  the uint8 halves K-major ([E, K tile, byte, N]: block_k / 2 runs of block_n bytes; shipped).
Per preset x M the whole layer is timed with bench_triton's protocol, alternating A, B, A, B on the
shipped launch shapes, and B's output is checked against A's.

    python benchmarks/gpu/layout_ab.py --out DIR [--dtype int4|mxfp4] [--preset ...] [--m ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch

from moe_triton._details.quant_gemm import stored_k_major, stored_tile_major

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


def untiled(codes: torch.Tensor) -> torch.Tensor:
    """The same [E, N, T, W] values stored row-major (int16 quads) or K-major (uint8 halves)."""
    return codes.contiguous() if codes.dtype == torch.int16 else stored_k_major(codes)


def main(argv=None) -> int:
    from bench_triton import PRESETS, _mxfp4_weights, bench_cell

    from moe_core.backends import detect_device
    from moe_core.presets import get_preset
    from moe_triton.quantized import TritonMxfp4Experts
    from moe_triton.routing import route
    from moe_triton.tune import _random_int4_layer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dtype", choices=["int4", "mxfp4"], default="int4")
    p.add_argument("--preset", nargs="+", default=list(PRESETS))
    p.add_argument("--m", nargs="+", type=int, default=[1, 8, 32, 128, 512, 2048])
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    rows = []
    for name in args.preset:
        cfg = get_preset(name).config
        if args.dtype == "int4":
            experts = _random_int4_layer(get_preset(name), dev)
        else:
            quant, weights = _mxfp4_weights(cfg, dev)
            experts = TritonMxfp4Experts(cfg, quant, detect_device(dev))
            experts.load_weights(weights)
            del weights
        t = experts.weights.tensors
        layouts = {"untiled": (untiled(t["w13"]), untiled(t["w2"])), "tile": (stored_tile_major(t["w13"]), stored_tile_major(t["w2"]))}

        def use(layout: str, t=t, layouts=layouts) -> None:
            t["w13"], t["w2"] = layouts[layout]

        def layer(x, logits, bias, experts=experts, cfg=cfg):
            tw, ti = route(logits, cfg.routing, cfg.top_k, bias)
            return experts.apply(x, tw, ti)

        for M in args.m:
            gen = torch.Generator(device=dev).manual_seed(M)
            x = torch.randn(M, cfg.hidden_size, device=dev, generator=gen, dtype=torch.bfloat16)
            logits = torch.randn(M, cfg.num_experts, device=dev, generator=gen)
            bias = torch.randn(cfg.num_experts, device=dev, generator=gen) * 1e-3 if cfg.routing.has_correction_bias else None
            outs = {}
            for layout in layouts:
                use(layout)
                outs[layout] = layer(x, logits, bias).float()
            err = float((outs["tile"] - outs["untiled"]).norm() / outs["untiled"].norm())
            times = {"untiled": [], "tile": []}
            for layout in ("untiled", "tile", "untiled", "tile"):
                use(layout)
                routed = partial(layer, bias=bias)
                times[layout].append(bench_cell(routed, cfg, M, dev, None, bias)["us"])
            row = {"model": name, "dtype": args.dtype, "M": M, "config": str(experts.config_for(M)),
                   "rel_diff": err, "untiled_us": min(times["untiled"]), "tile_us": min(times["tile"]),
                   "times": times}
            row["speedup"] = row["untiled_us"] / row["tile_us"]
            rows.append(row)
            print(f"{name:16s} {args.dtype} M={M:5d} untiled {row['untiled_us']:8.1f} us  tile {row['tile_us']:8.1f} "
                  f"us  x{row['speedup']:.3f}  rel diff {err:.1e}  {times}", flush=True)
            if err > 1e-2:
                print(f"  MISMATCH: the two orders' outputs differ by {err:.2e}", flush=True)
        del experts, layouts, t
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "rows": rows}
    (args.out / f"layout_ab_{args.dtype}.json").write_text(json.dumps(result, indent=1))
    return 1 if any(r["rel_diff"] > 1e-2 for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
