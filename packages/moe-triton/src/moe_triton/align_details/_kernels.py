"""Triton kernels behind `moe_triton.align`.

One launch up to 4096 choices, three beyond:
- up to 256 choices (decode and small batches), one program ranks every choice by comparing it
  with the earlier ones (`_align_pairs_kernel`): a [choices, choices] tile whatever the expert
  count;
- while a one-hot [choices, experts] tile stays small (few experts), one program ranks with a
  cumulative sum down it, which is stable and needs no atomics (`_align_single_kernel`);
- up to 4096 choices, programs of 128 choices each count all choices and rank their own pairwise
  (`_align_chunks_kernel`): nothing passes between programs;
- beyond, three launches over chunks of _RANK_CHUNK choices: a histogram per chunk -> each
  chunk's base within its experts (programs over slices of the experts, each scanning every
  chunk) -> pairwise ranks, scatter and the expert per block.
Why these limits: docs/design/triton-routing-align-reduce.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_triton._common.intmath import cdiv, next_power_of_2
from moe_triton._common.pdl import dependent_options, wait_then_release

# Up to this many choices one program ranks them pairwise (`_align_pairs_kernel`).
_PAIRWISE_CHOICES = 256
# Else one program handles the whole input while its one-hot tile stays this small (few experts).
_SINGLE_PROGRAM_TILE = 16384
# Else up to this many, programs of _RANK_CHUNK choices each count them all and rank their own
# (`_align_chunks_kernel`), in one launch.
_CHUNKED_CHOICES = 4096
_RANK_CHUNK = 128
# The multi-launch scan: experts per program (one program over all experts is slow at many
# chunks), and counts per step ([rows, experts]).
_SCAN_EXPERTS = 16
_SCAN_TILE = 4096
_FILL_TILE = 1024


@triton.jit
def _fill(ptr, value, lo, hi, TILE: tl.constexpr):
    """ptr[lo:hi] = value (int32)."""
    for start in range(lo, hi, TILE):
        pos = start + tl.arange(0, TILE)
        tl.store(ptr + pos, tl.full([TILE], 0, tl.int32) + value, mask=pos < hi)


@triton.jit
def _pairwise_ranks(ids, pos):
    """Stable rank of each choice within its expert: how many choices of the same expert come
    before it (pos: the choices' positions, in the same layout as ids)."""
    return tl.sum(((ids[None, :] == ids[:, None]) & (pos[None, :] < pos[:, None])).to(tl.int32), axis=1)


@triton.jit
def _block_experts(expert_ids_ptr, expert_map_ptr, ends, total, first, last,
                   HAS_MAP: tl.constexpr, BLOCK_SIZE: tl.constexpr, E_P2: tl.constexpr, TILE: tl.constexpr):
    """expert_ids[b] for first <= b < last: the expert whose padded segment holds block b (mapped),
    -1 past the total."""
    end_blocks = ends // BLOCK_SIZE
    total_blocks = total // BLOCK_SIZE
    for start in range(first, last, TILE):
        blocks = start + tl.arange(0, TILE)
        expert = tl.sum((end_blocks[None, :] <= blocks[:, None]).to(tl.int32), axis=1)
        live = blocks < total_blocks
        if HAS_MAP:
            expert = tl.load(expert_map_ptr + expert, mask=live, other=-1)
        expert = tl.where(live, expert, -1)
        tl.store(expert_ids_ptr + blocks, expert, mask=blocks < last)


@triton.jit
def _align_single_kernel(topk_ids_ptr, expert_map_ptr, sorted_ptr, expert_ids_ptr, total_ptr,
                         numel, num_experts, max_padded, max_blocks,
                         HAS_MAP: tl.constexpr, BLOCK_SIZE: tl.constexpr, NUMEL_P2: tl.constexpr,
                         E_P2: tl.constexpr, FILL_TILE: tl.constexpr, PDL: tl.constexpr):
    wait_then_release(PDL)  # topk_ids come from the kernel ahead (routing, in a layer)
    offs = tl.arange(0, NUMEL_P2)
    valid = offs < numel
    ids = tl.load(topk_ids_ptr + offs, mask=valid, other=-1)
    experts = tl.arange(0, E_P2)
    onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
    counts = tl.sum(onehot, axis=0)
    rank = tl.sum(tl.cumsum(onehot, axis=0) * onehot, axis=1) - 1
    padded = (counts + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(total_ptr, total)
    _fill(sorted_ptr, numel, 0, max_padded, FILL_TILE)
    # The sentinel fill and the scatter below touch the same addresses from different threads.
    tl.debug_barrier()
    my_start = tl.sum(onehot * starts[None, :], axis=1)
    tl.store(sorted_ptr + my_start + rank, offs, mask=valid)
    _block_experts(expert_ids_ptr, expert_map_ptr, ends, total, 0, max_blocks, HAS_MAP, BLOCK_SIZE, E_P2, 128)


@triton.jit
def _align_pairs_kernel(topk_ids_ptr, expert_map_ptr, sorted_ptr, expert_ids_ptr, total_ptr,
                        numel, max_padded, max_blocks,
                        HAS_MAP: tl.constexpr, BLOCK_SIZE: tl.constexpr, NUMEL_P2: tl.constexpr,
                        E_P2: tl.constexpr, FILL_TILE: tl.constexpr, PDL: tl.constexpr):
    """Up to _PAIRWISE_CHOICES choices: ranks from a pairwise [choices, choices] comparison instead
    of a one-hot [choices, experts] scan, segment starts gathered per choice, and each choice writes
    its block's expert (every live block holds a choice, and a block's choices agree), so no tile
    grows with the expert count."""
    wait_then_release(PDL)  # topk_ids come from the kernel ahead (routing, in a layer)
    offs = tl.arange(0, NUMEL_P2)
    valid = offs < numel
    ids = tl.load(topk_ids_ptr + offs, mask=valid, other=0)
    counts = tl.histogram(ids, E_P2, mask=valid)
    padded = (counts + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    ends = tl.cumsum(padded, axis=0)
    tl.store(total_ptr, tl.sum(padded, axis=0))
    rank = _pairwise_ranks(ids, offs)
    dest = tl.gather(ends - padded, ids, 0) + rank
    _fill(sorted_ptr, numel, 0, max_padded, FILL_TILE)
    _fill(expert_ids_ptr, -1, 0, max_blocks, FILL_TILE)
    # The fills and the scatters below touch the same addresses from different threads.
    tl.debug_barrier()
    tl.store(sorted_ptr + dest, offs, mask=valid)
    block_expert = ids
    if HAS_MAP:
        block_expert = tl.load(expert_map_ptr + ids, mask=valid, other=-1)
    tl.store(expert_ids_ptr + dest // BLOCK_SIZE, block_expert, mask=valid)


@triton.jit
def _align_chunks_kernel(topk_ids_ptr, expert_map_ptr, sorted_ptr, expert_ids_ptr, total_ptr,
                         numel, max_padded, max_blocks, fill_per_program, blocks_per_program,
                         HAS_MAP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BS_P2: tl.constexpr,
                         NUMEL_P2: tl.constexpr, E_P2: tl.constexpr, EXPERTS_PER_PROGRAM: tl.constexpr,
                         CHUNK: tl.constexpr, FILL_TILE: tl.constexpr, PDL: tl.constexpr):
    """One launch over chunks of CHUNK choices, nothing shared between programs: each counts every
    choice (all: segment sizes; those before its chunk: its bases within them), ranks its chunk's
    choices pairwise and scatters them. The sentinel goes only where no choice lands (the tails of
    segments, a few experts per program, and past the padded total), so no program's fill can
    overwrite another's scatter; each program also fills a stripe of the block experts."""
    wait_then_release(PDL)  # topk_ids come from the kernel ahead (routing, in a layer)
    pid = tl.program_id(0)
    num_chunks = tl.num_programs(0)
    everyone = tl.arange(0, NUMEL_P2)
    all_ids = tl.load(topk_ids_ptr + everyone, mask=everyone < numel, other=0)
    counts = tl.histogram(all_ids, E_P2, mask=everyone < numel)
    earlier = tl.histogram(all_ids, E_P2, mask=everyone < tl.minimum(pid * CHUNK, numel))
    padded = (counts + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    if pid == 0:
        tl.store(total_ptr, total)
    local = tl.arange(0, CHUNK)
    offs = pid * CHUNK + local
    valid = offs < numel
    ids = tl.load(topk_ids_ptr + offs, mask=valid, other=0)
    rank = _pairwise_ranks(ids, local)
    tl.store(sorted_ptr + tl.gather(starts + earlier, ids, 0) + rank, offs, mask=valid)
    # Segment tails of experts pid, pid + num_chunks, ...
    mine = pid + tl.arange(0, EXPERTS_PER_PROGRAM) * num_chunks
    expert = tl.where(mine < E_P2, mine, 0)
    tail_start = tl.gather(starts + counts, expert, 0)
    tail_len = tl.where(mine < E_P2, tl.gather(padded - counts, expert, 0), 0)
    j = tl.arange(0, BS_P2)
    tl.store(sorted_ptr + tail_start[:, None] + j[None, :], tl.full([EXPERTS_PER_PROGRAM, BS_P2], 0, tl.int32) + numel,
             mask=j[None, :] < tail_len[:, None])
    # Past the padded total, a stripe per program.
    lo = pid * fill_per_program
    _fill(sorted_ptr, numel, tl.maximum(lo, total), tl.minimum(lo + fill_per_program, max_padded), FILL_TILE)
    first = pid * blocks_per_program
    _block_experts(expert_ids_ptr, expert_map_ptr, ends, total, first, tl.minimum(first + blocks_per_program, max_blocks),
                   HAS_MAP, BLOCK_SIZE, E_P2, 16)


@triton.jit
def _align_count_kernel(topk_ids_ptr, hist_ptr, sorted_ptr, numel, max_padded, fill_per_program,
                        CHUNK: tl.constexpr, E_P2: tl.constexpr, FILL_TILE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    valid = offs < numel
    ids = tl.load(topk_ids_ptr + offs, mask=valid, other=0)
    tl.store(hist_ptr + pid * E_P2 + tl.arange(0, E_P2), tl.histogram(ids, E_P2, mask=valid))
    # Each program also writes the sentinel over its stripe; the scatter runs in a later launch.
    lo = pid * fill_per_program
    _fill(sorted_ptr, numel, lo, tl.minimum(lo + fill_per_program, max_padded), FILL_TILE)


@triton.jit
def _align_offsets_kernel(hist_ptr, counts_ptr, num_chunks,
                          E_P2: tl.constexpr, EXPERTS: tl.constexpr, ROWS: tl.constexpr):
    """For experts [pid EXPERTS, (pid + 1) EXPERTS): per-chunk counts -> each chunk's exclusive base
    within its expert, in place, and each expert's count to counts_ptr."""
    experts = tl.program_id(0) * EXPERTS + tl.arange(0, EXPERTS)
    rows = tl.arange(0, ROWS)
    running = tl.zeros([EXPERTS], tl.int32)
    counts = tl.load(hist_ptr + rows[:, None] * E_P2 + experts[None, :], mask=rows[:, None] < num_chunks, other=0)
    for start in range(0, num_chunks, ROWS):
        # The next rows are loaded before this step's scan: the loop is bound by load latency.
        later = start + ROWS + rows
        later_counts = tl.load(hist_ptr + later[:, None] * E_P2 + experts[None, :], mask=later[:, None] < num_chunks,
                               other=0)
        here = start + rows
        inclusive = tl.cumsum(counts, axis=0)
        tl.store(hist_ptr + here[:, None] * E_P2 + experts[None, :], inclusive - counts + running[None, :],
                 mask=here[:, None] < num_chunks)
        running += tl.sum(counts, axis=0)
        counts = later_counts
    tl.store(counts_ptr + experts, running)


@triton.jit
def _align_scatter_kernel(topk_ids_ptr, hist_ptr, counts_ptr, total_ptr, expert_map_ptr, sorted_ptr, expert_ids_ptr,
                          numel, max_blocks, blocks_per_program,
                          HAS_MAP: tl.constexpr, BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr, E_P2: tl.constexpr):
    """Every program derives the padded segments from the experts' counts (program 0 stores the
    total), ranks its chunk's choices pairwise (stable) and scatters them."""
    pid = tl.program_id(0)
    experts = tl.arange(0, E_P2)
    padded = (tl.load(counts_ptr + experts) + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    ends = tl.cumsum(padded, axis=0)
    total = tl.sum(padded, axis=0)
    if pid == 0:
        tl.store(total_ptr, total)
    local = tl.arange(0, CHUNK)
    offs = pid * CHUNK + local
    valid = offs < numel
    ids = tl.load(topk_ids_ptr + offs, mask=valid, other=0)
    rank = _pairwise_ranks(ids, local)
    base = ends - padded + tl.load(hist_ptr + pid * E_P2 + experts)
    tl.store(sorted_ptr + tl.gather(base, ids, 0) + rank, offs, mask=valid)
    first = pid * blocks_per_program
    _block_experts(expert_ids_ptr, expert_map_ptr, ends, total, first,
                   tl.minimum(first + blocks_per_program, max_blocks), HAS_MAP, BLOCK_SIZE, E_P2, 16)


def launch_align(topk_ids: torch.Tensor, block_size: int, num_experts: int, expert_map: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    device = topk_ids.device
    numel = topk_ids.numel()
    max_padded = numel + num_experts * (block_size - 1)
    max_blocks = cdiv(max_padded, block_size)
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=device)
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=device)
    total = torch.empty(1, dtype=torch.int32, device=device)
    e_p2 = next_power_of_2(num_experts)
    numel_p2 = next_power_of_2(max(numel, 1))
    has_map = expert_map is not None
    map_arg = expert_map if has_map else expert_ids  # never read without HAS_MAP
    # The one-launch kernels launch dependent on the routing kernel ahead (`moe_triton._common.pdl`).
    dependent = dependent_options(device)
    if numel_p2 <= _PAIRWISE_CHOICES:
        _align_pairs_kernel[(1,)](topk_ids, map_arg, sorted_ids, expert_ids, total, numel, max_padded, max_blocks,
                                  HAS_MAP=has_map, BLOCK_SIZE=block_size, NUMEL_P2=numel_p2, E_P2=e_p2,
                                  FILL_TILE=_FILL_TILE, num_warps=4, **dependent)
        return sorted_ids, expert_ids, total
    if numel_p2 * e_p2 <= _SINGLE_PROGRAM_TILE:
        _align_single_kernel[(1,)](topk_ids, map_arg, sorted_ids, expert_ids, total, numel, num_experts,
                                   max_padded, max_blocks, HAS_MAP=has_map, BLOCK_SIZE=block_size,
                                   NUMEL_P2=numel_p2, E_P2=e_p2, FILL_TILE=_FILL_TILE, num_warps=4, **dependent)
        return sorted_ids, expert_ids, total
    if numel_p2 <= _CHUNKED_CHOICES:
        num_chunks = cdiv(numel, _RANK_CHUNK)
        _align_chunks_kernel[(num_chunks,)](
            topk_ids, map_arg, sorted_ids, expert_ids, total, numel, max_padded, max_blocks,
            cdiv(max_padded, num_chunks), cdiv(max_blocks, num_chunks), HAS_MAP=has_map,
            BLOCK_SIZE=block_size, BS_P2=next_power_of_2(block_size), NUMEL_P2=numel_p2, E_P2=e_p2,
            EXPERTS_PER_PROGRAM=next_power_of_2(cdiv(e_p2, num_chunks)), CHUNK=_RANK_CHUNK,
            FILL_TILE=_FILL_TILE, num_warps=4, **dependent)
        return sorted_ids, expert_ids, total
    num_chunks = cdiv(numel, _RANK_CHUNK)
    hist = torch.empty(num_chunks * e_p2, dtype=torch.int32, device=device)
    counts = torch.empty(e_p2, dtype=torch.int32, device=device)
    _align_count_kernel[(num_chunks,)](topk_ids, hist, sorted_ids, numel, max_padded, cdiv(max_padded, num_chunks),
                                       CHUNK=_RANK_CHUNK, E_P2=e_p2, FILL_TILE=256, num_warps=4)
    scan_experts = min(e_p2, _SCAN_EXPERTS)
    _align_offsets_kernel[(e_p2 // scan_experts,)](hist, counts, num_chunks, E_P2=e_p2, EXPERTS=scan_experts,
                                                   ROWS=_SCAN_TILE // scan_experts, num_warps=4)
    # The scatter programs also fill expert_ids, a slice each.
    _align_scatter_kernel[(num_chunks,)](topk_ids, hist, counts, total, map_arg, sorted_ids, expert_ids, numel,
                                         max_blocks, cdiv(max_blocks, num_chunks), HAS_MAP=has_map,
                                         BLOCK_SIZE=block_size, CHUNK=_RANK_CHUNK, E_P2=e_p2, num_warps=4)
    return sorted_ids, expert_ids, total
