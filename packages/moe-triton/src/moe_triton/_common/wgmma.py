"""Gluon pieces both Hopper wgmma GEMMs share (`gemm_details._wgmma`, `quant_gemm_details._wgmma`)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["EPILOGUE_LAYOUT", "tail_role"]

# Epilogue layout of a consumer warpgroup: threads along the weight rows (the output rows'
# contiguous dimension), tokens across warps.
EPILOGUE_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 1], [32, 1], [1, 4], [0, 1]))


@gluon.jit
def tail_role(pid_m, e, num_pid_m, sorted_ids_ptr, expert_ids_ptr, num_valid, BLOCK_M: gl.constexpr,
              TAIL: gl.constexpr):
    """(taken in, absorbs) of row block pid_m (of num_pid_m) of expert e >= 0. With TAIL, a block
    with at most TAIL valid rows after one of the same expert's (an expert's last, after a full one)
    is taken in by that block: the block before multiplies those rows too (a second accumulator on
    the same weight tiles), so the expert's weights are read once less; the same test on both sides.
    Shared by the quantized wgmma GEMM and the 16-bit persistent wgmma GEMM."""
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

