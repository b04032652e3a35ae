"""Compile the kernels for a GPU target without a GPU (Triton's own ptxas).

The CPU interpreter runs the kernels' Python, not Triton's compiler, so a kernel can pass every
interpreted test and still fail to compile (a loop-carried variable changing type, a layout the
backend refuses). `compile_quant_gemm` builds one specialization of the quantized tl.dot GEMM for
sm_90 so CI sees those errors (the GPU benchmarks read the SASS of the same build).
`compile_wgmma_gemm` does the same for the quantized Gluon kernel (`quant_gemm_details._wgmma`),
which the interpreter cannot run at all, `compile_mma_gemm` for the Gluon mma.sync one
(`quant_gemm_details._mma`), `compile_bf16_wgmma_gemm` for the 16-bit one
(`gemm_details._wgmma`); `compile_kernel` for any other Triton kernel (the alignment's);
`run_compiler_script` runs such builds in a child process without the interpreter, as the tests do.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from moe_triton.quant_gemm_details._heuristics import ws_regs
from moe_triton.quant_gemm_details._kernel import _moe_wgemm_kernel

__all__ = ["BF16_WGMMA_CONSTEXPRS", "DEFAULT_CONSTEXPRS", "MMA_CONSTEXPRS", "WGMMA_CONSTEXPRS",
           "compile_bf16_wgmma_gemm", "compile_kernel", "compile_mma_gemm", "compile_quant_gemm", "compile_wgmma_gemm",
           "run_compiler_script"]

# A bf16 int4 (halves) GEMM storing its tiles: what a specialization changes is given over it. The
# unit strides (activation and weight columns, scale rows' N) are constants as in a launch, where Triton
# specializes arguments equal to 1: with them the loads are contiguous runs the pipeliner stages by
# cp.async, as on the GPU.
DEFAULT_CONSTEXPRS = dict(
    stride_ak=1, stride_bk=1, stride_sn=1,
    GROUP=128, WTYPE=0, A_SCALE=0, W_SCALE_PER_N=True, HAS_ZP=False, CODE_OFFSET=8, HAS_BIAS=False, A_ROWS_DIV=1,
    MUL_ROUTED=False, REDUCE_TOPK=1, SINK=0, ACT=0, GATE_UP_CHUNK=0, ZERO_SIDE=False, SPLIT_K=1, BLOCK_M=16,
    BLOCK_N=128, BLOCK_K=64, SWAP_AB=True, UPCAST=False, DIRECT=False, HAS_MAP=False, QUADS=False, PTX=True,
    POST_SCALE=0, FOLDED_SCALE=False, PDL=False, K_TAIL=False, N_FIRST=False, GROUP_M=1, NARROW=False, PREFETCH_TILES=0,
    TAIL=0, ONE_DOT=False, READY=0, SCALE_PAIRS=False, ROW_SCALE=False, TRACE=False)

# Pointer arguments' element types for a bf16 layer; the others default to i32 scalars.
_POINTERS = {"a_ptr": "*bf16", "a_scale_ptr": "*fp32", "s_ptr": "*bf16", "z_ptr": "*u8", "bias_ptr": "*fp32",
             "c_ptr": "*fp32", "topk_w_ptr": "*fp32", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
             "num_post_ptr": "*i32", "fin_ptr": "*bf16", "arrivals_ptr": "*i32", "zero_ptr": "*i32",
             "ready_ptr": "*i32",
             "alpha": "fp32", "limit": "fp32", "route_ptr": "*fp32"}


# GEMM1 of a bf16 int4 (quads, group 128) layer with its gated activation, on the wgmma kernel
# (launched with the register plan `ws_regs` gives its BLOCK_M).
WGMMA_CONSTEXPRS = dict(
    GROUP=128, WTYPE=0, FOLDED_SCALE=False, HAS_ZP=False, CODE_OFFSET=8, HAS_BIAS=False, A_ROWS_DIV=8,
    MUL_ROUTED=False, REDUCE_TOPK=1, ATOMIC=False, ACT=1, GATE_UP_CHUNK=32, ZERO_SIDE=True, SPLIT_K=1, BLOCK_M=128,
    BLOCK_N=256, STAGES=4, K_TAIL=False, TAIL=0, ROW_SCALE=False)


# A one-token GEMM1 of a bf16 int4 (quads, group 128) layer on the mma kernel: its four K tiles per
# split (scale rows copied with the words), the gated activation by the last arrival, GEMM2's sums
# zeroed on the side, a dependent launch.
MMA_CONSTEXPRS = dict(
    GROUP=128, WTYPE=0, FOLDED_SCALE=False, HAS_ZP=False, CODE_OFFSET=8, HAS_BIAS=False, A_ROWS_DIV=8,
    MUL_ROUTED=False, REDUCE_TOPK=1, SINK=2, ACT=1, GATE_UP_CHUNK=32, ZERO_SIDE=True, DIRECT=True, HAS_MAP=False, N_FIRST=False, BLOCK_M=16, TILES=4,
    BLOCK_N=64, EVEN_N=True, STAGES=3, PDL=True, EARLY_WEIGHTS=False, STAGED_SCALES=True, TRACE=False, OWN_ROUTE=False,
    ROUTE_E_P2=128)


# GEMM1 of a bf16 layer with its gated activation on the 16-bit wgmma kernel (`gemm_details._wgmma`).
BF16_WGMMA_CONSTEXPRS = dict(A_ROW_DIV=8, GATED=True, ACT=1, HAS_BIAS=False, MUL_WEIGHT=False, ZERO_FOREIGN=False,
                             BLOCK_M=128, BLOCK_N=256, GROUP_M=8, STAGES=4, K_TAIL=False)

_BF16_POINTERS = {"a_ptr": "*bf16", "bias_ptr": "*fp32", "c_ptr": "*bf16", "topk_weights_ptr": "*fp32",
                  "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "total_ptr": "*i32", "tile_counter_ptr": "*i32",
                  "alpha": "fp32", "limit": "fp32"}


def _source(fn, source_type, constexprs: dict, pointers: dict[str, str], aligned_ints: bool = True):
    """aligned_ints: integer arguments specialized as multiples of 16 (as Triton does for such values);
    pointers always are."""
    names = list(inspect.signature(fn.fn).parameters)
    sig = {n: "constexpr" if n in constexprs else pointers.get(n, "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or (aligned_ints and sig[n] == "i32")}
    return source_type(fn, sig, constexprs={(names.index(n),): v for n, v in constexprs.items()}, attrs=attrs)


def compile_kernel(fn, constexprs: dict, pointers: dict[str, str], *, num_warps: int = 4, num_stages: int = 3,
                   arch: int = 90):
    """The compiled Triton kernel `fn` (`.asm["ptx"]`, `.asm["cubin"]`): arguments named in `constexprs`
    fixed, those in `pointers` of the given types ("*i32", ...), the others i32 scalars."""
    return triton.compile(_source(fn, ASTSource, constexprs, pointers), target=GPUTarget("cuda", arch, 64),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def compile_quant_gemm(constexprs: dict, pointers: dict[str, str] | None = None, *, num_warps: int = 4,
                       num_stages: int = 3, arch: int = 90):
    """`compile_kernel` of the quantized GEMM for `constexprs` over DEFAULT_CONSTEXPRS (strides named
    there are specialized to that value) and pointer types over `_POINTERS`."""
    return compile_kernel(_moe_wgemm_kernel, {**DEFAULT_CONSTEXPRS, **constexprs},
                          {**_POINTERS, **(pointers or {})}, num_warps=num_warps, num_stages=num_stages, arch=arch)


def compile_wgmma_gemm(constexprs: dict, pointers: dict[str, str] | None = None):
    """`compile_quant_gemm` for the Gluon wgmma kernel (sm_90), over WGMMA_CONSTEXPRS, launched as
    `quant_gemm` does (4 warps, the register plan of its BLOCK_M); the quads words are int16 unless
    `pointers` makes b_ptr "*i32" (int8's byte quads)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from moe_triton.quant_gemm_details._wgmma import moe_w4a16_wgmma_kernel

    consts = {**WGMMA_CONSTEXPRS, **constexprs}
    regs = ws_regs(consts["BLOCK_M"])
    consts.update(PRODUCER_WARPS=regs.producer_warps, CONSUMER_REGS=regs.consumer_regs,
                  PRODUCER_REGS=regs.producer_regs)
    src = _source(moe_w4a16_wgmma_kernel, GluonASTSource, consts,
                  {**_POINTERS, "b_ptr": "*i16", "s_ptr": "*bf16", "c_ptr": "*bf16", **(pointers or {})})
    return triton.compile(src, target=GPUTarget("cuda", 90, 64), options=dict(num_warps=4, maxnreg=regs.maxnreg))


def compile_mma_gemm(constexprs: dict, pointers: dict[str, str] | None = None, *, num_warps: int = 4,
                     maxnreg: int = 0):
    """The Gluon mma.sync GEMM (`quant_gemm_details._mma`) for sm_90, over MMA_CONSTEXPRS (int16 quads
    words, bf16 activations and a bf16 finished output unless `pointers` says otherwise), registers capped
    at maxnreg per thread where given (`GemmConfig.max_registers`)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from moe_triton.quant_gemm_details._mma import moe_mma_gemm_kernel

    src = _source(moe_mma_gemm_kernel, GluonASTSource, {**MMA_CONSTEXPRS, **constexprs},
                  {**_POINTERS, "b_ptr": "*i16", "s_ptr": "*bf16", **(pointers or {})})
    return triton.compile(src, target=GPUTarget("cuda", 90, 64),
                          options=dict(num_warps=num_warps, **({"maxnreg": maxnreg} if maxnreg else {})))


def compile_bf16_wgmma_gemm(constexprs: dict, pointers: dict[str, str] | None = None, aligned_ints: bool = True,
                            persistent: bool = False):
    """The 16-bit Gluon wgmma GEMM (`gemm_details._wgmma`) for sm_90, over BF16_WGMMA_CONSTEXPRS, launched
    as `gemm.grouped_gemm` does (4 warps per partition, `gemm_wgmma.REGS` registers; persistent: its
    persistent kernel with that kernel's register plan); aligned_ints False: sizes and strides that
    are not multiples of 16."""
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    from triton.runtime.jit import mangle_type

    from moe_triton.gemm_details import _wgmma as gemm_wgmma

    consts = {**BF16_WGMMA_CONSTEXPRS, **constexprs}
    if persistent:
        kernel, maxnreg = gemm_wgmma.moe_gemm_wgmma_persistent_kernel, gemm_wgmma.PERSISTENT_MAXNREG
        consts = {"TAIL": 0, **consts, "CONSUMER_REGS": gemm_wgmma.PERSISTENT_REGS, "LOADER_REGS": gemm_wgmma.LOADER_REGS}
    else:
        kernel, maxnreg = gemm_wgmma.moe_gemm_wgmma_kernel, gemm_wgmma.REGS
        consts.update(CONSUMER_REGS=gemm_wgmma.REGS)
    ptrs = {**_BF16_POINTERS, **(pointers or {})}
    # The weights' descriptor as the launcher builds it (`gemm._grouped_gemm_wgmma`), over a host tensor.
    dtype = {"*bf16": torch.bfloat16, "*fp16": torch.float16}[ptrs["a_ptr"]]
    copy_rows = consts["BLOCK_N"] // (4 if consts["GATED"] else 2)
    layout = gl.NVMMASharedLayout.get_default_for([copy_rows, 64], gl.bfloat16 if dtype == torch.bfloat16
                                                  else gl.float16)
    ptrs["w_desc"] = mangle_type(GluonDescriptor.from_tensor(torch.empty(256, 64, dtype=dtype),
                                                             [copy_rows, 64], layout))
    src = _source(kernel, GluonASTSource, consts, ptrs, aligned_ints)
    return triton.compile(src, target=GPUTarget("cuda", 90, 64), options=dict(num_warps=4, maxnreg=maxnreg))


def run_compiler_script(script: str, stdin: str = "") -> str:
    """stdout of `python -c script` in a child process without TRITON_INTERPRET (a process that
    interprets kernels cannot also compile them); RuntimeError with the end of stderr if it fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], input=stdin, capture_output=True, text=True, env=env,
                         timeout=600)
    if run.returncode != 0:
        raise RuntimeError(f"the compile script exited with {run.returncode}:\n{run.stderr[-3000:]}")
    return run.stdout
