"""Why moe-triton's `act_quant` moves 0.2-0.3 TB/s on some shapes and 1.5 TB/s on others.

On the H200 its group-128 fp8 quantization of [2048, 2048] bf16 rows (no activation: an fp8 layer's
GEMM1 input) took 41 us, where [16384, 1536] gated rows to [16384, 768] took 40 us for six times the
bytes (benchmarks/results/vendor_parity_2026-11-29.md). This times the kernel per shape and mode at
its own launch shape and at other warp counts (the one launch parameter it picks per width), beside
a torch copy of the same input bytes for the bandwidth this protocol reaches. GPU time per launch:
twenty launches in one CUDA graph, replayed (no L2 flush: the inputs of the larger cases exceed L2).

    python3 act_quant_sweep.py --out DIR      -> DIR/act_quant_sweep.json, one line per case printed
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from moe_core.config import Activation
from moe_triton._common.activation import ActKind, act_kind
from moe_triton._common.intmath import next_power_of_2
from moe_triton._common.pdl import dependent_options
from moe_triton.act_quant import QMode, _act_quant_kernel, act_quant

# (rows, input width, activation, mode): the shapes the fp8 layers quantize.
CASES = [
    (2048, 2048, None, QMode.GROUP128),  # qwen3-30b-a3b GEMM1 input, 2048 tokens
    (2048, 2048, None, QMode.TOKEN),
    (16384, 1536, "silu", QMode.GROUP128),  # its GEMM2 input (pairs, gated 2 x 768)
    (16384, 1536, "silu", QMode.NONE),
    (2048, 4096, None, QMode.GROUP128),  # mixtral-8x7b
    (2048, 7168, None, QMode.GROUP128),  # deepseek-v3
    (16384, 2048, None, QMode.GROUP128),  # qwen3 rows after a gather (the earlier SGLang flow)
]


def time_us(fn, launches: int = 20, replays: int = 10) -> float:
    """GPU time per launch: `launches` launches captured in one CUDA graph, replayed (a Triton launch
    from Python costs ~20 us of host time on the H200 host, more than these kernels take)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (launches * replays)


def sweep(rows: int, width: int, act_name: str | None, qmode: QMode) -> list[dict]:
    activation = Activation(act_name) if act_name else None
    h = torch.randn(rows, width, device="cuda").bfloat16()
    kind = ActKind.NONE if activation is None else act_kind(activation)
    n = width // 2 if act_name else width
    out_dtype = torch.bfloat16 if qmode is QMode.NONE else torch.float8_e4m3fn
    y, scales = act_quant(h, activation, qmode, out_dtype, rows)
    block = max(next_power_of_2(n), 128)
    chosen = min(16, max(1, block // 512))  # act_quant's own choice
    s_arg = scales if scales is not None else torch.empty(1, device="cuda")

    def launch(warps: int) -> None:
        _act_quant_kernel[(rows,)](h, y, s_arg, s_arg, s_arg, n, h.stride(0), y.stride(0),
                                   s_arg.stride(0) if scales is not None else 0, 1, 0.0, 0.0,
                                   ACT=int(kind), QMODE=int(qmode), PHASE=0, GATE_UP_CHUNK=0, BLOCK=block,
                                   INTERPRET=False, num_warps=warps, **dependent_options(h.device))

    copy_out = torch.empty_like(h)
    copy = time_us(lambda: copy_out.copy_(h))
    moved = h.numel() * 2 + y.numel() * y.element_size()
    out = []
    for warps in (1, 2, 4, 8, 16):
        us = time_us(lambda w=warps: launch(w))
        out.append({"rows": rows, "width": width, "activation": act_name, "mode": qmode.name, "warps": warps,
                    "chosen": warps == chosen, "us": round(us, 2), "tb_s": round(moved / us / 1e6, 3),
                    "copy_us": round(copy, 2)})
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in CASES:
        rows += sweep(*case)
        (args.out / "act_quant_sweep.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
