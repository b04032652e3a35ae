"""The matmul limit of prefill-size layer calls under the benchmark protocol, beside the layer itself.

Where a cell's roofline floor is its GEMMs' flops at the 8192^3 matmul rate (W8A16 from about 512 tokens
on), the floor assumes the layer's many small expert GEMMs run at the rate of one large square one. This
measures what the GPU's own grouped GEMM does with the same work. For each preset, scheme and token count
(default 512 and 2048), under the same protocol as every cell (CUDA graphs over the cell's input sets, the
L2 flushed before each replay, median; `moe_core.bench.time_cuda_layer`):

- layer_us: the triton `FusedMoE` of that scheme, routing with a correction bias of `--bias-std`
  (default `moe bench`'s, so deepseek-v3's cells route as in the H200 matrix);
- grouped_mm_us: the layer's two GEMMs alone in bf16, `torch._grouped_mm` (CUTLASS on Hopper) over the
  input set's routed rows already sorted by expert (each expert's pair count as routed): no routing,
  gather, dequantization, activation or sum, but bf16 weights (twice int8's bytes). W8A16 computes in
  bf16: this is what the GPU's library grouped GEMM takes for the same GEMMs;
- dense_mm_us: the same rows through one expert's weights (two `torch.mm`): the matmul rate of this
  many rows with no grouping at all;
- floor_us: the roofline floor (`moe_core.bench.roofline_floor`, this run's ceilings).

    python3 matmul_limits.py --out DIR [--presets ...] [--schemes int8 bf16] [--tokens 512 2048]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
import triton
from layer_timing import PRESETS, build_layer, correction_bias, input_sets, layer_quant, time_layer

from moe_core.bench import CORRECTION_BIAS_STD, measure_ceilings, roofline_floor, routed_work
from moe_core.oracle import BackendUnavailableError
from moe_core.presets import get_preset
from moe_core.routing import route_torch


def protocol_us(calls: dict[int, Callable[[], None]], inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Median microseconds under the layer protocol (`layer_timing.time_layer`) of the call each input
    set maps to (by its hidden-states tensor), the sets taken in turn."""
    return time_layer(lambda x, logits: calls[id(x)](), inputs)["us"]


def gemm_calls(config, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, gen: torch.Generator):
    """(grouped, dense) callables for one input set's routing `ids` [M, top_k]: both GEMMs over the
    routed rows sorted by expert, grouped per expert or through expert 0 alone."""
    dev = w13.device
    counts = torch.bincount(ids.flatten().long(), minlength=config.num_experts)
    offs = counts.cumsum(0).to(torch.int32)
    pairs = int(counts.sum())
    a1 = torch.randn(pairs, config.hidden_size, device=dev, dtype=torch.bfloat16, generator=gen)
    a2 = torch.randn(pairs, config.intermediate_size_per_partition, device=dev, dtype=torch.bfloat16, generator=gen)
    # [E, K, N] column-major views of the [E, N, K] weights: the layout torch._grouped_mm reads on Hopper.
    b13, b2 = w13.transpose(1, 2), w2.transpose(1, 2)

    def grouped():
        torch._grouped_mm(a1, b13, offs=offs)
        torch._grouped_mm(a2, b2, offs=offs)

    def dense():
        torch.mm(a1, b13[0])
        torch.mm(a2, b2[0])

    return grouped, dense, int(counts.max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--schemes", nargs="+", default=["int8", "bf16"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--bias-std", type=float, default=CORRECTION_BIAS_STD,
                        help=f"correction bias deviation for routings that take one (default {CORRECTION_BIAS_STD:g}, "
                             "moe bench's)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    ceilings = measure_ceilings(dev, torch.bfloat16)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "bias_std": args.bias_std, "matmul_flop_per_s": ceilings.matmul_flop_per_s, "rows": []}
    path = args.out / "matmul_limits.json"
    for name in args.presets:
        preset = get_preset(name)
        config = preset.config
        gen = torch.Generator(device=dev).manual_seed(0)
        bias = correction_bias(preset, dev, args.bias_std)
        shape13 = (config.num_experts, config.w13_rows, config.hidden_size)
        shape2 = (config.num_experts, config.hidden_size, config.intermediate_size_per_partition)
        w13 = torch.randn(shape13, device=dev, dtype=torch.bfloat16, generator=gen)
        w2 = torch.randn(shape2, device=dev, dtype=torch.bfloat16, generator=gen)
        for tokens in args.tokens:
            inputs = input_sets(preset, tokens, dev)
            routed = [gemm_calls(config, route_torch(logits, config.routing, config.top_k, bias)[1], w13, w2, gen)
                      for _, logits in inputs]
            grouped_us = protocol_us({id(x): r[0] for (x, _), r in zip(inputs, routed)}, inputs)
            dense_us = protocol_us({id(x): r[1] for (x, _), r in zip(inputs, routed)}, inputs)
            work = routed_work(config, [logits for _, logits in inputs], bias)
            for scheme in args.schemes:
                quant = layer_quant(preset, scheme)
                try:
                    layer = build_layer(preset, scheme, dev, bias_std=args.bias_std)
                except BackendUnavailableError as exc:
                    print(f"{name} {scheme}: refused ({str(exc).splitlines()[0][:160]})", flush=True)
                    continue
                layer_us = time_layer(layer, inputs)["us"]
                floor = roofline_floor(config, quant, work, ceilings)
                row = {"preset": name, "scheme": scheme, "tokens": tokens, "experts": work.experts,
                       "pairs": work.pairs, "busiest_expert_pairs": max(r[2] for r in routed),
                       "layer_us": round(layer_us, 1), "grouped_mm_us": round(grouped_us, 1),
                       "dense_mm_us": round(dense_us, 1), "floor_us": round(floor.seconds * 1e6, 1),
                       "floor_bound": floor.bound, "compute_floor_us": round(floor.compute_s * 1e6, 1)}
                row["layer_over_grouped_mm"] = round(row["layer_us"] / row["grouped_mm_us"], 3)
                row["grouped_mm_of_compute_floor"] = round(row["compute_floor_us"] / row["grouped_mm_us"], 3)
                result["rows"].append(row)
                path.write_text(json.dumps(result, indent=1))
                print(json.dumps(row), flush=True)
                del layer
                torch.cuda.empty_cache()
        del w13, w2
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
