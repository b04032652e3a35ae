"""The one-launch decode path (`moe_triton.fused_decode`) against the triton layer and the cell's
measured limit, under the benchmark protocol (CUDA graphs, the L2 flushed before each replay, median).

For each preset, scheme (int4 at the preset's group size, int8 per channel, MXFP4) and token count:
- layer_us: the triton `FusedMoE` (layer_timing.build_layer) on the cell's input sets;
- fused_us: `FusedDecode.from_logits` (routing in the same launch) on the same layer's packed weights
  for each of the tuner's launch options (`tune.FUSED_OPTIONS`: channels a program, num_warps, block_h,
  k_split);
- read_us: one kernel reading the bytes the call must read (decode_limits.read_us), the limit;
- rel_diff: each option's output (called after its timing) against the layer's on the first input set.

    python3 bench_fused_decode.py --out DIR [--presets ...] [--schemes int4 int8 mxfp4] [--tokens 1 8]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import triton
from decode_limits import layer_cell, read_us, record
from layer_timing import build_layer, correction_bias, layer_quant

from moe_core.bench import time_cuda_layer
from moe_core.presets import get_preset
from moe_triton.fused_decode import FusedDecode, unsupported_reason
from moe_triton.tune import FUSED_OPTIONS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["qwen3-30b-a3b", "gpt-oss-120b", "mixtral-8x7b",
                                                          "qwen3-235b-a22b", "deepseek-v3"])
    parser.add_argument("--schemes", nargs="+", default=["int4", "int8", "mxfp4"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": []}
    path = args.out / "fused_decode.json"
    for name in args.presets:
        preset = get_preset(name)
        bias = correction_bias(preset, dev)
        for scheme in args.schemes:
            layer = build_layer(preset, scheme, dev)
            reason = unsupported_reason(layer.experts)
            if reason is not None:
                print(f"{name} {scheme}: {reason}", flush=True)
                continue
            for tokens in args.tokens:
                inputs, _, nbytes, layer_us = layer_cell(preset, layer, layer_quant(preset, scheme), tokens, dev)
                row = {"preset": name, "scheme": scheme, "tokens": tokens, "bytes": nbytes, "layer_us": layer_us,
                       "fused_us": {}, "rel_diff": {}}
                x0, logits0 = inputs[0]
                expected = layer(x0, logits0).float()
                for channels, warps, block_h, k_split in FUSED_OPTIONS:
                    fused = FusedDecode(layer.experts, channels=channels, num_warps=warps, block_h=block_h,
                                        k_split=k_split)

                    def one(x, logits, fused=fused, bias=bias):
                        return fused.from_logits(x, logits, bias)

                    samples, _ = time_cuda_layer(one, inputs)
                    option = f"c{channels}-w{warps}-h{block_h}-k{k_split}"
                    row["fused_us"][option] = round(statistics.median(samples) * 1e6, 2)
                    got = one(x0, logits0).float()
                    row["rel_diff"][option] = round(float((got - expected).norm() / expected.norm()), 5)
                row["read_us"] = round(read_us(nbytes), 2)
                best = min(row["fused_us"].values())
                row["fused_over_layer"] = round(best / row["layer_us"], 3)
                row["fused_over_limit"] = round(best / row["read_us"], 3)
                record(result, path, row)
            del layer
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
