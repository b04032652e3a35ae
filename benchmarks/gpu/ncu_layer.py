"""One whole-layer call of a preset, made twice, for Nsight Compute to read the kernels' counters.

    ncu --clock-control none --kernel-name regex:_moe_wgemm --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight ... python3 benchmarks/gpu/ncu_layer.py --preset deepseek-v3 --m 1

The first call compiles and warms up; `--launch-skip` passes over its kernels so the counters
come from the second call. Weights are the tuner's random int4 layer (`moe_triton.tune`), or
random bf16 weights with --dtype bf16.
"""

from __future__ import annotations

import argparse
import json

import torch

from moe_core.oracle import apply_layer
from moe_core.presets import get_preset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", required=True)
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--dtype", default="int4", choices=["int4", "bf16"])
    p.add_argument("--config", help="launch shapes to force, as JSON: int4 a QuantKernelConfig "
                                    '(\'{"gemm1": {...}, "gemm2": {...}}\'), bf16 a KernelConfig (with block_m); '
                                    "default: the tuned files")
    args = p.parse_args()
    dev = torch.device("cuda")
    preset = get_preset(args.preset)
    cfg = preset.config
    if args.dtype == "int4":
        from moe_triton.tune import _random_int4_layer
        experts = _random_int4_layer(preset, dev)
        if args.config:
            from moe_triton.configs import QuantKernelConfig
            experts.config_override = QuantKernelConfig.from_dict(json.loads(args.config))
    else:
        from bench_triton import _bf16_weights

        from moe_core.backends import detect_device
        from moe_core.quant import unquantized
        from moe_triton.experts import TritonExperts
        experts = TritonExperts(cfg, unquantized(), detect_device(dev))
        experts.load_weights(_bf16_weights(cfg, dev)[1])
        if args.config:
            from moe_triton.configs import KernelConfig
            experts.config_override = KernelConfig.from_dict(json.loads(args.config))
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(args.m, cfg.hidden_size, device=dev, generator=gen).to(torch.bfloat16)
    logits = torch.randn(args.m, cfg.num_experts, device=dev, generator=gen)
    bias = torch.randn(cfg.num_experts, device=dev, generator=gen) * 1e-3 if cfg.routing.has_correction_bias else None
    for _ in range(2):
        apply_layer(experts, x, logits, bias)  # as FusedMoE calls it
    torch.cuda.synchronize()
    print(f"{args.preset} {args.dtype} M={args.m}: {experts.config_for(args.m)}")


if __name__ == "__main__":
    main()
