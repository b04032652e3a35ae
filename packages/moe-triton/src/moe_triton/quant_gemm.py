"""The quantized expert GEMMs (int4 / int8 / fp8 / mxfp4 weights): launchers and their torch twin.

`grouped_quant_gemm` runs one GEMM over align-sorted (token, k) pairs, `direct_quant_gemm` one over
topk_ids without alignment (one token's distinct experts); both launch the tl.dot kernel
(`quant_gemm_details._kernel`), or for a `GemmConfig.wgmma` configuration (quads, Hopper) the
Gluon wgmma kernel (`quant_gemm_details._wgmma`). `quant_gemm_torch` is their twin: the per-pair
fp32 result from weights dequantized in torch.

Where things live: weight layouts and `WeightOperand` in `quant_gemm_details._layouts`,
dequantization in `_dequant`, launch heuristics and register plans in `_heuristics`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_core.config import Activation
from moe_triton._common import trace
from moe_triton._common.activation import act_kind
from moe_triton._common.intmath import cdiv, next_power_of_2
from moe_triton._common.pdl import dependent_launch, dependent_options
from moe_triton._common.target import device_info, interpreting, mma_capable, wgmma_capable
from moe_triton.align import max_padded_tokens
from moe_triton.configs import GemmConfig
from moe_triton.quant_gemm_details._dequant import dequantize_operand
from moe_triton.quant_gemm_details._heuristics import (
    L2_PREFETCH_TILES,
    POST_SCALE_MAX_TILE,
    effective_split,
    ws_regs,
)
from moe_triton.quant_gemm_details._kernel import (
    ZERO_BLOCK,
    AScale,
    Ready,
    Sink,
    _moe_wgemm_kernel,
    _zero_kernel,
)
from moe_triton.quant_gemm_details._layouts import WeightOperand, WType

__all__ = ["BlockReady", "LastArrival", "block_count", "direct_quant_gemm", "grouped_quant_gemm", "mma_takes",
           "mma_tiles_per_split", "programs_per_block", "quant_gemm_torch", "zeroed_int32"]


@dataclass(frozen=True)
class LastArrival:
    """Partial sums meet in the fp32 `out` passed to the GEMM (zero on entry); the program that
    adds the last of an output row's contributions to an N tile (top-k choices x K-splits), counted
    in `arrivals`, stores that row of the tile finished (activation, 16-bit cast) to `finished`.
    No launch after the GEMM, and no fp32 pass over the output.

    Invariants: `arrivals` int32 with one zero counter per (output row, N tile), row-major;
    `finished` [output rows, N] (N / 2 after a gated activation), unit column stride."""

    finished: torch.Tensor
    arrivals: torch.Tensor


@dataclass(frozen=True)
class BlockReady:
    """GEMM2 starting on each block of pairs as soon as GEMM1 has stored that block's rows, rather
    than once all of GEMM1 has finished: GEMM2's programs run in the slots GEMM1's last wave leaves
    free. Both launches take one: GEMM1's counts (`wait` False), GEMM2's, the launch right behind it
    on the same alignment (or the same direct pairs), waits (`wait` True). tl.dot kernel only.

    Invariants: `counts` int32 [blocks + 1] (`counts_numel`), zero on entry; GEMM1 adds one per
    program to each block it stored (its own, and the next one where it took that in), and to the
    last counter the int32 elements its side job zeroed (`zero_side`). GEMM2's programs wait for
    their blocks to count `per_block` (GEMM1's programs per block: `programs_per_block`) and, where
    they add into sums, the last counter `zeroed` (GEMM1's zero_side numel, or 0)."""

    counts: torch.Tensor
    wait: bool
    per_block: int = 0
    zeroed: int = 0

    @staticmethod
    def counts_numel(num_pairs: int, block_m: int, num_experts: int, direct: bool) -> int:
        """`counts`' length for a launch over num_pairs pairs: its blocks and the zeroed count."""
        return block_count(num_pairs, block_m, num_experts, direct) + 1


def block_count(num_pairs: int, block_m: int, num_experts: int, direct: bool) -> int:
    """M blocks of a launch over num_pairs pairs: one per pair when direct, else the alignment's
    most blocks of block_m (those past a call's padded total exit at once)."""
    return num_pairs if direct else min(cdiv(max_padded_tokens(num_pairs, block_m, num_experts), block_m), num_pairs)


def programs_per_block(w: WeightOperand, cfg: GemmConfig) -> int:
    """Programs of a launch of cfg on w per M block: its N tiles x K-splits."""
    return cdiv(w.n, cfg.block_n) * effective_split(cfg.split_k, w)


def grouped_quant_gemm(a: torch.Tensor, w: WeightOperand, out: torch.Tensor, sorted_ids: torch.Tensor,
             expert_ids: torch.Tensor, num_post: torch.Tensor, num_valid: int, cfg: GemmConfig, *,
             a_rows_div: int = 1, a_scale: torch.Tensor | None = None, a_scale_mode: AScale = AScale.NONE,
             bias: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
             reduce_topk: int = 1, atomic: bool = False, last_arrival: LastArrival | None = None,
             activation: Activation | None = None, gate_up_chunk: int = 0,
             zero_side: torch.Tensor | None = None, prefetch_l2: bool = False,
             ready: BlockReady | None = None) -> None:
    """out[row] (+)= A[pair // a_rows_div] @ W[expert]^T (+ bias) (* topk weight) for each sorted pair.

    row = pair // reduce_topk; `atomic` accumulates into fp32 `out` (split-K, or the top-k reduce
    of GEMM2 when reduce_topk > 1), `last_arrival` too, finished by the last contributor
    (`LastArrival`); otherwise each pair's row is stored once in out's dtype, after `activation`
    if given (gated: W's rows interleaved by chunks of gate_up_chunk). `zero_side` (int32, any
    size): zeroed by the launch's programs on the side, for the next GEMM. `prefetch_l2`: for a launch
    right after another GEMM of the same alignment (GEMM2 after GEMM1): each program's first
    `cfg.prefetch_tiles` weight tiles head for L2 while that one still runs, as `direct_quant_gemm`'s.
    `ready`: GEMM1 counting its blocks as it stores them, or GEMM2 waiting for its own (`BlockReady`).

    On Hopper and later the launch may start before the previous kernel on the stream ends
    (programmatic dependent launch); its programs wait for that kernel before they read or write.
    """
    _launch(a, w, out, cfg, rows=sorted_ids, experts=expert_ids, num_post=num_post, num_valid=num_valid,
            grid_m=min(cdiv(sorted_ids.numel(), cfg.block_m), num_valid), direct=False,
            has_map=False, a_rows_div=a_rows_div, a_scale=a_scale, a_scale_mode=a_scale_mode, bias=bias,
            topk_weights=topk_weights, reduce_topk=reduce_topk, sink=_sink(atomic, last_arrival),
            last_arrival=last_arrival, activation=activation, gate_up_chunk=gate_up_chunk, zero_side=zero_side,
            prefetch_l2=prefetch_l2, ready=ready)


def direct_quant_gemm(a: torch.Tensor, w: WeightOperand, out: torch.Tensor, topk_ids: torch.Tensor,
                    expert_map: torch.Tensor | None, cfg: GemmConfig, *, a_rows_div: int = 1,
                    a_scale: torch.Tensor | None = None, a_scale_mode: AScale = AScale.NONE,
                    bias: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                    reduce_topk: int = 1, atomic: bool = False, last_arrival: LastArrival | None = None,
                    activation: Activation | None = None, gate_up_chunk: int = 0,
                    zero_side: torch.Tensor | None = None, prefetch_l2: bool = False,
                    own_route: torch.Tensor | None = None, ready: BlockReady | None = None) -> None:
    """`grouped_quant_gemm` without alignment: one block per pair (pair = t * top_k + s of topk_ids int32 [M, top_k]).

    Pairs of one expert each stream its weights, so this suits pairs of distinct experts (one
    token's top-k) and a few tokens' (`quantized.DIRECT_MAX_TOKENS`). `expert_map` int32 [E]:
    global -> local id, -1 for another rank's experts.
    `prefetch_l2`: for a launch right after another direct launch (GEMM2 after GEMM1): each
    program's first weight tiles (`L2_PREFETCH_TILES`) head for L2 while that one still runs.
    It takes effect where the launch is dependent (`moe_triton._common.pdl`) and the weights
    are quads stored tile-major, and changes no result.
    `own_route`: for GEMM1 right behind the routing launch (a_rows_div = top_k), the router logits
    [M, E] whose top-k by logit topk_ids is, as `moe_triton.routing.route` chooses for a softmax over
    ungrouped experts without a bias (lower ids first among equal logits, -Inf at the lowest finite
    value): the mma kernel's programs rank their pair's expert from them in the same way and run
    their whole split while the routing launch still does; topk_ids itself is not read. It takes
    effect on the mma kernel in a dependent launch without an expert map, and changes no result for
    such topk_ids (other ids would not be the ones computed).
    `ready`: as `grouped_quant_gemm`'s, a block per pair.
    """
    pairs = topk_ids.view(-1)
    # The kernel's sorted-ids and expert-ids pointers carry the pairs' experts and the map here.
    _launch(a, w, out, cfg, rows=pairs, experts=expert_map if expert_map is not None else pairs, num_post=pairs,
            num_valid=pairs.numel(), grid_m=pairs.numel(), direct=True, has_map=expert_map is not None,
            a_rows_div=a_rows_div, a_scale=a_scale, a_scale_mode=a_scale_mode, bias=bias,
            topk_weights=topk_weights, reduce_topk=reduce_topk, sink=_sink(atomic, last_arrival),
            last_arrival=last_arrival, activation=activation, gate_up_chunk=gate_up_chunk, zero_side=zero_side,
            prefetch_l2=prefetch_l2, own_route=own_route, ready=ready)


def _sink(atomic: bool, last_arrival: LastArrival | None) -> Sink:
    if atomic and last_arrival is not None:
        raise ValueError("atomic and last_arrival are two different sinks: pass one")
    return Sink.LAST_ARRIVAL if last_arrival is not None else (Sink.ATOMIC if atomic else Sink.STORE)


def _launch(a: torch.Tensor, w: WeightOperand, out: torch.Tensor, cfg: GemmConfig, *, rows: torch.Tensor,
            experts: torch.Tensor, num_post: torch.Tensor, num_valid: int, grid_m: int, direct: bool,
            has_map: bool, a_rows_div: int, a_scale: torch.Tensor | None, a_scale_mode: AScale,
            bias: torch.Tensor | None, topk_weights: torch.Tensor | None, reduce_topk: int, sink: Sink,
            last_arrival: LastArrival | None, activation: Activation | None, gate_up_chunk: int,
            zero_side: torch.Tensor | None, prefetch_l2: bool = False, own_route: torch.Tensor | None = None,
            ready: BlockReady | None = None) -> None:
    if w.k % w.block_k and not (w.quads and w.codes.shape[2] == w.k_tiles):
        raise ValueError(f"block_k={w.block_k} does not divide K={w.k} (only quads codes pad K to whole "
                         f"tiles), codes {list(w.codes.shape)}")
    if a.shape[1] != w.k:
        raise ValueError(f"activations have {a.shape[1]} columns, the weights expect K={w.k}")
    split = effective_split(cfg.split_k, w)
    if (split > 1 or reduce_topk > 1) and not (sink is not Sink.STORE and out.dtype == torch.float32):
        raise ValueError("split-K and the top-k reduce accumulate atomically into an fp32 output")
    if activation is not None and sink is Sink.ATOMIC:
        raise ValueError("an activation needs whole sums: a STORE or LAST_ARRIVAL sink, not ATOMIC")
    if gate_up_chunk and not (activation is not None and activation.gated and cfg.block_n % (2 * gate_up_chunk) == 0):
        raise ValueError(f"interleaved gate/up chunks of {gate_up_chunk} rows need a gated activation and "
                         f"block_n divisible by {2 * gate_up_chunk}, got {activation} and {cfg}")
    if activation is not None and activation.gated and not gate_up_chunk:
        raise ValueError("a gated activation in the GEMM needs w's rows interleaved (gate_up_chunk > 0)")
    if (out.stride(1) if out.dim() == 2 else 1) != 1:
        raise ValueError("the GEMM output needs a unit column stride")
    if _swapped(w) and not cfg.swap_ab:
        raise ValueError("4-bit weights and int8 quads run swapped only (the weights are the MMA's register "
                         f"operand): got {cfg}")
    if cfg.tail and not w.quads:
        raise ValueError(f"taken-in tails (GemmConfig.tail) are an option of weights in a quads layout, got "
                         f"{w.wtype.name} {w.codes.dtype}")
    tail = 0 if direct else cfg.tail  # a direct launch's blocks hold one pair each: nothing to take in
    n_tiles = cdiv(w.n, cfg.block_n)
    # N tiles first in the launch order (the kernel's N_FIRST) where the grid's second axis holds
    # the M blocks; decode keeps M first (one token: blocks are pairs of distinct experts).
    n_first = not direct and sink is not Sink.LAST_ARRIVAL and grid_m < 2**16
    grid = (n_tiles, grid_m, split) if n_first else (grid_m, n_tiles, split)
    fin = out
    arrivals = rows  # never read without LAST_ARRIVAL
    if last_arrival is not None:
        fin, arrivals = last_arrival.finished, last_arrival.arrivals
        out_rows = -(-num_valid // reduce_topk)
        if arrivals.dtype != torch.int32 or arrivals.numel() < out_rows * n_tiles:
            raise ValueError(f"last-arrival sums need int32 arrivals >= {out_rows} rows x {n_tiles} N tiles, got "
                             f"{arrivals.dtype} [{arrivals.numel()}]")
        if fin.stride(1) != 1:
            raise ValueError("the finished output needs a unit column stride")
    programs = grid_m * n_tiles * split
    zero_numel = zero_side.numel() if zero_side is not None else 0
    if zero_side is not None and (zero_side.dtype != torch.int32 or not zero_side.is_contiguous()
                                  or zero_numel >= 2**31):
        raise ValueError("zero_side must be a contiguous int32 tensor below 2**31 elements")
    zero_chunk = cdiv(cdiv(zero_numel, programs), ZERO_BLOCK.value) * ZERO_BLOCK.value
    if ready is not None:
        if cfg.mma or cfg.wgmma:
            raise ValueError(f"blocks counted ready between the GEMMs (BlockReady) are the tl.dot kernel's, got {cfg}")
        if ready.counts.dtype != torch.int32 or not ready.counts.is_contiguous() or ready.counts.numel() < grid_m + 1:
            raise ValueError(f"BlockReady counts must be contiguous int32 >= {grid_m} blocks + 1, got "
                             f"{ready.counts.dtype} [{ready.counts.numel()}]")
        if ready.wait and zero_side is not None:
            raise ValueError("the launch that waits for blocks (BlockReady.wait) cannot zero on the side: what it zeroes "
                             "may still be in use by the launch ahead")
    if cfg.mma:
        _check_mma(a, w, split, sink=sink, a_scale_mode=a_scale_mode, gate_up_chunk=gate_up_chunk)
        # Gluon is imported only when a configuration asks for this kernel.
        from moe_triton.quant_gemm_details._mma import moe_mma_gemm_kernel

        trace_buf = trace.buffer("gemm", programs, a.device)
        own = own_route is not None and direct and not has_map and dependent_launch(a.device)
        if own and (own_route.dim() != 2 or own_route.stride(1) != 1 or own_route.shape[0] * a_rows_div != num_valid):
            raise ValueError(f"own_route must be the router logits [tokens, experts] with unit column stride, a row per "
                             f"{a_rows_div} pairs of {num_valid}, got {list(own_route.shape)}")
        moe_mma_gemm_kernel[grid](
            a, w.codes, w.scale, w.zero if w.zero is not None else w.scale, bias if bias is not None else w.scale,
            out, topk_weights if topk_weights is not None else w.scale, rows, experts, num_post, fin, arrivals,
            zero_side if zero_side is not None else arrivals, w.n, w.k, num_valid, reduce_topk * split, zero_numel,
            zero_chunk, float(activation.alpha or 0.0) if activation else 0.0,
            float(activation.limit or 0.0) if activation else 0.0,
            a.stride(0), w.codes.stride(0), w.codes.stride(1), w.codes.stride(2), w.scale.stride(0), w.scale.stride(1),
            bias.stride(0) if bias is not None else 0, out.stride(0), fin.stride(0),
            GROUP=w.group if w.group < w.k_tiles * w.block_k else 0, WTYPE=int(w.wtype), FOLDED_SCALE=w.folded_scale,
            HAS_ZP=w.zero is not None,
            CODE_OFFSET=w.code_offset, HAS_BIAS=bias is not None, A_ROWS_DIV=a_rows_div,
            MUL_ROUTED=topk_weights is not None, REDUCE_TOPK=reduce_topk, SINK=int(sink),
            ACT=int(act_kind(activation)) if activation else 0, GATE_UP_CHUNK=gate_up_chunk,
            ZERO_SIDE=zero_side is not None, DIRECT=direct, HAS_MAP=has_map, N_FIRST=n_first, BLOCK_M=cfg.block_m,
            TILES=cdiv(w.k_tiles, split), BLOCK_N=cfg.block_n, EVEN_N=w.n % cfg.block_n == 0,
            STAGES=max(2, cfg.num_stages), STAGED_SCALES=not cfg.scales_in_tile and w.scale_rows_in_pieces,
            EARLY_WEIGHTS=prefetch_l2 and direct and dependent_launch(a.device), trace_ptr=trace_buf,
            TRACE=trace_buf is not None, num_warps=cfg.num_warps,
            OWN_ROUTE=own, ROUTE_E_P2=max(32, next_power_of_2(own_route.shape[1])) if own else 32,
            route_ptr=own_route if own else w.scale, stride_route=own_route.stride(0) if own else 0,
            num_experts=own_route.shape[1] if own else 0, **dependent_options(a.device),
            **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}))
        return
    if cfg.wgmma:
        # Per-channel scales have one row, whose stride may be anything (1 after a transpose): 0 keeps
        # the scale-row addresses provably 16-byte aligned for cp.async.
        scale_rows_stride = w.scale.stride(1) if w.scale.shape[1] > 1 else 0
        _check_wgmma(a, w, scale_rows_stride, direct=direct, sink=sink, a_scale_mode=a_scale_mode)
        # Gluon is imported only when a configuration asks for this kernel.
        from moe_triton.quant_gemm_details._wgmma import moe_w4a16_wgmma_kernel

        if not n_first:
            raise ValueError(f"the wgmma GEMM launches M blocks on the grid's second axis (below 65536): "
                             f"{grid_m} blocks of {cfg.block_m} pairs; take a larger block_m")
        regs = ws_regs(cfg.block_m)
        moe_w4a16_wgmma_kernel[grid](
            a, w.codes, w.scale, w.zero if w.zero is not None else w.scale, bias if bias is not None else w.scale,
            out, topk_weights if topk_weights is not None else w.scale, rows, experts, num_post,
            zero_side if zero_side is not None else rows, w.n, w.k, num_valid, zero_numel, zero_chunk,
            float(activation.alpha or 0.0) if activation else 0.0, float(activation.limit or 0.0) if activation else 0.0,
            a.stride(0), w.codes.stride(0), w.codes.stride(1), w.codes.stride(2), w.scale.stride(0), scale_rows_stride,
            bias.stride(0) if bias is not None else 0, out.stride(0),
            GROUP=w.group, WTYPE=int(w.wtype), FOLDED_SCALE=w.folded_scale, HAS_ZP=w.zero is not None,
            CODE_OFFSET=w.code_offset, HAS_BIAS=bias is not None,
            A_ROWS_DIV=a_rows_div, MUL_ROUTED=topk_weights is not None, REDUCE_TOPK=reduce_topk,
            ATOMIC=sink is Sink.ATOMIC, ACT=int(act_kind(activation)) if activation else 0,
            GATE_UP_CHUNK=gate_up_chunk, ZERO_SIDE=zero_side is not None, SPLIT_K=split, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, K_TAIL=w.k % w.block_k != 0,
            PRODUCER_WARPS=regs.producer_warps, CONSUMER_REGS=regs.consumer_regs,
            PRODUCER_REGS=regs.producer_regs, TAIL=cfg.tail, ROW_SCALE=w.one_scale_row,
            num_warps=4, maxnreg=regs.maxnreg)
        return
    trace_buf = trace.buffer("gemm", programs, a.device)
    s = w.scale
    if w.wtype is WType.FP8:
        sst = (s.stride(0), 0, 0) if s.dim() == 1 else (
            (s.stride(0), 0, s.stride(1)) if s.dim() == 2 else (s.stride(0), s.stride(2), s.stride(1)))
    else:
        sst = (s.stride(0), s.stride(1), s.stride(2))
    codes = w.codes
    # (expert, k within a tile, n, K tile) strides of the codes.
    if _swapped(w):  # quads or halves: [E, N, K tiles, words per tile]
        bst = (codes.stride(0), codes.stride(3), codes.stride(1), codes.stride(2))
    else:  # canonical [E, N, K] (the K loop steps through stride_bk)
        bst = (codes.stride(0), codes.stride(2), codes.stride(1), 0)
    a_scale_t = a_scale if a_scale is not None else a
    ast = (a_scale_t.stride(0), a_scale_t.stride(1) if a_scale_t.dim() == 2 else 0)
    nvidia = codes.is_cuda and torch.version.hip is None and not interpreting()  # PTX and ptxas's options
    post_scale = w.quads and w.group % w.block_k == 0 and not tail and cfg.block_m * cfg.block_n <= POST_SCALE_MAX_TILE
    # Per-channel int4 keeps POST_SCALE where it applies: on tiles of at most 16 x 128 outputs, which the
    # borrowed g128 entries sized, ROW_SCALE's chained accumulator takes 127 registers against 95 (0.90x
    # where that costs a wave; docs/design/triton-gemm-quantized.md).
    row_scale = w.quads and w.one_scale_row and not (post_scale and w.wtype is WType.INT4)
    _moe_wgemm_kernel[grid](
        a, a_scale_t, codes, s, w.zero if w.zero is not None else s, bias if bias is not None else s, out,
        topk_weights if topk_weights is not None else s, rows, experts, num_post, fin, arrivals,
        zero_side if zero_side is not None else arrivals,
        ready.counts if ready is not None else arrivals,
        w.n, w.k, num_valid, reduce_topk * split, zero_numel, zero_chunk, grid_m if ready is not None else 0,
        ready.per_block if ready is not None else 0, ready.zeroed if ready is not None else 0,
        float(activation.alpha or 0.0) if activation else 0.0, float(activation.limit or 0.0) if activation else 0.0,
        a.stride(0), a.stride(1), ast[0], ast[1],
        *bst, *sst,
        bias.stride(0) if bias is not None else 0, out.stride(0), fin.stride(0),
        GROUP=max(w.group, 1), WTYPE=int(w.wtype), A_SCALE=int(a_scale_mode),
        W_SCALE_PER_N=s.dim() >= 2, HAS_ZP=w.zero is not None, CODE_OFFSET=w.code_offset,
        HAS_BIAS=bias is not None, A_ROWS_DIV=a_rows_div, MUL_ROUTED=topk_weights is not None,
        REDUCE_TOPK=reduce_topk, SINK=int(sink), ACT=int(act_kind(activation)) if activation else 0,
        GATE_UP_CHUNK=gate_up_chunk, ZERO_SIDE=zero_side is not None, SPLIT_K=split,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=w.block_k,
        SWAP_AB=_swapped(w) or (cfg.swap_ab and w.wtype is WType.FP8),
        UPCAST=interpreting() and a.dtype == torch.bfloat16, DIRECT=direct, HAS_MAP=has_map,
        QUADS=w.quads, PTX=nvidia,
        POST_SCALE=(1 if direct else 2) if post_scale and not row_scale else 0,
        FOLDED_SCALE=w.folded_scale,
        K_TAIL=w.k % w.block_k != 0, N_FIRST=n_first, GROUP_M=cfg.group_m if n_first else 1, NARROW=cfg.narrow and not direct,
        PREFETCH_TILES=(L2_PREFETCH_TILES if direct else cfg.prefetch_tiles)
        if prefetch_l2 and (direct or cfg.prefetch_tiles) and _prefetchable(w) else 0, TAIL=tail,
        ONE_DOT=cfg.one_dot and w.quads, SCALE_PAIRS=_scale_pairs(w, cfg), ROW_SCALE=row_scale,
        READY=int(Ready.ALL if ready is None else (Ready.WAIT if ready.wait else Ready.COUNT)),
        trace_ptr=trace_buf, TRACE=trace_buf is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **dependent_options(w.codes.device),
        **({"maxnreg": cfg.max_registers} if cfg.max_registers and nvidia else {}),
    )


def _scale_pairs(w: WeightOperand, cfg: GemmConfig) -> bool:
    """The tl.dot kernel's SCALE_PAIRS: int4 quads with scale groups below the K tile (two or four rows
    per tile) on tiles whose scale row gives each thread less than 4 bytes (block_n below 64 per warp:
    one 16-bit scale, which cp.async cannot copy) read each row as int32 words of two scales
    (`WeightOperand.scale_rows_in_pairs`). On the H200 gpt-oss-120b's int4 layer on 128-row tiles ran
    1.20-1.30x faster so; int8's one row per tile stays a plain load (0.95-1.03x, some tiles' registers
    up by 19)."""
    return (cfg.block_n < 64 * cfg.num_warps and w.wtype is WType.INT4 and w.group < w.block_k and w.quads
            and w.scale_rows_in_pairs)


def _swapped(w: WeightOperand) -> bool:
    """Weights the kernel runs swapped (as the MMA's register operand), in [E, N, K tiles, words]:
    every quads layout (int4, MXFP4, int8) and int4's halves; canonical int8 and fp8 are [E, N, K]."""
    return w.quads or w.wtype is WType.INT4


def _prefetchable(w: WeightOperand) -> bool:
    """Whether a dependent launch can prefetch w's weights into L2 (the kernel's PREFETCH_TILES):
    quads stored tile-major, scales (and zero points) with contiguous rows, on a GPU whose
    launches are dependent (sm_90 and later: the bulk prefetch is an sm_90 instruction)."""
    c = w.codes
    return (w.quads and c.stride(3) == 1 and c.stride(1) == c.shape[3] and w.scale.stride(2) == 1
            and (w.zero is None or w.zero.stride() == w.scale.stride()) and dependent_launch(c.device))


def zeroed_int32(numel: int, device: torch.device) -> torch.Tensor:
    """A zeroed int32 buffer (GEMM sums and arrival counts), zeroed by a dependent launch: unlike a
    fill, it starts while the kernel ahead still runs, so its launch latency hides there."""
    out = torch.empty(numel, dtype=torch.int32, device=device)
    block = 1024
    _zero_kernel[(cdiv(numel, block),)](out, numel, BLOCK=block, **dependent_options(device))
    return out


def mma_takes(wtype: WType, quads: bool, block_k: int, group: int) -> bool:
    """Weights the mma kernel (`quant_gemm_details._mma`) takes: int4, int8 or MXFP4 in a quads layout
    of 128-wide K tiles, int4 and int8 with scale groups of 32, 64 or a multiple of 128 (a per-channel
    row covers the padded K: `WeightOperand.group`), MXFP4 with its groups of 32."""
    return quads and block_k == 128 and (
        (wtype in (WType.INT4, WType.INT8) and (group % 128 == 0 or group in (32, 64)))
        or (wtype is WType.MXFP4 and group == 32))


def mma_tiles_per_split(w: WeightOperand, split_k: int) -> int:
    """K tiles each program of an mma launch of w in split_k splits unrolls (the kernel takes
    `_mma.MAX_TILES` at most)."""
    return cdiv(w.k_tiles, split_k)


def _check_mma(a: torch.Tensor, w: WeightOperand, split: int, *, sink: Sink, a_scale_mode: AScale,
               gate_up_chunk: int) -> None:
    """What the mma kernel (`quant_gemm_details._mma`) takes; a clear error for anything else."""
    from moe_triton.quant_gemm_details._mma import MAX_TILES

    wants = []
    if not mma_capable(device_info(a.device)):
        wants.append(f"an NVIDIA GPU of sm_80 or later (mma.sync), compiled, got {a.device}"
                     + (" under the interpreter" if interpreting() else ""))
    takes_weights = mma_takes(w.wtype, w.quads, w.block_k, w.group)
    if not takes_weights:
        wants.append(f"int4, int8 or MXFP4 weights in a quads layout (128-wide K tiles; int4 and int8 scale groups of "
                     f"32, 64 or a multiple of 128, MXFP4's of 32), got {w.wtype.name} {w.codes.dtype} "
                     f"quads={w.quads} block_k={w.block_k} group={w.group}")
    if a.dtype not in (torch.bfloat16, torch.float16) or a_scale_mode is not AScale.NONE:
        wants.append(f"bf16 or fp16 activations without scales, got {a.dtype} {a_scale_mode.name}")
    if sink is Sink.STORE and gate_up_chunk:
        wants.append("a gated activation finished by last arrival (not a STORE sink)")
    tiles = mma_tiles_per_split(w, split)
    if tiles > MAX_TILES.value:
        wants.append(f"at most {MAX_TILES.value} K tiles per split, got {tiles} ({w.k_tiles} tiles in {split} splits)")
    if a.stride(1) != 1 or (takes_weights and (w.codes.stride(3) != 1 or w.scale.stride(2) != 1 or (
            w.zero is not None and w.zero.stride() != w.scale.stride()))):
        wants.append("unit-stride activation columns, quads words and scale columns, and zero points strided like "
                     "the scales")
    if wants:
        raise ValueError("the mma GEMM (GemmConfig.mma) needs " + "; ".join(wants))


def _check_wgmma(a: torch.Tensor, w: WeightOperand, scale_rows_stride: int, *, direct: bool, sink: Sink,
                 a_scale_mode: AScale) -> None:
    """What the wgmma kernel (`quant_gemm_details._wgmma`) takes; a clear error for anything else."""
    wants = []
    if not wgmma_capable(a.device):
        wants.append(f"an NVIDIA Hopper GPU (sm_90), got {a.device}"
                     + (f" (sm_{''.join(map(str, torch.cuda.get_device_capability(a.device)))})"
                        if a.is_cuda and not interpreting() else ""))
    if not (w.quads and w.block_k == 128):
        wants.append(f"weights in a quads layout (int4 or MXFP4 in int16 words, int8 in int32 words) with 128-wide "
                     f"K tiles, got {w.wtype.name} "
                     f"{w.codes.dtype} block_k={w.block_k}")
    if a.dtype not in (torch.bfloat16, torch.float16) or a_scale_mode is not AScale.NONE:
        wants.append(f"bf16 or fp16 activations without scales, got {a.dtype} {a_scale_mode.name}")
    if direct or sink is Sink.LAST_ARRIVAL:
        wants.append("aligned launches with a STORE or ATOMIC sink (no direct launch, no last-arrival sums)")
    if a.stride(1) != 1 or w.codes.stride(3) != 1 or w.scale.stride(2) != 1 or (
            w.zero is not None and w.zero.stride() != w.scale.stride()):
        wants.append("unit-stride activation columns, quads words, scale columns, and zero points "
                     "strided like the scales")
    # cp.async moves 16-byte pieces: activation rows, scale rows (and uint8 zero-point rows), in
    # elements of the narrowest of them.
    piece = 16 // min(w.scale.element_size(), w.zero.element_size() if w.zero is not None else 2)
    if a.stride(0) % 8 or w.n % piece or scale_rows_stride % piece or w.scale.stride(0) % piece:
        wants.append(f"rows that split into 16-byte pieces (activation row stride a multiple of 8, N and the "
                     f"scale strides multiples of {piece}), got {a.stride(0)}, N={w.n}, {w.scale.stride()}")
    if wants:
        raise ValueError("the wgmma GEMM (GemmConfig.wgmma) needs " + "; ".join(wants))


def quant_gemm_torch(a: torch.Tensor, w: WeightOperand, pair_expert: torch.Tensor, *, a_rows_div: int = 1,
                   a_scale: torch.Tensor | None = None, a_scale_mode: AScale = AScale.NONE,
                   bias: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 [num_pairs, N]: the kernel's per-pair result (before any top-k reduce).

    pair_expert: local expert of each pair (-1: skipped, row left zero).
    """
    wf = dequantize_operand(w)
    P = pair_expert.numel()
    rows = torch.arange(P, device=a.device) // a_rows_div
    x = a.float()[rows]
    if a_scale_mode is AScale.ROW:
        x = x * a_scale.float()[rows].view(P, 1)
    elif a_scale_mode is AScale.GROUP:
        x = x * a_scale.float()[rows].repeat_interleave(128, 1)[:, : w.k]
    out = torch.zeros(P, w.n, dtype=torch.float32, device=a.device)
    for e in pair_expert.unique().tolist():
        if e < 0:
            continue
        sel = pair_expert == e
        y = x[sel] @ wf[e].T
        if bias is not None:
            y = y + bias[e].float()
        out[sel] = y
    if topk_weights is not None:
        out = out * topk_weights.float().reshape(P, 1)
    return out
