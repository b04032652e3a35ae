"""The physical limit of decode-size layer calls under the benchmark protocol, beside the layer itself.

For each preset, scheme and token count (default 1 and 8), under the same protocol as every cell (CUDA
graphs, the L2 flushed before each replay, the mean over the input sets of each set's median;
`moe_core.bench.time_cuda_layer`, `mean_call_seconds`):

- layer_us: the triton `FusedMoE` (layer_timing.build_layer) on the cell's input sets;
- read_us: one kernel reading as many bytes as the mean call must (the distinct experts the input sets'
  routing selects, their mean, `moe_core.bench.routed_work`, times `expert_weight_bytes`) from a contiguous
  buffer, the fastest of the read ceiling's Triton reads (`moe_core.bench._stream_read`: 16 and 64 KiB per
  program) and torch's sum: what streaming those
  bytes costs after the flush, which at a few MB is latency, not bandwidth;
- routed_read_us (one token): one kernel whose programs first route the token (top-k of its logits, plus the
  correction bias where the router has one, read after the flush like the layer's) and then read their
  share of the chosen experts' bytes, each expert's at its own place in a buffer of every expert's: the
  bare read with the dependency no layer avoids (which bytes is known only once the logits are read);
- launch_us: a graph of one trivial kernel (the cost of a launch under the protocol);
- floor_us: the roofline floor (`moe_core.bench.roofline_floor`, this run's ceilings);
- limit_us = max(read_us, launch_us); layer_over_limit = layer_us / limit_us (a cell within 1.1 of its
  measured limit is done, issue 60); layer_over_routed_read = layer_us / routed_read_us.

    python3 decode_limits.py --out DIR [--presets ...] [--schemes ...] [--tokens 1 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import triton
import triton.language as tl
from layer_timing import DTYPES, PRESETS, build_layer, correction_bias, input_sets, layer_quant

from moe_core.bench import (
    expert_weight_bytes,
    mean_call_seconds,
    measure_ceilings,
    roofline_floor,
    routed_work,
    time_cuda_layer,
)
from moe_core.bench._stream_read import stream_readers
from moe_core.oracle import BackendUnavailableError
from moe_core.presets import get_preset


@triton.jit
def _routed_read(logits_ptr, bias_ptr, src_ptr, out_ptr, expert_words, chunks, E: tl.constexpr,
                 E_POW2: tl.constexpr, TOP_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """Program p reads chunk p % chunks of the (p // chunks)-th choice's expert; every program routes the
    token itself, so no read starts before the logits are in."""
    pid = tl.program_id(0)
    choice = pid // chunks
    e = tl.arange(0, E_POW2)
    scores = tl.load(logits_ptr + e, mask=e < E, other=float("-inf")).to(tl.float32)
    if HAS_BIAS:
        scores += tl.load(bias_ptr + e, mask=e < E, other=0.0).to(tl.float32)
    expert = 0
    for i in tl.static_range(TOP_K):
        best = tl.min(tl.where(scores == tl.max(scores, 0), e, E_POW2), 0)
        expert = tl.where(i == choice, best, expert)
        scores = tl.where(e == best, float("-inf"), scores)
    offs = (pid % chunks) * BLOCK + tl.arange(0, BLOCK)
    words = tl.load(src_ptr + expert.to(tl.int64) * expert_words + offs, mask=offs < expert_words, other=0)
    tl.store(out_ptr + pid, tl.sum(words, 0))


def protocol_us(fn) -> float:
    """Median microseconds of `fn()` under the layer protocol (its arguments are ignored)."""
    dummy = torch.empty(1, device="cuda")
    samples, method = time_cuda_layer(lambda x, logits: fn(), [(dummy, dummy)])
    if method != "cuda-graph":
        raise RuntimeError(f"not captured: {method}")
    return statistics.median(samples) * 1e6


def read_us(nbytes: int) -> float:
    src = torch.ones(max(1, nbytes // 4), dtype=torch.int32, device="cuda")
    return min(protocol_us(read) for read in [src.sum, *stream_readers(src.view(torch.uint8)).values()])


# (warps, int32 words) per program of the routed read: the routing is each program's own reductions over the
# logits, cheaper on fewer warps, the read wants bytes in flight; the limit is the fastest.
ROUTED_READ_SHAPES = ((4, 4096), (2, 2048), (1, 1024))


def routed_read_us(config, inputs, expert_bytes: int, bias) -> float:
    """One token's routing and then the read of its chosen experts' bytes, in one launch under the protocol
    (the cell's input sets: each replay routes its own logits); the fastest of ROUTED_READ_SHAPES."""
    expert_words = max(1, expert_bytes // 4)
    top_k, E = config.top_k, config.num_experts
    src = torch.ones(E * expert_words, dtype=torch.int32, device="cuda")
    times = []
    for warps, block in ROUTED_READ_SHAPES:
        chunks = triton.cdiv(expert_words, block)
        out = torch.empty(top_k * chunks, dtype=torch.int32, device="cuda")

        def call(x, logits, chunks=chunks, out=out, warps=warps, block=block):
            _routed_read[(top_k * chunks,)](logits, bias if bias is not None else logits, src, out, expert_words,
                                            chunks, E=E, E_POW2=triton.next_power_of_2(E), TOP_K=top_k,
                                            HAS_BIAS=bias is not None, BLOCK=block, num_warps=warps)
        samples, method = time_cuda_layer(call, inputs)
        if method != "cuda-graph":
            raise RuntimeError(f"not captured: {method}")
        times.append(mean_call_seconds(samples, len(inputs)) * 1e6)
    return min(times)


def layer_cell(preset, layer, quant, tokens: int, dev: torch.device):
    """A decode cell's input sets, the routed work they select (the sets' mean), the bytes the mean call
    must read and the layer's mean call on them (us)."""
    inputs = input_sets(preset, tokens, dev)
    work = routed_work(preset.config, [logits for _, logits in inputs], correction_bias(preset, dev))
    nbytes = int(work.experts * expert_weight_bytes(preset.config, quant))
    samples, _ = time_cuda_layer(layer, inputs)
    return inputs, work, nbytes, round(mean_call_seconds(samples, len(inputs)) * 1e6, 2)


def record(result: dict, path: Path, row: dict) -> None:
    """Adds a measured row to the result, rewrites the JSON (a stopped run keeps what it measured)
    and prints the row."""
    result["rows"].append(row)
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(row), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--schemes", nargs="+", default=list(DTYPES))
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    ceilings = measure_ceilings(dev, torch.bfloat16)
    tiny = torch.zeros(1, device=dev)
    launch = protocol_us(lambda: tiny.add_(1))
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "launch_us": round(launch, 2), "memory_bytes_per_s": ceilings.memory_bytes_per_s, "rows": []}
    path = args.out / "decode_limits.json"
    print(f"one-kernel graph under the protocol: {launch:.2f} us", flush=True)
    for name in args.presets:
        preset = get_preset(name)
        config = preset.config
        for scheme in args.schemes:
            quant = layer_quant(preset, scheme)
            try:
                layer = build_layer(preset, scheme, dev)
            except BackendUnavailableError as exc:
                print(f"{name} {scheme}: refused ({str(exc).splitlines()[0][:160]})", flush=True)
                continue
            for tokens in args.tokens:
                inputs, work, nbytes, layer_us = layer_cell(preset, layer, quant, tokens, dev)
                row = {"preset": name, "scheme": scheme, "tokens": tokens, "experts": work.experts, "bytes": nbytes,
                       "layer_us": layer_us, "read_us": round(read_us(nbytes), 2),
                       "floor_us": round(roofline_floor(config, quant, work, ceilings).seconds * 1e6, 2)}
                row["limit_us"] = max(row["read_us"], round(launch, 2))
                row["layer_over_limit"] = round(row["layer_us"] / row["limit_us"], 3)
                if tokens == 1:
                    row["routed_read_us"] = round(routed_read_us(
                        config, inputs, int(expert_weight_bytes(config, quant)), correction_bias(preset, dev)), 2)
                    row["layer_over_routed_read"] = round(row["layer_us"] / row["routed_read_us"], 3)
                record(result, path, row)
            del layer
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
