"""Host memory during `fuse()` of a real-shape model on the CPU, against its bound.

A qwen3-30b-a3b causal LM (real widths, --layers decoder layers, transformers' random bf16 weights) is
built on the CPU, then fused on the `cpu` backend with each scheme asked for; a thread samples the
process's anonymous RSS every 5 ms. Prints the model's size, its largest decoder layer, and the RSS
peak during `fuse()` above the RSS before it, against issue 55's bound for `fuse()`: the model plus
1.2x its largest layer (stated for GPU memory; here the host's, where the model lives).

    uv run python benchmarks/cpu_fuse_memory.py [--layers 4] [--schemes bf16 int4 mxfp4]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

GIB = 2**30


def measure(scheme: str, layers: int) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
    from bench_load_checkpoint import HostMemory
    from hf_models import build_model
    from layer_timing import layer_quant

    from moe_core.integrations.transformers import fuse
    from moe_core.presets import get_preset

    model = build_model("qwen3-30b-a3b", layers, torch.device("cpu"))
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    largest = max(sum(t.numel() * t.element_size() for t in layer.parameters()) for layer in model.model.layers)
    memory = HostMemory(interval_s=0.005)
    before = memory.sample()["RssAnon"]
    quant = None if scheme == "bf16" else layer_quant(get_preset("qwen3-30b-a3b"), scheme)
    with memory:
        report = fuse(model, quant=quant, prefer="cpu")
    peak, after = memory.peak["RssAnon"], memory.sample()["RssAnon"]
    backends = sorted({layer.plan.experts_cls.name() for layer in report.layers})
    return (f"{scheme:<6} {', '.join(backends):<24} model {size / GIB:.2f} GiB, largest layer {largest / GIB:.2f}: "
            f"RSS before {before / GIB:.2f}, peak {peak / GIB:.2f}, after {after / GIB:.2f}; "
            f"peak - before {(peak - before) / GIB:.2f} (bound 1.2 x largest layer: {1.2 * largest / GIB:.2f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--schemes", nargs="+", default=["bf16", "int4", "mxfp4"])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(measure(args.one, args.layers), flush=True)
        return 0
    for scheme in args.schemes:  # one process each: a scheme's memory must not count in the next one's
        subprocess.run([sys.executable, __file__, "--one", scheme, "--layers", str(args.layers)], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
