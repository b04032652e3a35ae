"""What the persistent wgmma kernels (`gemm_wgmma`, `quant_gemm_wgmma`) share: a tile index handed
from the warpgroup that takes it off the layer's counter to the warpgroups that multiply it, and the
rule by which a full block takes in its expert's last block (TAIL).

Tiles are taken one at a time from an int32 counter (zero at launch), so the tiles in flight stay a
window of the launch order, as a hardware-scheduled grid's would: programs that share an expert's
weight tile read it together. A fixed round-robin lets programs drift apart (0.65-0.97x as fast on
the H100, benchmarks/results/bf16_persistent_session21_2026-11-22.md).
"""

from __future__ import annotations

__all__ = ["publish", "receive", "tail_role"]

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

_warpgroup_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # renamed after Triton 3.6


@gluon.jit
def publish(tile_ids, tile_ready, tile_free, taken, t):
    """Hand tile index t (the taken-th) to the receiving warpgroups, in slot taken % 2 of tile_ids
    (int32 [2, 1]); tile_ready[slot] completes on this arrival, tile_free[slot] on one per receiver."""
    slot = taken % 2
    mbarrier.wait(tile_free.index(slot), ((taken // 2) & 1) ^ 1)  # a fresh barrier passes phase 1
    tile_ids.index(slot).store(gl.full([1], t, gl.int32, gl.BlockedLayout([1], [32], [gl.num_warps()], [0])))
    mbarrier.arrive(tile_ready.index(slot), count=1)


@gluon.jit
def receive(tile_ids, tile_ready, tile_free, taken):
    """A receiving warpgroup's taken-th tile index; the slot is handed back once every warp read it."""
    slot = taken % 2
    mbarrier.wait(tile_ready.index(slot), (taken // 2) & 1)
    t = gl.max(tile_ids.index(slot).load(gl.BlockedLayout([1], [32], [gl.num_warps()], [0])), axis=0)
    _warpgroup_barrier()
    mbarrier.arrive(tile_free.index(slot), count=1)
    return t


@gluon.jit
def tail_role(pid_m, e, num_pid_m, sorted_ids_ptr, expert_ids_ptr, num_valid, BLOCK_M: gl.constexpr,
              TAIL: gl.constexpr):
    """(taken in, absorbs) of row block pid_m of expert e >= 0 (num_pid_m blocks in the layer). With
    TAIL, a block with at most TAIL valid rows after one of the same expert's (an expert's last,
    after a full one) is taken in by that block: the block before multiplies those rows too (a
    second accumulator on the same weight tiles), so the expert's weights are read once less. Both
    sides make the same test."""
    taken_in = pid_m < 0  # False, as a run-time value
    absorbs = taken_in
    if TAIL > 0:
        has_prev = pid_m > 0
        prev_e = gl.load(expert_ids_ptr + pid_m - 1, mask=has_prev, other=-1)
        taken_in = has_prev & (prev_e == e) & (gl.load(sorted_ids_ptr + pid_m * BLOCK_M + TAIL) >= num_valid)
        has_next = pid_m + 1 < num_pid_m
        next_e = gl.load(expert_ids_ptr + pid_m + 1, mask=has_next, other=-1)
        next_tail = gl.load(sorted_ids_ptr + (pid_m + 1) * BLOCK_M + TAIL, mask=has_next, other=0)
        absorbs = has_next & (next_e == e) & (next_tail >= num_valid)
    return taken_in, absorbs
