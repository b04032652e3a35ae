"""Per-program timestamps of the decode chain's launches (a diagnostic; benchmarks/gpu/trace_decode.py).

While `recording()` is active, each traced launch (the router, the quantized GEMMs) gets a zeroed
int64 buffer [programs, 5] and its programs write (start, after the dependent-launch wait, products
done (a GEMM's K loop, before its sink; 0 in the router), end, SM id) there, the times from the
GPU's global timer in ns; a GEMM program that returns early (no block of pairs to work on) writes
nothing. Outside a recording the kernels are built with TRACE=False and nothing changes.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

COLUMNS = 5  # start, released, products done, end, SM
_COLUMNS = tl.constexpr(COLUMNS)  # the kernels' copy: jit code reads only constexpr globals
_records: list[tuple[str, torch.Tensor]] | None = None
_reused: list[tuple[str, torch.Tensor]] | None = None


@contextlib.contextmanager
def recording(reuse: list[tuple[str, torch.Tensor]] | None = None):
    """Collects (launch name, buffer) for every traced launch made inside; yields that list. reuse:
    the list of an earlier recording of the same calls, whose buffers are handed out again in order
    (so a CUDA graph capture allocates and clears nothing)."""
    global _records, _reused
    previous = _records, _reused
    _records, _reused = [], reuse
    try:
        yield _records
    finally:
        _records, _reused = previous


def buffer(name: str, programs: int, device: torch.device) -> torch.Tensor | None:
    """A launch's trace buffer while recording, else None."""
    if _records is None:
        return None
    if _reused is not None:
        reused_name, t = _reused[len(_records)]
        if reused_name != name or t.shape[0] != programs:
            raise RuntimeError(f"traced launch {len(_records)}: {name} x {programs} where the recording reused has "
                               f"{reused_name} x {t.shape[0]}")
    else:
        t = torch.zeros(programs, COLUMNS, dtype=torch.int64, device=device)
    _records.append((name, t))
    return t


@triton.jit
def now(TRACE: tl.constexpr = True):
    """The global timer (ns) where TRACE, else 0 (no instruction). Gluon kernels call these helpers
    too (scalars only: no layout)."""
    if TRACE:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    else:
        t = 0
    return t


@triton.jit
def _sm_id():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _row(trace_ptr):
    pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
    return trace_ptr + pid.to(tl.int64) * _COLUMNS


@triton.jit
def mark_products_done(trace_ptr, TRACE: tl.constexpr):
    """A GEMM program's products are in registers (its K loop done), its sink ahead."""
    if TRACE:
        tl.store(_row(trace_ptr) + 2, now())


@triton.jit
def store(trace_ptr, t_start, t_released, TRACE: tl.constexpr):
    """The program's row: its start, its release from the wait, now (its end), its SM."""
    if TRACE:
        row = _row(trace_ptr)
        tl.store(row, t_start)
        tl.store(row + 1, t_released)
        tl.store(row + 3, now())
        tl.store(row + 4, _sm_id().to(tl.int64))
