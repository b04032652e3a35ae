"""Host overhead of the CPU backend at one token: the share of a layer call spent outside its torch ops.

A qwen3-30b-a3b layer (bf16 and int4) on the `cpu` backend, called with one token: the median wall
time of a call, and, from torch.profiler over the same calls, the time inside the top-level torch ops
(their CPU time, children included). overhead = 1 - ops / call: Python, argument checks, routing
bookkeeping. Prints one line per scheme.

    uv run python benchmarks/cpu_host_overhead.py [--threads N] [--calls 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from moe_core import ExpertWeights, FusedMoE
from moe_core.presets import get_preset
from moe_core.quant import int4_w4a16, unquantized


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    preset = get_preset("qwen3-30b-a3b")
    for name, quant in (("bf16", unquantized()), ("int4", int4_w4a16(preset.int4_group_size))):
        layer = FusedMoE(preset.config, quant, device="cpu", prefer="cpu")
        layer.load_weights(ExpertWeights.random(preset.config, layer.quant, seed=0))
        gen = torch.Generator().manual_seed(1)
        inputs = [(torch.randn(1, preset.config.hidden_size, generator=gen).to(torch.bfloat16),
                   torch.randn(1, preset.config.num_experts, generator=gen)) for _ in range(args.calls)]
        with torch.no_grad():
            for x, logits in inputs[:5]:
                layer(x, logits)
            walls = []
            for x, logits in inputs:
                t0 = time.perf_counter()
                layer(x, logits)
                walls.append(time.perf_counter() - t0)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for x, logits in inputs:
                    layer(x, logits)
        # Top-level ops only: an op event not inside another op event.
        events = sorted((e for e in prof.events() if e.name.startswith(("aten::", "onednn", "mkldnn"))),
                        key=lambda e: e.time_range.start)
        op_us, end = 0.0, -1.0
        for e in events:
            if e.time_range.start >= end:
                op_us += e.time_range.end - e.time_range.start
                end = e.time_range.end
        call_us = statistics.median(walls) * 1e6
        per_call_ops = op_us / len(inputs)
        print(f"{name}: call {call_us:.0f} us (median of {len(walls)}), in torch ops {per_call_ops:.0f} us per call, "
              f"host overhead {max(0.0, 1 - per_call_ops / call_us):.1%} ({args.threads} threads, "
              f"torch {torch.__version__})")


if __name__ == "__main__":
    main()
