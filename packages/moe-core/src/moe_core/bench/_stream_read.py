"""Plain streaming reads in Triton for the read ceiling (`roofline.read_kernels`): each program loads
its run of int32 words (16-byte loads) and stores their xor, so every byte is read and next to
nothing written. torch's own readers stream below what a layer's weight stream reaches on some GPUs
(an H200's fp32 sum 4.2-4.4 TB/s from run to run, its cuBLAS GEMMs of 16 and 64 columns 3.8-4.2,
where bf16 MoE layers read their weights at up to 4.6)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl


@triton.jit
def _xor_words(src_ptr, out_ptr, n_words, WORDS: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * WORDS + tl.arange(0, WORDS)
    words = tl.load(src_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(words, 0))


# (int32 words, warps) per program: 16 KiB on 4 warps and 64 KiB on 8, the bytes in flight a GPU
# needs to cover its DRAM latency whichever way it schedules them.
SHAPES = ((4096, 4), (16384, 8))


def stream_readers(src: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """A reader of all of `src` (bytes, a multiple of 4) per shape of SHAPES, each returning its
    programs' xors."""
    words = src.view(torch.int32)
    readers = {}
    for per_program, warps in SHAPES:
        programs = triton.cdiv(words.numel(), per_program)
        out = torch.empty(programs, dtype=torch.int32, device=src.device)

        def read(out=out, programs=programs, per_program=per_program, warps=warps) -> torch.Tensor:
            _xor_words[(programs,)](words, out, words.numel(), WORDS=per_program, num_warps=warps)
            return out

        readers[f"triton read {per_program * 4 // 1024} KiB"] = read
    return readers
