"""moe-triton's mma.sync decode GEMM (`quant_gemm_details._mma`, `GemmConfig.mma`) against the tl.dot one.

Issue 60 (one-token decode): the shipped one-token GEMMs (the tl.dot kernel, direct launches) are
bound by instruction issue. Two measurements of the kernel written by hand around mma.sync:

    python decode_mma.py count                   # offline sm_90 SASS: instructions per K tile and thread (no GPU)
    python decode_mma.py check-and-time --out F  # on the GPU: each GEMM alone against its twin and the tl.dot kernel

`check-and-time` times qwen3-30b-a3b's two one-token GEMMs (eight pairs, int4 g128, random codes) into
fp32 sums (ATOMIC, not zeroed between replays) under the layer protocol (CUDA graph, L2 flushed,
median): the tl.dot kernel at its H200 launch shape, the mma kernel at launch shapes around it, and
one kernel reading the pairs' weight and scale bytes (the limit under the same protocol).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton

# qwen3-30b-a3b's one-token GEMMs: (name, N, K, A_ROWS_DIV (top-k for GEMM1), the tl.dot kernel's launch shape
# the mma kernel is timed against)
CASES = [("gemm1", 1536, 2048, 8, dict(block_n=64, split_k=4, num_warps=4, num_stages=3, one_dot=True)),
         ("gemm2", 2048, 768, 1, dict(block_n=128, split_k=3, num_warps=8, num_stages=3, one_dot=True))]


def count(argv) -> int:
    """Offline sm_90 builds (no GPU) of the one-token GEMM1 (`offline_compile.MMA_CONSTEXPRS`), direct
    and over blocks of 16 pairs: the kernel unrolls its K tiles, so a tile's instructions are the
    difference between builds of 4 and 8 tiles, over 4."""
    from sass_k_loop import opcodes, sass

    from moe_triton._common.offline_compile import compile_mma_gemm

    p = argparse.ArgumentParser()
    p.add_argument("--block-n", type=int, nargs="+", default=[64, 128])
    args = p.parse_args(argv)
    for (block_n, direct) in ((bn, d) for d in (True, False) for bn in args.block_n):
        small, large = ([text for _, text in sass(compile_mma_gemm(dict(TILES=t, BLOCK_N=block_n, DIRECT=direct))
                                                 .asm["cubin"])] for t in (4, 8))
        weights = block_n * 128 // 128  # 4 warps of 32 threads
        per_tile = (len(large) - len(small)) / 4
        diff = opcodes(large)
        diff.subtract(opcodes(small))
        print(f"{'direct (8 columns)' if direct else 'blocks of 16 pairs'}, BLOCK_N {block_n}: {len(small)} "
              f"instructions at 4 tiles; per K tile {per_tile:.1f} for {weights} weights per thread "
              f"({per_tile / weights:.2f} per weight)")
        print("    per 4 tiles:", ", ".join(f"{op} {c}" for op, c in diff.most_common(16) if c))
    return 0


def _time_case(name: str, n: int, k: int, rows_div: int, shipped: dict, experts: int, gen) -> dict:
    """One GEMM of CASES: the shipped kernel and the mma kernel's launch shapes, and one kernel reading
    the bytes of the pairs' weights and scales (the limit under the same protocol)."""
    from decode_limits import protocol_us, read_us

    from moe_triton.configs import GemmConfig
    from moe_triton.quant_gemm import direct_quant_gemm, quant_gemm_torch
    from moe_triton.quant_gemm_details._layouts import QuadsLayout, WeightOperand, WType

    dev, topk = gen.device, 8
    codes = torch.randint(0, 16, (experts, n, k), generator=gen, device=dev, dtype=torch.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scale = (torch.rand(experts, k // 128, n, generator=gen, device=dev) * 0.02 + 0.005).to(torch.bfloat16)
    w = WeightOperand(WType.INT4, QuadsLayout(128).swizzle(packed), scale, None, n, k, 128, 128, 8)
    del codes, packed
    a = torch.randn(topk // rows_div, k, generator=gen, device=dev).to(torch.bfloat16)
    ids = torch.randperm(experts, generator=gen, device=dev)[:topk].to(torch.int32).view(1, topk)
    ref = quant_gemm_torch(a, w, ids.view(-1).long(), a_rows_div=rows_div)
    out = torch.zeros(topk, n, device=dev)
    cfg = GemmConfig(16, shipped["block_n"], shipped["split_k"], shipped["num_warps"], shipped["num_stages"], True,
                     one_dot=shipped["one_dot"])

    def rel_l2() -> float:
        return float((out - ref).norm() / ref.norm())

    # Timed without the zeroing (a launch of its own): the sums grow from replay to replay, unread.
    def old() -> None:
        direct_quant_gemm(a, w, out, ids, None, cfg, a_rows_div=rows_div, atomic=True)

    def new(block_n: int, warps: int, split: int) -> None:
        direct_quant_gemm(a, w, out, ids, None, GemmConfig(16, block_n, split, warps, 2, True, mma=True),
                          a_rows_div=rows_div, atomic=True)

    out.zero_()
    old()
    weight_bytes = topk * (w.codes[0].numel() * 2 + w.scale[0].numel() * 2)
    row = {"case": name, "N": n, "K": k, "weight_bytes": weight_bytes, "read_us": read_us(weight_bytes),
           "shipped": {**shipped, "rel_l2": rel_l2(), "us": protocol_us(old)}, "mma": []}
    for block_n, warps in ((64, 4), (128, 4), (128, 8), (256, 8)):
        for split in (s for s in (1, 2, 3, 4, 6, 8) if -(-w.k_tiles // s) <= 8):
            out.zero_()
            new(block_n, warps, split)
            row["mma"].append({"block_n": block_n, "warps": warps, "split_k": split, "rel_l2": rel_l2(),
                               "us": protocol_us(lambda bn=block_n, nw=warps, sk=split: new(bn, nw, sk))})
    return row


def check_and_time(argv) -> int:
    """On the GPU: the decode mma GEMM against the twin (relative L2) and against the shipped direct
    GEMM (its H200 launch shape), both into fp32 sums (ATOMIC), under the layer protocol (CUDA graph,
    L2 flushed, median); then the mma GEMM's own launch shapes."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--experts", type=int, default=128)
    args = p.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, n, k, rows_div, shipped in CASES:
        row = _time_case(name, n, k, rows_div, shipped, args.experts, gen)
        same = next(r for r in row["mma"] if (r["block_n"], r["warps"], r["split_k"]) == (
            shipped["block_n"], shipped["num_warps"], shipped["split_k"]))
        best = min(row["mma"], key=lambda r: r["us"])
        print(f"{name}: shipped {row['shipped']['us']:.2f} us (rel. L2 {row['shipped']['rel_l2']:.1e}); mma at the "
              f"shipped shape {same['us']:.2f} (rel. L2 {same['rel_l2']:.1e}); best {best}; a bare read of the "
              f"{row['weight_bytes'] / 1e6:.1f} MB {row['read_us']:.2f}", flush=True)
        rows.append(row)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    sys.exit({"count": count, "check-and-time": check_and_time}[cmd](rest))
