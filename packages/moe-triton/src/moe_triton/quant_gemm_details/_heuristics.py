"""Launch choices of the quantized GEMM that are not in a tuned file: the measured heuristic tile
(`pick_config`), the effective K-splits, when the scale is applied after the dots, how many weight
tiles a one-token GEMM2 prefetches into L2, and the register plans of the warp-specialized wgmma
kernel. The measurements behind each number: docs/design/triton-gemm-quantized.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_triton.configs import GemmConfig
from moe_triton.quant_gemm_details._layouts import WeightOperand, WType

__all__ = ["FOLDED_REGS", "FP8_SWAP_BLOCK_K", "FP8_SWAP_MAX_BLOCK_M", "GROUP_M_BLOCKS", "GROUP_M_MIN_EXPERT_WEIGHTS",
           "L2_PREFETCH_TILES", "POST_SCALE_MAX_TILE", "WS_REGS", "WarpSpecializedRegs", "effective_split", "pick_config",
           "ws_regs"]

# fp8 experts whose weights outgrow the L2 cache (mixtral-8x7b: 117 and 59 MB per expert) launch their
# M blocks in groups of 16 (GemmConfig.group_m) from 32-pair blocks up: an expert's blocks then read
# each weight tile from DRAM together, not once per block. 1.10-1.42x on an H100 at 128-8192 tokens,
# fp8 blocks and channels alike; nothing gained at deepseek-v3's 29 MB or qwen3-235b-a22b's 13 MB, nor for
# int8 (its K loop is bound by the int -> float conversion).
GROUP_M_BLOCKS = 16
GROUP_M_MIN_EXPERT_WEIGHTS = 32 << 20

# fp8 blocks of at most this many pairs run swapped (GemmConfig.swap_ab) where their K tiles are
# FP8_SWAP_BLOCK_K wide: the weight tile is then the 64-row side of Hopper's fp8 wgmma, where unswapped
# blocks below 64 rows run as fp16 mma.sync (H200: 1-18% faster at 1-128 tokens). With 64-wide tiles
# (gpt-oss's K = 2880) swapped measured 1.4-2.7% slower from 8 tokens on (+1.2% at one token).
FP8_SWAP_MAX_BLOCK_M = 32
FP8_SWAP_BLOCK_K = 128


def pick_config(num_pairs: int, num_experts: int, w: WeightOperand, sms: int) -> GemmConfig:
    """Tile shape and split-K for one GEMM: memory-bound at small M (stream weights from many
    programs at once), tensor-core tiles once each expert sees enough rows to reuse its weights.

    4-bit weights and int8 quads run swapped (see the kernel's SWAP_AB): block_m is then the MMA's
    N side, so it can stay at 16 for a handful of tokens per expert without wasting MMA rows. fp8
    with 128-wide K tiles runs swapped in blocks below 64 pairs (FP8_SWAP_MAX_BLOCK_M), where its dot
    would otherwise convert every code for fp16 mma.sync."""
    per_expert = num_pairs / max(1, min(num_experts, num_pairs))
    # 32-pair blocks from 9 pairs per expert; three stages (the tuner found one stage fewer than
    # four faster in nearly every cell).
    if per_expert <= 8:
        bm, bn, warps, stages = 16, 128 if w.n >= 1024 else 64, 4, 3
    elif per_expert <= 48:
        bm, bn, warps, stages = 32, 128, 4, 3
    elif per_expert <= 192:
        bm, bn, warps, stages = 64, 128, 4, 3
    else:
        bm, bn, warps, stages = 128, 128, 8, 3
    m_blocks = min(num_pairs, -(-num_pairs // bm) + min(num_experts, num_pairs))
    programs = m_blocks * -(-w.n // bn)
    k_tiles = w.k_tiles
    # K-splits until about 8 programs per SM (sms: the GPU's multiprocessors) stream weights at once.
    target = 8 * sms
    split = 1
    while programs * split * 2 <= target and k_tiles // (split * 2) >= 2:
        split *= 2
    swap = w.quads or w.wtype is WType.INT4 or (w.wtype is WType.FP8 and bm <= FP8_SWAP_MAX_BLOCK_M
                                                and w.block_k == FP8_SWAP_BLOCK_K)
    grouped = w.wtype is WType.FP8 and bm >= 32 and w.n * w.k >= GROUP_M_MIN_EXPERT_WEIGHTS
    return GemmConfig(bm, bn, split, warps, stages, swap, group_m=GROUP_M_BLOCKS if grouped else 1)


def effective_split(split_k: int, w: WeightOperand) -> int:
    """K-splits a launch runs: split_k, less any that would get no K tile (so every split adds)."""
    k_tiles = w.k_tiles
    return -(-k_tiles // -(-k_tiles // split_k))


# Quads tiles that lie in one scale group take their scale after the tile's dots (POST_SCALE) when
# the output tile has at most this many elements: one fp32 multiply per output instead of one per
# weight pair, for a second accumulator that larger tiles cannot afford. A launch that takes in
# tails (GemmConfig.tail) scales per weight. The kernel loads such a tile's scales one tile ahead
# (POST_SCALE 2: the pipeliner stages only what feeds the dots), except in direct launches (1: in
# the tile), where the registers the early load holds cost one-token GEMMs programs per SM
# (docs/design/triton-gemm-quantized.md). Per-channel int8 scales its sums once, after the K loop,
# instead (the kernel's ROW_SCALE; per-channel int4 does so on larger tiles).
POST_SCALE_MAX_TILE = 16 * 128

# K tiles per program a one-token GEMM2 asks L2 for while GEMM1 runs (`quant_direct_gemm`'s
# prefetch_l2): its K loop starts on L2 hits instead of a cold DRAM stream. More tiles overflow L2
# beside GEMM1's weight stream.
L2_PREFETCH_TILES = 1


@dataclass(frozen=True)
class WarpSpecializedRegs:
    """Register plan of the warp-specialized wgmma kernel (`_wgmma`): two consumer warpgroups (the
    default partition and a worker) and, unless the consumers copy their own tiles, a producer
    warpgroup."""

    producer_warps: int  # copy warps, their warpgroup allocated whole; 0: the consumers copy (the kernel's FOLDED)
    consumer_regs: int  # per consumer thread; 2 * consumer_regs + producer_regs <= 3 * maxnreg (with a producer)
    producer_regs: int  # per producer thread; below the MMA loop's need, ptxas serializes the wgmma
    maxnreg: int  # per thread at launch; all warps * 32 * maxnreg fit the 64K-register file


# A producer warpgroup: 12 warps at 168 registers, the consumers raised to 192, the producer down to 120.
WS_REGS = WarpSpecializedRegs(producer_warps=4, consumer_regs=192, producer_regs=120, maxnreg=168)
# Copies folded into the consumers: 8 warps at 255 registers (256 as allocated: the whole file; Gluon
# sets the worker's to 248, the default partition's to 256). A 128-pair block's MMA loop needs about
# 240 to stay asynchronous (with a producer, ptxas serializes each consumer's wgmma there); above
# that, fewer copy addresses spill (int8's) and the layer runs faster
# (docs/design/triton-gemm-quantized.md, register plans).
FOLDED_REGS = WarpSpecializedRegs(producer_warps=0, consumer_regs=255, producer_regs=0, maxnreg=255)


def ws_regs(block_m: int) -> WarpSpecializedRegs:
    """The wgmma kernel's register plan for blocks of block_m pairs: folded copies for 128-pair
    blocks, a producer warpgroup for 64 pairs or fewer (faster there)."""
    return FOLDED_REGS if block_m == 128 else WS_REGS
