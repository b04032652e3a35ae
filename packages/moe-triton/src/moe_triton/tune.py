"""Search launch tiles for `TritonExperts` on the current GPU and write them as tuned-config JSON.

    python -m moe_triton.tune [--preset NAME ...] [--shape E,N,K,TOPK ...] [--m 1 8 ...] [--out DIR]

Each GEMM is timed alone (`triton.testing.do_bench`: L2 flushed before every call) on random
weights and routed random tokens, for every candidate tile of a short, regime-specific list; the
rows per block (block_m) follow from the tokens each expert receives. The output folder can be
put on `$MOE_TRITON_CONFIG_DIR`, or the files copied into `moe_triton/configs/` to ship them.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch

from moe_triton.configs import ConfigKey, KernelConfig, TileConfig, device_tag, write_configs

__all__ = ["block_m_for", "candidates", "main"]

DEFAULT_PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b")
DEFAULT_M = (1, 8, 32, 128, 512, 2048, 8192)


def block_m_for(num_tokens: int, top_k: int, num_experts: int) -> int:
    """Rows per block from the expected rows per expert: small blocks waste no rows at decode."""
    per_expert = num_tokens * top_k / num_experts
    for limit, bm in ((12, 16), (24, 32), (96, 64)):
        if per_expert <= limit:
            return bm
    return 128


def candidates(block_m: int, gated: bool) -> list[TileConfig]:
    """Tiles worth trying for one GEMM; gated GEMM1 holds two accumulators, so it avoids the widest."""
    if block_m <= 32:
        tiles = [TileConfig(32, 256, 1, 4, 4), TileConfig(64, 128, 1, 4, 3), TileConfig(64, 128, 1, 4, 5),
                 TileConfig(64, 256, 1, 4, 3), TileConfig(128, 128, 1, 4, 3), TileConfig(32, 128, 1, 4, 4),
                 # narrow tiles put more programs on the SMs when few experts are touched
                 TileConfig(16, 256, 1, 4, 4), TileConfig(16, 512, 1, 4, 3), TileConfig(32, 512, 1, 4, 2)]
    else:
        tiles = [TileConfig(64, 64, 8, 4, 4), TileConfig(64, 128, 8, 4, 3), TileConfig(128, 64, 8, 8, 4),
                 TileConfig(128, 64, 8, 4, 3), TileConfig(128, 128, 8, 8, 3)]
        if not gated:
            tiles.append(TileConfig(256, 64, 8, 8, 4))
    return tiles


def _tune_shape(name: str, E: int, N: int, K: int, top_k: int, activation, has_bias: bool, ms, dtype,
                rep_ms: int, log) -> tuple[ConfigKey, dict[int, KernelConfig], dict]:
    from triton.testing import do_bench

    from moe_core.config import Routing
    from moe_core.routing import route_torch as route
    from moe_triton._details.pipeline import moe_gemm
    from moe_triton.align import align_block_size

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    R = 2 * N if activation.gated else N
    w13 = (torch.randn(E, R, K, device=dev, generator=gen, dtype=dtype) * K**-0.5)
    w2 = (torch.randn(E, K, N, device=dev, generator=gen, dtype=dtype) * N**-0.5)
    b13 = torch.randn(E, R, device=dev, generator=gen) * 0.1 if has_bias else None
    b2 = torch.randn(E, K, device=dev, generator=gen) * 0.1 if has_bias else None
    key = ConfigKey("bf16", E, N, K, top_k, str(dtype).removeprefix("torch."),
                    device_tag(torch.cuda.get_device_name(dev)))
    table: dict[int, KernelConfig] = {}
    measured: dict[str, dict] = {}
    for M in ms:
        x = torch.randn(M, K, device=dev, generator=gen, dtype=dtype)
        tw, ti = route(torch.randn(M, E, device=dev, generator=gen), Routing.softmax_topk(True), top_k)
        bm = block_m_for(M, top_k, E)
        sorted_ids, expert_ids, total = align_block_size(ti, bm, E)
        inter = torch.randn(M * top_k, N, device=dev, generator=gen, dtype=dtype)
        out = torch.empty(M * top_k, K, device=dev, dtype=dtype)
        common = dict(top_k=top_k, block_m=bm, zero_foreign=True)
        best = {}
        for gemm, gated in (("gemm1", activation.gated), ("gemm2", False)):
            timings = []
            for tile in candidates(bm, gated):
                if gemm == "gemm1":
                    fn = functools.partial(moe_gemm, x, w13, b13, inter, tw, sorted_ids, expert_ids, total,
                                           tile=tile, activation=activation, mul_weight=False, **common)
                else:
                    fn = functools.partial(moe_gemm, inter, w2, b2, out, tw, sorted_ids, expert_ids, total,
                                           tile=tile, activation=None, mul_weight=True, **common)
                try:
                    t_us = do_bench(fn, warmup=5, rep=rep_ms) * 1e3
                except Exception as exc:  # a tile the GPU cannot hold (shared memory, registers)
                    log(f"  {name} M={M} {gemm} {tile}: skipped ({type(exc).__name__})")
                    continue
                timings.append((t_us, tile))
            if not timings:
                raise RuntimeError(f"{name} M={M} {gemm}: no candidate tile ran")
            best[gemm] = min(timings, key=lambda p: p[0])
        table[M] = KernelConfig(bm, best["gemm1"][1], best["gemm2"][1])
        measured[str(M)] = {"gemm1_us": round(best["gemm1"][0], 2), "gemm2_us": round(best["gemm2"][0], 2)}
        log(f"  {name} M={M}: {table[M]}  ({measured[str(M)]['gemm1_us']} + {measured[str(M)]['gemm2_us']} us)")
    return key, table, measured


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="moe tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", nargs="*", default=None, help=f"model presets (default: {', '.join(DEFAULT_PRESETS)})")
    p.add_argument("--shape", nargs="*", default=[], help="extra shapes E,N,K,TOPK (SiLU-gated, no bias)")
    p.add_argument("--m", nargs="*", type=int, default=list(DEFAULT_M), help="token counts to tune")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--out", type=Path, default=Path("moe-triton-configs"), help="folder for the JSON files")
    p.add_argument("--rep-ms", type=int, default=25, help="timing budget per candidate (ms)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe tune: torch sees no GPU; tuning needs the GPU the configurations are for", file=sys.stderr)
        return 2
    if any(m < 1 for m in args.m):
        p.error("--m values must be positive token counts")

    from moe_core.config import Activation
    from moe_core.presets import get_preset

    shapes = []
    for name in args.preset if args.preset is not None else DEFAULT_PRESETS:
        cfg = get_preset(name).config
        shapes.append((name, cfg.num_experts, cfg.intermediate_size, cfg.hidden_size, cfg.top_k,
                       cfg.activation, cfg.has_bias))
    for text in args.shape:
        try:
            E, N, K, k = (int(v) for v in text.split(","))
        except ValueError:
            p.error(f"--shape {text!r}: expected four integers E,N,K,TOPK")
        shapes.append((text, E, N, K, k, Activation.silu(), False))
    dtype = getattr(torch, args.dtype)
    print(f"moe tune on {torch.cuda.get_device_name()}: {len(shapes)} shapes x M in {args.m}", flush=True)
    for name, E, N, K, k, act, bias in shapes:
        start = time.time()
        key, table, measured = _tune_shape(name, E, N, K, k, act, bias, args.m, dtype, args.rep_ms,
                                           lambda s: print(s, flush=True))
        import triton

        path = write_configs(key, table, args.out, extra={
            "device_name": torch.cuda.get_device_name(), "triton_version": triton.__version__,
            "torch_version": torch.__version__, "model": name, "measured_us": measured,
            "method": "each GEMM alone, triton.testing.do_bench (L2 flushed), best of the candidate tiles"})
        print(f"wrote {path} ({time.time() - start:.0f}s)", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
