"""Search launch configurations on the current GPU and write them as tuned-config JSON.

    python -m moe_triton.tune [--quant none|int4|int8|mxfp4|fp8-tensor|fp8-channel|fp8-block] [--preset NAME ...]
                              [--shape E,N,K,TOPK ...]
                              [--m 1 8 ...] [--out DIR]

bf16 (`--quant none`, `TritonExperts`): each GEMM is timed alone (`triton.testing.do_bench`: L2
flushed before every call) on random weights and routed random tokens, for every candidate tile
of a short, regime-specific list; the rows per block (block_m) follow from the tokens each expert
receives; with many rows per expert twice that block is tried too. At decode sizes the direct
kernels compete per GEMM, charged for what they save: the alignment when both GEMMs are direct,
the top-k sum when GEMM2 is. On Hopper (sm_90) the Gluon wgmma kernel's tiles join the list at 64
and 128 rows per block (`candidates(..., wgmma=True)`).

int4 (`--quant int4`, `TritonWna16Experts` at each preset's int4 group size), int8 (`--quant int8`, the
same class with per-channel symmetric int8, byte quads where 128 divides K), MXFP4 (`--quant mxfp4`,
`TritonMxfp4Experts`) and fp8 (`--quant fp8-tensor|fp8-channel|fp8-block`, `TritonFp8Experts` with
dynamic per-token or per-group activation scales): the whole layer (routing included) is captured in a
CUDA graph and timed the same way for the measured heuristic
(`quant_gemm_details._heuristics.pick_config`), the configuration shipped for that shape and M (if any;
MXFP4 and int8 without a file of their own: the int4 one they borrow, as served), for MXFP4 and int8 the
int4 entry of their shape with its mma GEMMs kept (`lender`: a borrowed entry is served on the tl.dot
kernel), the heuristic's neighbours (`quant_candidates`), with `--wgmma` the Hopper wgmma kernel's tiles
for both GEMMs (`wgmma_grid`, int8's as deep as its wider words fit; above `LAST_ARRIVAL_MAX_TOKENS`
tokens, where the layer's GEMMs can run on it), at up to `fused_decode.MAX_TOKENS` tokens the one-launch
decode path where it serves the layer (`fused_decode_candidates`), and then the best one's neighbours
(none around a fused winner); with `--per-gemm`, then each GEMM's grid of split-K x block_n x warps, its
`one_dot` flipped and (int4, int8 or MXFP4 quads up to `LAST_ARRIVAL_MAX_TOKENS` tokens on NVIDIA) it
and each tile of its grid on the other of the tl.dot and mma kernels (`per_gemm_grid`; an mma GEMM's
`scales_in_tile` flipped; at one token an mma GEMM1's `own_route` too; in aligned launches up to
`LAST_ARRIVAL_MAX_TOKENS` tokens a tl.dot GEMM2's `prefetch_tiles`; with 16-bit activations GEMM2's
`block_ready` where both GEMMs run on the tl.dot kernel), with the other GEMM held at the best so far,
and both GEMMs' fastest tiles together where each beat it. The neighbours of int4, int8 and MXFP4
include both GEMMs' `one_dot` flipped (a K tile's quarters as one dot); `max_registers` is not searched
(a shipped entry's cap is timed with it). The layer is timed as `FusedMoE` calls it (`apply_monolithic`:
routing included); a routing with a correction bias (DeepSeek-V3) takes a random one,
`--correction-bias` its standard deviation (1e-3 by default: near-uniform loads; `moe bench` draws
`moe_core.bench.CORRECTION_BIAS_STD`, 0.1, which concentrates the pairs on fewer experts).
The fastest is written; every candidate's time and the name the shipped configuration was timed
under go to the file's provenance (`OUT/provenance/`, see `configs.write_configs`), so a rerun
shows whether the winner beat what ships by more than noise.

The output folder can be put on `$MOE_TRITON_CONFIG_DIR`, or the files copied into
`moe_triton/configs/` to ship them (and their provenance into benchmarks/results/tuned-configs/).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path

import torch

from moe_triton.configs import (
    ConfigKey,
    FusedDecodeConfig,
    GemmConfig,
    KernelConfig,
    QuantKernelConfig,
    TileConfig,
    device_tag,
    write_configs,
)
from moe_triton.quant_gemm_details._heuristics import GROUP_M_BLOCKS
from moe_triton.topk_sum import topk_sum

__all__ = ["INT8_WGMMA_STAGES", "as_mma", "block_m_for", "candidates", "direct_candidates", "fused_decode_candidates",
           "main", "per_gemm_grid", "quant_candidates", "wgmma_grid"]

DEFAULT_PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b")
DEFAULT_M = (1, 8, 32, 128, 512, 2048, 8192)
FP8_SCHEMES = ("fp8-tensor", "fp8-channel", "fp8-block")  # moe_core.quant.parse_scheme names
_UNQUANTIZED_NAMES = ("unquantized", "bf16", "fp16")  # what `moe run --quant` also accepts for "none"
# The standard deviation of the random correction bias a routing that takes one is tuned with:
# near-uniform expert loads, as a trained DeepSeek-V3's bias aims for.
CORRECTION_BIAS = 1e-3
# Direct (decode) kernels are timed while the choices are this few: beyond it every expert meets
# several rows and the tensor-core tiles win.
DIRECT_MAX_CHOICES = 64


def block_m_for(num_tokens: int, top_k: int, num_experts: int) -> int:
    """Rows per block from the expected rows per expert: small blocks waste no rows at decode."""
    per_expert = num_tokens * top_k / num_experts
    for limit, bm in ((12, 16), (24, 32), (96, 64)):
        if per_expert <= limit:
            return bm
    return 128


def candidates(block_m: int, gated: bool, wgmma: bool = False) -> list[TileConfig]:
    """Tiles worth trying for one GEMM; gated GEMM1 holds two accumulators, so it avoids the widest.
    wgmma: also the Gluon wgmma kernel's (Hopper) at 128 and 256 weight rows per program, N tiles
    first or in groups of 8 row blocks, and its persistent form at 256 rows (groups of 1, 4, 8; and
    group 8 with tails of 16 or 32 rows)."""
    if block_m <= 32:
        tiles = [TileConfig(32, 256, 1, 4, 4), TileConfig(64, 128, 1, 4, 3), TileConfig(64, 128, 1, 4, 5),
                 TileConfig(64, 256, 1, 4, 3), TileConfig(128, 128, 1, 4, 3), TileConfig(32, 128, 1, 4, 4),
                 # narrow tiles put more programs on the SMs when few experts are touched
                 TileConfig(16, 256, 1, 4, 4), TileConfig(16, 512, 1, 4, 3), TileConfig(32, 512, 1, 4, 2)]
    elif block_m <= 128:
        tiles = [TileConfig(64, 64, 8, 4, 4), TileConfig(64, 128, 8, 4, 3), TileConfig(128, 64, 8, 8, 4),
                 TileConfig(128, 64, 8, 4, 3), TileConfig(128, 128, 8, 8, 3)]
        if not gated:
            tiles.append(TileConfig(256, 64, 8, 8, 4))
    else:
        # 256 rows over two warpgroups: twice the MMA work per B tile; a gated 256x128 pair of
        # accumulators would spill, so the gated GEMM stays at 64 columns.
        tiles = [TileConfig(64, 64, 8, 8, 3), TileConfig(64, 64, 8, 8, 4)]
        if not gated:
            tiles += [TileConfig(128, 64, 8, 8, 3), TileConfig(128, 64, 8, 8, 4)]
    if block_m >= 64:
        # The same tiles with B through the copy engine (64-wide K rows: one 128-byte swizzle line).
        tiles += [dataclasses.replace(t, tma=True) for t in tiles if t.block_k == 64]
    if block_m >= 128:
        # An expert's last block multiplies only its valid half when it has no more (TileConfig.narrow).
        tiles += [dataclasses.replace(t, narrow=True) for t in tiles]
    if wgmma and block_m in (64, 128):
        tiles += [TileConfig(rows // 2 if gated else rows, 64, group, 8, 4, wgmma=True)
                  for rows in (128, 256) for group in (1, 8)]
        # Taken-in tails in group 8 (their ring fits beside four stages since the epilogue moves
        # 16-bit results only).
        tiles += [TileConfig(128 if gated else 256, 64, group, 8, 4, wgmma=True, persistent=True, tail=tail)
                  for group, tail in ((1, 0), (4, 0), (8, 0), (8, 16), (8, 32))]
    return tiles


def direct_candidates(gemm: str, top_k: int) -> list[TileConfig]:
    """Direct-kernel tiles; GEMV2 holds top_k (padded to 2^n) experts' tiles at once, so its
    block_n x block_k shrinks with top_k to keep the accumulator in registers."""
    if gemm == "gemm1":
        shapes = [(8, 256, 4, 3), (16, 256, 4, 3), (16, 128, 4, 3), (32, 128, 4, 3), (8, 512, 4, 2),
                  (16, 512, 8, 2), (32, 256, 8, 3), (4, 512, 4, 3)]
    else:
        kp = 1 << (top_k - 1).bit_length()
        shapes = []
        for elems, warps in ((4096, 4), (8192, 4), (16384, 8)):
            for bk in (64, 128, 256):
                bn = elems // (kp * bk)
                if bn >= 1:
                    shapes.append((bn, bk, warps, 3))
    return [TileConfig(bn, bk, 1, w, st, direct=True) for bn, bk, w, st in shapes]


_QUANT_TWEAKS = {
    "block_m/2": lambda c: dataclasses.replace(c, block_m=c.block_m // 2),
    # 256 tokens fill wgmma's widest N side when swapped: twice the MMA work per dequantized tile.
    "block_m*2": lambda c: dataclasses.replace(c, block_m=min(256, c.block_m * 2)),
    "split*2": lambda c: dataclasses.replace(c, split_k=c.split_k * 2),
    "split/2": lambda c: dataclasses.replace(c, split_k=max(1, c.split_k // 2)),
    "block_n*2": lambda c: dataclasses.replace(c, block_n=min(256, c.block_n * 2)),
    "warps*2": lambda c: dataclasses.replace(c, num_warps=min(8, c.num_warps * 2)),
    "warps/2": lambda c: dataclasses.replace(c, num_warps=max(4, c.num_warps // 2)),
    "stages+1": lambda c: dataclasses.replace(c, num_stages=c.num_stages + 1),
    "stages-1": lambda c: dataclasses.replace(c, num_stages=max(2, c.num_stages - 1)),
    # An expert's last block over its valid half when it has no more (GemmConfig.narrow).
    "narrow": lambda c: dataclasses.replace(c, narrow=not c.narrow),
    # A block takes in its expert's last few pairs (GemmConfig.tail: 8 or 16 on the wgmma kernel's
    # 128-pair blocks, 16 or 32 on the tl.dot kernel's blocks of more).
    "tail8": lambda c: dataclasses.replace(c, tail=8),
    "tail16": lambda c: dataclasses.replace(c, tail=16),
    "tail32": lambda c: dataclasses.replace(c, tail=32),
    # M blocks launched in groups (GemmConfig.group_m): on, or off where the heuristic set it.
    "group_m": lambda c: dataclasses.replace(c, group_m=1 if c.group_m > 1 else GROUP_M_BLOCKS),
}


def quant_candidates(base: QuantKernelConfig, *, swap_optional: bool = False) -> dict[str, QuantKernelConfig]:
    """The heuristic's pair and its neighbours (each change made to both GEMMs), without repeats.
    swap_optional (fp8 weights, which run either way): the pair with swap_ab flipped too; otherwise
    (int4, int8, MXFP4: quads weights) with one_dot flipped (`GemmConfig.one_dot`)."""
    found = {"heuristic": base}
    if swap_optional:
        tweaks = dict(_QUANT_TWEAKS, swap_ab=lambda c: dataclasses.replace(c, swap_ab=not c.swap_ab))
    else:
        tweaks = dict(_QUANT_TWEAKS, one_dot=lambda c: dataclasses.replace(
            c, one_dot=not c.one_dot and not c.wgmma and not c.mma))
    for name, tweak in tweaks.items():
        try:
            cand = QuantKernelConfig(tweak(base.gemm1), tweak(base.gemm2))
        except ValueError:  # e.g. block_m below 16
            continue
        if cand not in found.values():
            found[name] = cand
    return found


# Split-K counts of the per-GEMM grid. 3 and 6 besides the powers of two: at one token a launch's
# programs are (experts x N tiles x splits), and the count that fills the GPU's resident slots in one
# wave (a few per SM, set by the kernel's registers) often lies between two powers of two.
PER_GEMM_SPLITS = (1, 2, 3, 4, 6, 8)
# The K tiles an aligned GEMM2 asks L2 for before its wait where the per-GEMM grid tries it
# (`GemmConfig.prefetch_tiles`): two paid on qwen3-30b-a3b int4 at 8 tokens; four and eight lost there.
PREFETCH_TILES = 2


def per_gemm_grid(base: QuantKernelConfig, *, one_dot: bool = True, mma: bool = False,
                  own_route: bool = False, prefetch: bool = False,
                  block_ready: bool = False) -> dict[str, QuantKernelConfig]:
    """One GEMM's split-K x block_n x warps grid (block_m and stages as in base), and with one_dot (quads
    weights: not fp8) base with that GEMM's one_dot flipped (tl.dot launches, not the mma kernel's),
    with mma (quads weights at decode sizes) that GEMM and each of its grid's tiles on the other kernel
    of the two too (`as_mma`; a tile that comes out the same is timed once), an mma GEMM's
    `scales_in_tile` flipped, with own_route (one token) base with an mma GEMM1's `own_route` flipped,
    with prefetch (aligned launches of quads at decode sizes) base with a tl.dot GEMM2's
    `prefetch_tiles` flipped between 0 and PREFETCH_TILES, with block_ready (16-bit activations) base
    with GEMM2's `block_ready` flipped where both GEMMs run on the tl.dot kernel; the other GEMM as in
    base (GEMM2 waiting for all of GEMM1 where GEMM1 leaves the tl.dot kernel)."""
    found = {}

    def add(name: str, cand: QuantKernelConfig) -> None:
        if cand != base and cand not in found.values():
            found[name] = cand

    def with_gemm(gemm: str, tile: GemmConfig) -> QuantKernelConfig:
        if gemm == "gemm1" and (tile.mma or tile.wgmma):  # no counts of its blocks to wait for
            return dataclasses.replace(base, gemm1=tile, gemm2=dataclasses.replace(base.gemm2, block_ready=False))
        return dataclasses.replace(base, **{gemm: tile})

    def on_other(tile: GemmConfig) -> GemmConfig:
        return tile.on_tl_dot() if tile.mma else as_mma(tile)

    for gemm in ("gemm1", "gemm2"):
        tile = getattr(base, gemm)
        if one_dot and not tile.wgmma and not tile.mma:
            add(f"{gemm}:one_dot={not tile.one_dot}", with_gemm(gemm, dataclasses.replace(tile, one_dot=not tile.one_dot)))
        if mma and not tile.wgmma:
            add(f"{gemm}:mma={not tile.mma}", with_gemm(gemm, on_other(tile)))
        if tile.mma:
            add(f"{gemm}:scales_in_tile={not tile.scales_in_tile}",
                with_gemm(gemm, dataclasses.replace(tile, scales_in_tile=not tile.scales_in_tile)))
        if own_route and gemm == "gemm1" and tile.mma:
            add(f"gemm1:own_route={not tile.own_route}",
                dataclasses.replace(base, gemm1=dataclasses.replace(tile, own_route=not tile.own_route)))
        if prefetch and gemm == "gemm2" and not (tile.wgmma or tile.mma):
            tiles = 0 if tile.prefetch_tiles else PREFETCH_TILES
            add(f"gemm2:prefetch_tiles={tiles}", dataclasses.replace(base, gemm2=dataclasses.replace(tile, prefetch_tiles=tiles)))
        if block_ready and gemm == "gemm2" and not any(g.wgmma or g.mma for g in (base.gemm1, tile)):
            add(f"gemm2:block_ready={not tile.block_ready}",
                dataclasses.replace(base, gemm2=dataclasses.replace(tile, block_ready=not tile.block_ready)))
        for split in PER_GEMM_SPLITS:
            for block_n in (64, 128, 256):
                for warps in (4, 8):
                    try:
                        tile = dataclasses.replace(getattr(base, gemm), split_k=split, block_n=block_n,
                                                   num_warps=warps)
                    except ValueError:  # a tile the wgmma or mma kernel does not take (block_n, warps)
                        continue
                    name = f"{gemm}:split={split},block_n={block_n},warps={warps}"
                    add(name, with_gemm(gemm, tile))
                    if mma and not tile.wgmma:
                        add(f"{name},mma={not tile.mma}", with_gemm(gemm, on_other(tile)))
    return found


def as_mma(tile: GemmConfig) -> GemmConfig:
    """A tl.dot launch shape on the mma kernel (`GemmConfig.mma`): its block_m, block_n, split and
    stages, warps cut to 16 weight rows each at least, none of the tl.dot kernel's options and no
    register cap (one set for the tl.dot build)."""
    return dataclasses.replace(tile, mma=True, one_dot=False, max_registers=0, narrow=False, tail=0, group_m=1,
                               prefetch_tiles=0, block_ready=False, num_warps=min(tile.num_warps, tile.block_n // 16))


# (block_m, block_n, stages) of the wgmma kernel: its ring of stages x (block_m + block_n / 4) x 256
# bytes, and the epilogue's exchange (16-bit outputs; fp32 sums into atomics), fit Hopper's 227 KB of shared memory.
# One CTA per SM whatever the tile (its register plan fills the register file), so small blocks get deeper rings.
_WGMMA_TILES = ((16, 256, 6), (32, 128, 6), (32, 256, 4), (32, 256, 6), (64, 128, 4), (64, 256, 4), (64, 256, 5),
                (128, 128, 4), (128, 256, 3), (128, 256, 4))


# The deepest ring of the tiles whose int4 depth int8's byte quads outgrow (int32 words: twice int4's
# bytes per stage) within an sm_90 block's 227 KB, tails of 16 pairs included on 128-pair blocks, with
# the larger of the epilogue's exchanges, a GEMM2's fp32 sums into atomics (offline sm_90 builds, Triton
# 3.6 and 3.9 alike: 128 x 256 takes 227,900 bytes at three stages; 16 x 256 195,168 at five, 232,552
# at six; test_quant_compile builds each). The other tiles fit int8 at int4's depth.
INT8_WGMMA_STAGES = {(16, 256): 5, (32, 256): 5, (64, 256): 4, (128, 256): 3}


def wgmma_grid(*, int8: bool = False) -> dict[str, QuantKernelConfig]:
    """Both GEMMs on the wgmma kernel (`quant_gemm_details._wgmma`), one candidate per tile of
    _WGMMA_TILES; int8's at most INT8_WGMMA_STAGES deep (a tile the cap brings to another's depth is
    one candidate)."""
    found = {}
    for bm, bn, stages in _WGMMA_TILES:
        if int8:
            stages = min(stages, INT8_WGMMA_STAGES.get((bm, bn), stages))
        tile = GemmConfig(bm, bn, 1, 4, stages, swap_ab=True, wgmma=True)
        found[f"wgmma:{bm}x{bn},s{stages}"] = QuantKernelConfig(tile, tile)
    return found


# (channels, num_warps, block_h, k_split) of the one-launch decode path the tuner times at decode sizes.
# 128 channels take 8 warps (on 4 each thread would hold 64 fp32 partial sums besides the next tile
# and spill); docs/design/triton-gemm-quantized.md says why these four.
FUSED_OPTIONS = ((128, 8, 128, 1), (128, 8, 128, 2), (64, 8, 128, 1), (64, 4, 128, 4))


def fused_decode_candidates(base: QuantKernelConfig) -> dict[str, QuantKernelConfig]:
    """The one-launch decode path (`moe_triton.fused_decode`) with each of FUSED_OPTIONS; base's GEMMs
    stay for calls too large for it."""
    return {_fused_option_name(*option): dataclasses.replace(base, fused=FusedDecodeConfig(*option))
            for option in FUSED_OPTIONS}


def _fused_option_name(channels: int, num_warps: int, block_h: int, k_split: int) -> str:
    return f"fused:c{channels},w{num_warps},h{block_h},k{k_split}"


def _graph_time_us(fn, rep_ms: int) -> float:
    """Median time of fn replayed from a CUDA graph, L2 flushed before each replay (do_bench)."""
    from triton.testing import do_bench

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compiles and warms up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, warmup=10, rep=rep_ms, return_mode="median") * 1e3


def _tune_quant_layer(experts, ms, rep_ms: int, log, timer=_graph_time_us, per_gemm: bool = False,
                     wgmma: bool = False, correction_bias: float = CORRECTION_BIAS
                     ) -> tuple[dict[int, QuantKernelConfig], dict]:
    """Per token count, time the layer (routing included) with the heuristic, the shipped
    configuration, the heuristic's neighbours (with wgmma, `wgmma_grid` too; at decode sizes the
    one-launch path's options where it serves the layer) and then the best one's neighbours (and
    with per_gemm, `per_gemm_grid` of the best); keep the fastest. A candidate with an mma GEMM of
    more K tiles per split than that kernel unrolls is not timed (the log counts them). A routing with
    a correction bias routes with a random one of that standard deviation (`correction_bias`)."""
    from moe_core.quant import QuantDType
    from moe_triton.fused_decode import MAX_TOKENS as FUSED_MAX_TOKENS
    from moe_triton.fused_decode import unsupported_reason as fused_unsupported
    from moe_triton.quant_gemm import mma_tiles_per_split
    from moe_triton.quant_gemm_details._mma import MAX_TILES
    from moe_triton.quantized import LAST_ARRIVAL_MAX_TOKENS

    cfg = experts.config
    w13 = experts._operand("w13", cfg.w13_rows, cfg.hidden_size)
    w2 = experts._operand("w2", cfg.hidden_size, cfg.intermediate_size_per_partition)

    def mma_takes_splits(cand: QuantKernelConfig) -> bool:
        return all(not g.mma or mma_tiles_per_split(w, g.split_k) <= MAX_TILES.value
                   for g, w in ((cand.gemm1, w13), (cand.gemm2, w2)))

    dev = experts.device.torch_device
    gen = torch.Generator(device=dev).manual_seed(1)
    bias = (torch.randn(cfg.num_experts, device=dev, generator=gen) * correction_bias
            if cfg.routing.has_correction_bias else None)
    table: dict[int, QuantKernelConfig] = {}
    measured: dict[str, dict] = {}
    fp8 = experts.quant.weight.dtype is QuantDType.FP8_E4M3
    for M in ms:
        x = torch.randn(M, cfg.hidden_size, device=dev, generator=gen).to(cfg.dtype)
        logits = torch.randn(M, cfg.num_experts, device=dev, generator=gen)

        def layer(x=x, logits=logits):
            return experts.apply_monolithic(x, logits, bias)  # as FusedMoE calls it: routing included

        cands: dict[str, QuantKernelConfig] = {}
        times: dict[str, float] = {}
        past_mma: set[QuantKernelConfig] = set()

        def time_all(found: dict[str, QuantKernelConfig], M=M, cands=cands, times=times, layer=layer,
                     past_mma=past_mma) -> None:
            for vname, cand in found.items():
                if cand in cands.values() or cand in past_mma:
                    continue
                if not mma_takes_splits(cand):
                    past_mma.add(cand)
                    continue
                cands[vname] = cand
                experts.config_override = cand
                try:
                    times[vname] = timer(layer, rep_ms)
                except Exception as exc:  # a shape the GPU cannot hold (shared memory, registers)
                    log(f"  M={M} {vname} {cand}: skipped ({type(exc).__name__}: {str(exc)[:120]})")

        # Two greedy steps: the heuristic's neighbours, then the winner's (each change is one step).
        time_all(quant_candidates(experts.heuristic_config(M), swap_optional=fp8))
        if "heuristic" not in times:
            experts.config_override = None
            raise RuntimeError(f"M={M}: the heuristic configuration did not run")
        shipped = experts.file_config(M)  # as the layer runs it (MXFP4: the borrowed int4 shape as served)
        if shipped is not None:
            time_all({"shipped": shipped.config})
        lent = experts.lender_config(M)  # MXFP4, int8: the int4 entry of this shape, its mma GEMMs kept
        if lent is not None:
            time_all({"lender": lent.config})
        if wgmma and M > LAST_ARRIVAL_MAX_TOKENS:  # fewer tokens: direct or last-arrival GEMMs, not wgmma's
            int8 = experts.quant.weight.dtype is QuantDType.INT8
            time_all(wgmma_grid(int8=int8))
        if M <= FUSED_MAX_TOKENS and fused_unsupported(experts) is None:
            time_all(fused_decode_candidates(cands["heuristic"]))
        # A fused winner's GEMMs only serve larger calls (a file's nearest entry): no search around it.
        first = min(times, key=times.get)
        if first != "heuristic" and cands[first].fused is None:
            time_all({f"{first}+{k}": c for k, c in quant_candidates(cands[first], swap_optional=fp8).items()
                      if k != "heuristic"})
        second = min(times, key=times.get)
        if per_gemm and cands[second].fused is None:
            # The mma kernel where the layer's GEMMs finish by last arrival (its gated GEMM1 needs it).
            mma = M <= LAST_ARRIVAL_MAX_TOKENS and all(
                experts._mma_serves(k) for k in (cfg.hidden_size, cfg.intermediate_size_per_partition))
            grid = {f"{second}+{k}": c
                    for k, c in per_gemm_grid(cands[second], one_dot=not fp8, mma=mma, own_route=M == 1,
                                              prefetch=not fp8 and experts._direct_max_tokens < M <= LAST_ARRIVAL_MAX_TOKENS,
                                              block_ready=not fp8).items()}
            time_all(grid)
            # The grid changes one GEMM at a time: where each GEMM's fastest tile beat `second`, both together.
            wins = [min((n for n in grid if n in times and f"+{gemm}:" in n), key=times.get, default=None)
                    for gemm in ("gemm1", "gemm2")]
            if all(w is not None and times[w] < times[second] for w in wins):
                both = dataclasses.replace(cands[second], gemm1=cands[wins[0]].gemm1, gemm2=cands[wins[1]].gemm2)
                time_all({f"{wins[0]}+{wins[1].rpartition('+')[2]}": both})
        experts.config_override = None
        if past_mma:
            log(f"  M={M}: {len(past_mma)} candidates not timed (an mma GEMM over {MAX_TILES.value} K tiles per split)")
        best = min(times, key=times.get)
        table[M] = cands[best]
        measured[str(M)] = {"best": best, "layer_us": {k: round(v, 2) for k, v in times.items()}}
        against = f"heuristic {times['heuristic']:.1f}"
        if shipped is not None:
            # The shipped configuration, under the name it was timed as (a candidate timed before it if equal).
            name = next((k for k, c in cands.items() if c == shipped.config), None)
            measured[str(M)]["shipped"] = name
            if name in times:
                against += f", shipped ({name}) {times[name]:.1f}"
        log(f"  M={M}: {best} {cands[best]}  {times[best]:.1f} us ({against})")
    return table, measured


def _tune_shape(name: str, E: int, N: int, K: int, top_k: int, activation, has_bias: bool, ms, dtype,
                rep_ms: int, log) -> tuple[ConfigKey, dict[int, KernelConfig], dict]:
    from triton.testing import do_bench

    from moe_core.config import Routing
    from moe_core.routing import route_torch as route
    from moe_triton._common.target import wgmma_capable
    from moe_triton.align import align_block_size
    from moe_triton.gemm import direct_gemm, grouped_gemm

    dev = torch.device("cuda")
    wgmma = wgmma_capable(dev) and dtype in (torch.bfloat16, torch.float16)
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

    def best_of(name_m: str, gemm: str, tiles: list[TileConfig], launch) -> tuple[float, TileConfig] | None:
        timings = []
        for tile in tiles:
            try:
                timings.append((do_bench(functools.partial(launch, tile=tile), warmup=5, rep=rep_ms) * 1e3, tile))
            except Exception as exc:  # a tile the GPU cannot hold (shared memory, registers)
                log(f"  {name_m} {gemm} {tile}: skipped ({type(exc).__name__})")
        return min(timings, key=lambda p: p[0]) if timings else None

    for M in ms:
        x = torch.randn(M, K, device=dev, generator=gen, dtype=dtype)
        tw, ti = route(torch.randn(M, E, device=dev, generator=gen), Routing.softmax_topk(True), top_k)
        inter = torch.randn(M * top_k, N, device=dev, generator=gen, dtype=dtype)
        out = torch.empty(M * top_k, K, device=dev, dtype=dtype)
        name_m = f"{name} M={M}"
        bm0 = block_m_for(M, top_k, E)
        tiled = None  # (gemm1 us, gemm2 us, align us, block_m, tile1, tile2)
        # Twice the rows per block halves the B traffic per row once experts fill such blocks.
        double = 64 <= bm0 < 256 and M * top_k / E >= bm0
        for bm in (bm0, 2 * bm0) if double else (bm0,):
            sorted_ids, expert_ids, total = align_block_size(ti, bm, E)
            common = dict(top_k=top_k, block_m=bm, zero_foreign=True)
            g1 = best_of(name_m, "gemm1", candidates(bm, activation.gated, wgmma), functools.partial(
                grouped_gemm, x, w13, b13, inter, tw, sorted_ids, expert_ids, total, activation=activation,
                mul_weight=False, **common))
            g2 = best_of(name_m, "gemm2", candidates(bm, False, wgmma), functools.partial(
                grouped_gemm, inter, w2, b2, out, tw, sorted_ids, expert_ids, total, activation=None,
                mul_weight=True, **common))
            if g1 is None or g2 is None:
                continue
            t_align = do_bench(functools.partial(align_block_size, ti, bm, E), warmup=5, rep=rep_ms) * 1e3
            if tiled is None or g1[0] + g2[0] + t_align < tiled[0] + tiled[1] + tiled[2]:
                tiled = (g1[0], g2[0], t_align, bm, g1[1], g2[1])
        if tiled is None:
            raise RuntimeError(f"{name_m}: no candidate tile ran")
        t1, t2, t_align, bm, tile1, tile2 = tiled
        t_sum = 0.0
        if top_k > 1:
            t_sum = do_bench(functools.partial(topk_sum, out, top_k, out.dtype), warmup=5, rep=rep_ms) * 1e3
        # (gemm1 tile, gemm2 tile) -> the layer's GEMM time plus the launches that pairing needs.
        options = {(tile1, tile2): t1 + t2 + t_align + t_sum}
        if M * top_k <= DIRECT_MAX_CHOICES:
            d1 = best_of(name_m, "gemm1", direct_candidates("gemm1", top_k), functools.partial(
                direct_gemm, x, w13, b13, inter, tw, ti, None, activation=activation, mul_weight=False))
            d2 = best_of(name_m, "gemm2", direct_candidates("gemm2", top_k), functools.partial(
                direct_gemm, inter, w2, b2, out[:M], tw, ti, None, activation=None, mul_weight=True))
            if d1 is not None:
                options[(d1[1], tile2)] = d1[0] + t2 + t_align + t_sum
            if d2 is not None:
                options[(tile1, d2[1])] = t1 + d2[0] + t_align
            if d1 is not None and d2 is not None:
                options[(d1[1], d2[1])] = d1[0] + d2[0]
        (best1, best2), total_us = min(options.items(), key=lambda kv: kv[1])
        table[M] = KernelConfig(bm, best1, best2)
        measured[str(M)] = {"layer_gemms_us": round(total_us, 2), "tiled_gemm1_us": round(t1, 2),
                            "tiled_gemm2_us": round(t2, 2), "align_us": round(t_align, 2), "sum_us": round(t_sum, 2),
                            "options_us": {f"{a.direct:d}{b.direct:d}": round(v, 2) for (a, b), v in options.items()}}
        log(f"  {name_m}: {table[M]}  ({measured[str(M)]})")
    return key, table, measured


def main(argv: list[str] | None = None) -> int:
    from moe_triton.quantized import LAST_ARRIVAL_MAX_TOKENS

    p = argparse.ArgumentParser(prog="moe tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", nargs="*", default=None, help=f"model presets (default: {', '.join(DEFAULT_PRESETS)})")
    p.add_argument("--shape", nargs="*", default=[], help="extra shapes E,N,K,TOPK (SiLU-gated, no bias)")
    p.add_argument("--m", nargs="*", type=int, default=list(DEFAULT_M), help="token counts to tune")
    # The spellings `moe run` and `moe bench` use are accepted too: one vocabulary across the CLI.
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                   type=lambda text: {"bf16": "bfloat16", "fp16": "float16"}.get(text, text),
                   help="bfloat16 (or bf16), float16 (or fp16)")
    p.add_argument("--out", type=Path, default=Path("moe-triton-configs"), help="folder for the JSON files")
    p.add_argument("--rep-ms", type=int, default=25, help="timing budget per candidate (ms)")
    p.add_argument("--quant", "--scheme", dest="quant", default="none",
                   choices=["none", "int4", "int8", "mxfp4", *FP8_SCHEMES],
                   type=lambda text: "none" if text in _UNQUANTIZED_NAMES else text,
                   help="none (or unquantized, bf16, fp16): the bf16/fp16 kernels; int4: TritonWna16Experts at each "
                        "preset's int4 group size; int8: the same class, per-channel symmetric int8; "
                        "mxfp4: TritonMxfp4Experts (int8 and mxfp4 also time the int4 file's entry of their shape "
                        "with its mma GEMMs); fp8-*: TritonFp8Experts (weight scales per tensor, per "
                        "channel or in 128x128 blocks)")
    p.add_argument("--per-gemm", action="store_true",
                   help="int4, int8, mxfp4, fp8-*: after the greedy steps, each GEMM's split-K x block_n x warps grid "
                        "and its one_dot flipped; quads at decode sizes on NVIDIA each of those tiles also on the "
                        "other of the tl.dot and mma kernels, an mma GEMM's scales_in_tile flipped, at one token an "
                        "mma GEMM1's own_route, in "
                        f"aligned launches up to {LAST_ARRIVAL_MAX_TOKENS} tokens a tl.dot GEMM2's prefetch_tiles, "
                        "int4, int8 and mxfp4 GEMM2's block_ready behind a tl.dot GEMM1 "
                        f"(up to {2 * len(PER_GEMM_SPLITS) * 3 * 2 + 4} more layer timings per M, "
                        f"{2 * (len(PER_GEMM_SPLITS) * 3 * 2 + 1) * 2 + 4} with the mma kernel)")
    from moe_core.bench import CORRECTION_BIAS_STD

    p.add_argument("--correction-bias", type=float, default=None,
                   help="int4, int8, mxfp4, fp8-*: standard deviation of the random per-expert correction bias "
                        f"of routings that take one (DeepSeek-V3; default {CORRECTION_BIAS:g}; `moe bench` draws "
                        f"{CORRECTION_BIAS_STD:g})")
    p.add_argument("--wgmma", action="store_true",
                   help="int4, int8, mxfp4 on Hopper (sm_90): also time both GEMMs on the Gluon wgmma kernel "
                        f"(tune.wgmma_grid, 8-10 more layer timings per M above {LAST_ARRIVAL_MAX_TOKENS} tokens)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe tune: torch sees no GPU; tuning needs the GPU the configurations are for", file=sys.stderr)
        return 2
    if any(m < 1 for m in args.m):
        p.error("--m values must be positive token counts")
    if (args.wgmma or args.per_gemm) and args.quant == "none":
        p.error("--wgmma and --per-gemm are options of the quantized GEMM (--quant int4, int8, mxfp4 or fp8-*)")
    if args.correction_bias is not None and args.quant == "none":
        p.error("--correction-bias: the 16-bit search times each GEMM alone, without routing; "
                "it is an option of --quant int4, int8, mxfp4 or fp8-*")
    if args.correction_bias is not None and args.correction_bias < 0:
        p.error(f"--correction-bias {args.correction_bias:g}: a standard deviation, 0 or more")
    if args.correction_bias is None:
        args.correction_bias = CORRECTION_BIAS
    if args.wgmma and args.quant in FP8_SCHEMES:
        p.error("--wgmma: the quantized wgmma kernel is for int4, int8 and mxfp4 weights")
    if args.quant != "none":
        if args.shape:
            p.error(f"--shape is for the bf16 kernels; {args.quant} tunes model presets (--preset)")
        return _main_quant(args)

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
        _write(key, table, args.out, name, measured, start,
               "each GEMM alone, triton.testing.do_bench (L2 flushed), best of the candidate tiles; direct "
               "(decode) kernels charged with the alignment / top-k sum they need or save (options_us: gemm1 "
               "direct, gemm2 direct)")
    return 0


def _main_quant(args) -> int:
    from moe_core.backends import detect_device
    from moe_core.presets import get_preset
    from moe_core.quant import int4_w4a16, int8_w8a16, mxfp4_w4a16, parse_scheme
    from moe_core.weights.canonical import ExpertWeights
    from moe_triton.quantized import TritonFp8Experts, TritonMxfp4Experts, TritonWna16Experts

    presets = args.preset if args.preset is not None else DEFAULT_PRESETS
    dev = torch.device("cuda")
    print(f"moe tune --quant {args.quant} on {torch.cuda.get_device_name()}: {', '.join(presets)} x M in {args.m}",
          flush=True)
    for name in presets:
        start = time.time()
        preset = get_preset(name)
        if args.quant == "int4":
            quant, cls = int4_w4a16(preset.int4_group_size), TritonWna16Experts
        elif args.quant == "int8":
            quant, cls = int8_w8a16(), TritonWna16Experts
        elif args.quant == "mxfp4":
            quant, cls = mxfp4_w4a16(), TritonMxfp4Experts
        else:
            quant, cls = parse_scheme(args.quant), TritonFp8Experts
        device = detect_device(dev)
        support = cls.supports(preset.config, quant, device)
        if not support:
            print(f"{name}: skipped, {cls.__name__} does not serve it: {support.reason}", flush=True)
            continue
        # Random weights of the preset's shape, packed by the experts class's own weight processor.
        experts = cls(preset.config, quant, device)
        experts.load_weights(ExpertWeights.random(preset.config, quant, device=dev))
        table, measured = _tune_quant_layer(experts, args.m, args.rep_ms, lambda s, n=name: print(n, s, flush=True),
                                           per_gemm=args.per_gemm, wgmma=args.wgmma,
                                           correction_bias=args.correction_bias)
        key = experts.config_key
        del experts  # before _write empties the allocator's cache
        _write(key, table, args.out, name, measured, start,
               "whole layer (routing included) in a CUDA graph, triton.testing.do_bench median (L2 flushed), "
               "random weights (ExpertWeights.random); the heuristic (pick_config), the shipped configuration (MXFP4, "
               "int8: the borrowed int4 one, as served), the int4 entry of the shape with its mma GEMMs (MXFP4, int8), its "
               "neighbours (tune.quant_candidates)" + (", the wgmma tiles (tune.wgmma_grid)" if args.wgmma else "")
               + ", at decode sizes the one-launch path (tune.fused_decode_candidates) where it serves the layer"
               + " and the best one's neighbours"
               + (", then each GEMM's grid (tune.per_gemm_grid)" if args.per_gemm else "") + "; the fastest kept"
               + (f"; routed with a random correction bias of standard deviation {args.correction_bias:g}"
                  if preset.config.routing.has_correction_bias else ""))
    return 0


def _write(key: ConfigKey, table: dict, out: Path, model: str, measured: dict, start: float, method: str) -> None:
    """One tuned file and its provenance (`configs.write_configs`); frees the GPU memory the tuning held."""
    import triton

    versions = {"device_name": torch.cuda.get_device_name(), "triton_version": triton.__version__,
                "torch_version": torch.__version__}
    path = write_configs(key, table, out, versions,
                         provenance={"model": model, "method": method, "measured_us": measured})
    print(f"wrote {path} ({time.time() - start:.0f}s)", flush=True)
    torch.cuda.empty_cache()


if __name__ == "__main__":
    raise SystemExit(main())
