"""SASS instructions per weight in the quantized GEMMs' K loop, from an offline sm_90 build (no GPU:
Triton's own ptxas and cuobjdump), for the table in docs/design/triton-gemm-quantized.md.

    python benchmarks/gpu/sass_k_loop.py [--ops]

The builds specialize the unit strides (activation columns, quads words, scale columns) as Triton
does at launch for arguments equal to 1 (`offline_compile.DEFAULT_CONSTEXPRS`): left as run-time
values, the words would load 2 bytes at a time through registers instead of by cp.async, and the
counts would describe another kernel. The counts are the installed Triton's: with the GPU's (3.6 on
the H200 image, e.g. a `triton==3.6.0` install ahead on PYTHONPATH) qwen3-30b-a3b's one-token int4
GEMM1 gives the K-loop length of the GPU build (221 instructions). The K loop is the longest backward
branch of the kernel (of one consumer for the wgmma kernel); per weight = its instructions /
(weights per thread per K tile). --ops also prints each loop's opcode mix.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from pathlib import Path

import triton

from moe_triton._common.offline_compile import compile_quant_gemm, compile_wgmma_gemm

QUADS = dict(QUADS=True, BLOCK_K=128, SWAP_AB=True)
MXFP4 = dict(GROUP=32, WTYPE=3, CODE_OFFSET=0)
MXFP4_PTRS = {"b_ptr": "*i16", "s_ptr": "*i32"}
FP8_PTRS = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "s_ptr": "*fp32"}


def _fp8(a_scale: int, block_m: int, swap: bool = False) -> tuple:
    """An fp8 tl.dot case: activation scales per row (1) or 128-wide group (2, with 128x128 weight blocks)."""
    return ("dot", dict(GROUP=1, WTYPE=2, A_SCALE=a_scale, CODE_OFFSET=0, BLOCK_K=128, SWAP_AB=swap,
                        BLOCK_M=block_m), FP8_PTRS, 128)


# name: (kernel, constexprs, pointer types, weights per thread per K tile)
CASES = {
    "tl.dot BM16 x BN128, int4 g128 (POST_SCALE)": (
        "dot", dict(QUADS, GROUP=128, WTYPE=0, POST_SCALE=True), {"b_ptr": "*i16"}, 128 * 128 // 128),
    "tl.dot BM16 x BN128, int4 g64 (scaled per weight)": (
        "dot", dict(QUADS, GROUP=64, WTYPE=0), {"b_ptr": "*i16"}, 128 * 128 // 128),
    "tl.dot BM16 x BN128, MXFP4 folded": ("dot", dict(QUADS, **MXFP4, FOLDED_SCALE=True), MXFP4_PTRS, 128),
    "tl.dot BM16 x BN128, MXFP4 two factors": ("dot", dict(QUADS, **MXFP4), MXFP4_PTRS, 128),
    "tl.dot BM32 x BN256, K tail, SwiGLU, int4 g64 (gpt-oss)": (
        "dot", dict(QUADS, GROUP=64, WTYPE=0, BLOCK_M=32, BLOCK_N=256, K_TAIL=True, ACT=4, GATE_UP_CHUNK=32,
                    HAS_BIAS=True), {"b_ptr": "*i16"}, 256),
    "tl.dot BM32 x BN256, K tail, SwiGLU, MXFP4 folded (gpt-oss)": (
        "dot", dict(QUADS, **MXFP4, FOLDED_SCALE=True, BLOCK_M=32, BLOCK_N=256, K_TAIL=True, ACT=4,
                    GATE_UP_CHUNK=32, HAS_BIAS=True), MXFP4_PTRS, 256),
    "tl.dot BM64 x BN128, int8 g128": (
        "dot", dict(GROUP=128, WTYPE=1, CODE_OFFSET=128, BLOCK_K=128, SWAP_AB=False, BLOCK_M=64),
        {"b_ptr": "*u8"}, 128),
    "tl.dot BM64 x BN128, fp8 per channel x per token": _fp8(a_scale=1, block_m=64),
    "tl.dot BM64 x BN128, fp8 128x128 blocks": _fp8(a_scale=2, block_m=64),
    "tl.dot BM16 x BN128, fp8 128x128 blocks": _fp8(a_scale=2, block_m=16),
    "tl.dot BM16 x BN128, fp8 128x128 blocks, swapped": _fp8(a_scale=2, block_m=16, swap=True),
    "tl.dot BM16 x BN128, fp8 per channel x per token": _fp8(a_scale=1, block_m=16),
    "tl.dot BM16 x BN128, fp8 per channel x per token, swapped": _fp8(a_scale=1, block_m=16, swap=True),
    "tl.dot BM64 x BN128, int8 byte quads g128": (
        "dot", dict(QUADS, GROUP=128, WTYPE=1, CODE_OFFSET=128, BLOCK_M=64), {"b_ptr": "*i32"}, 128),
    "tl.dot BM16 x BN128, int8 byte quads per channel (ROW_SCALE)": (
        "dot", dict(QUADS, GROUP=2048, WTYPE=1, CODE_OFFSET=128, ROW_SCALE=True), {"b_ptr": "*i32"}, 128),
    "tl.dot BM64 x BN128, tail 16, int8 byte quads per channel (ROW_SCALE)": (
        "dot", dict(QUADS, GROUP=2048, WTYPE=1, CODE_OFFSET=128, ROW_SCALE=True, BLOCK_M=64, TAIL=16),
        {"b_ptr": "*i32"}, 128),
    "wgmma BM128 x BN256 per consumer, int4 g128": ("wgmma", {}, {}, 128),
    "wgmma BM128 x BN256 per consumer, int8 byte quads per channel (3 stages, ROW_SCALE)": (
        "wgmma", dict(WTYPE=1, CODE_OFFSET=128, GROUP=2048, STAGES=3, ROW_SCALE=True), {"b_ptr": "*i32"}, 128),
    "wgmma BM128 x BN256 per consumer, int8 byte quads g128 (3 stages)": (
        "wgmma", dict(WTYPE=1, CODE_OFFSET=128, GROUP=128, STAGES=3), {"b_ptr": "*i32"}, 128),
    "wgmma BM128 x BN256 per consumer, MXFP4 folded": (
        "wgmma", dict(MXFP4, FOLDED_SCALE=True), {"s_ptr": "*i32"}, 128),
}


def sass(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction) of each SASS instruction of a cubin (Triton's cuobjdump)."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]


def opcodes(code: list[str]) -> collections.Counter:
    """How many of each opcode (predicates and modifiers dropped) the instructions hold."""
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in code)


def k_loop(cubin: bytes) -> list[str]:
    """The instructions of the innermost loop (backward branch) around an MMA (wgmma: [HQI]GMMA; mma: HMMA) in a
    cubin's SASS."""
    code = sass(cubin)
    loops = [(int(t.group(1), 16), addr) for addr, text in code
             if (t := re.search(r"BRA\s.*?0x([0-9a-f]+)", text)) and int(t.group(1), 16) < addr]
    bodies = [[text for addr, text in code if start <= addr <= end] for start, end in loops]
    return min((body for body in bodies if any(re.search(r"GMMA|HMMA", text) for text in body)), key=len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", action="store_true", help="print each loop's most frequent opcodes")
    args = parser.parse_args()
    for name, (kernel, consts, pointers, weights_per_thread) in CASES.items():
        built = (compile_quant_gemm(consts, pointers) if kernel == "dot" else compile_wgmma_gemm(consts, pointers))
        loop = k_loop(built.asm["cubin"])
        print(f"{name}: {len(loop)} instructions, {len(loop) / weights_per_thread:.2f} per weight")
        if args.ops:
            ops = opcodes(loop)
            print("   ", ", ".join(f"{op} {n}" for op, n in ops.most_common(14)))


if __name__ == "__main__":
    main()
