"""One whole-layer call of a preset, made twice, for Nsight Compute to read the kernels' counters.

    ncu --clock-control none --kernel-name regex:_moe_wgemm --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight ... python3 benchmarks/gpu/ncu_layer.py --preset deepseek-v3 --m 1

The first call compiles and warms up; `--launch-skip` passes over its kernels so the counters
come from the second call. The layer, weights and inputs are bench_layer.py's (layer_timing.py).
"""

from __future__ import annotations

import argparse
import json

import torch
from layer_timing import DTYPES, PRESETS, build_layer, input_sets

from moe_core.presets import get_preset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", required=True, choices=PRESETS)
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--dtype", default="int4", choices=DTYPES)
    p.add_argument("--config", help="launch shapes to force, as JSON: int4/mxfp4 a moe_triton.configs."
                                    'QuantKernelConfig (\'{"gemm1": {...}, "gemm2": {...}}\'), bf16 a KernelConfig '
                                    "(with block_m); default: the tuned files")
    args = p.parse_args()
    dev = torch.device("cuda")
    preset = get_preset(args.preset)
    layer = build_layer(preset, args.dtype, dev)
    if args.config:
        from moe_triton.configs import KernelConfig, QuantKernelConfig

        config_cls = KernelConfig if args.dtype == "bf16" else QuantKernelConfig
        layer.experts.config_override = config_cls.from_dict(json.loads(args.config))
    x, logits = input_sets(preset, args.m, dev, sets=1)[0]
    for _ in range(2):
        layer(x, logits)
    torch.cuda.synchronize()
    print(f"{args.preset} {args.dtype} M={args.m}: {layer.experts.config_for(args.m)}")


if __name__ == "__main__":
    main()
