"""moe_triton._common.trace: the recording's buffers, and the traced kernels as Triton builds them for sm_90
(the interpreter cannot run the timer's inline PTX; benchmarks/gpu/trace_decode.py runs them on the GPU)."""

from __future__ import annotations

import pytest
import torch

from moe_triton._common import trace
from moe_triton._common.offline_compile import run_compiler_script


def test_buffers_exist_only_while_recording_and_are_handed_out_again_in_order():
    cpu = torch.device("cpu")
    assert trace.buffer("route", 3, cpu) is None
    with trace.recording() as first:
        a = trace.buffer("route", 3, cpu)
        b = trace.buffer("gemm", 5, cpu)
    assert [n for n, _ in first] == ["route", "gemm"]
    assert a.shape == (3, trace.COLUMNS) and b.shape == (5, trace.COLUMNS) and a.dtype == torch.int64 and not a.any()
    assert trace.buffer("route", 3, cpu) is None
    with trace.recording(reuse=first) as again:
        assert trace.buffer("route", 3, cpu) is a
        assert trace.buffer("gemm", 5, cpu) is b
    assert [t for _, t in again] == [a, b]
    with trace.recording(reuse=first), pytest.raises(RuntimeError, match="gemm x 3 where the recording reused has route x 3"):
        trace.buffer("gemm", 3, cpu)


_COMPILE_TRACED = """
from moe_triton._common.offline_compile import compile_kernel, compile_mma_gemm, compile_quant_gemm
from moe_triton.routing_details._kernel import _route_kernel, route_constexprs
one_token_gemm1 = dict(QUADS=True, BLOCK_K=128, BLOCK_N=64, SPLIT_K=4, DIRECT=True, PDL=True, SINK=2, ACT=1,
                       GATE_UP_CHUNK=32)
for traced in (False, True):
    k = compile_quant_gemm({**one_token_gemm1, "TRACE": traced}, {"b_ptr": "*i16", "trace_ptr": "*i64"})
    print("gemm", traced, k.asm["ptx"].count("%globaltimer"), k.asm["ptx"].count("%smid"))
    consts = route_constexprs(128, 8, softmax=True, has_bias=False, groups=1, topk_groups=1, renormalize=True,
                              scaling=1.0)
    r = compile_kernel(_route_kernel, {**consts, "BLOCK_M": 1, "ZERO_BLOCK": 1024, "QUANT_BLOCK": 0, "INTERPRET": False,
                                       "LAUNCH_DEPENDENTS": True, "TRACE": traced},
                       {"logits_ptr": "*fp32", "bias_ptr": "*fp32", "weights_ptr": "*fp32", "ids_ptr": "*i32",
                        "zero_ptr": "*i32", "x_ptr": "*bf16", "xq_ptr": "*fp8e4nv", "xs_ptr": "*fp32",
                        "trace_ptr": "*i64", "renormalize_eps": "fp32", "scaling": "fp32"}, num_warps=1)
    print("route", traced, r.asm["ptx"].count("%globaltimer"), r.asm["ptx"].count("%smid"))
    m = compile_mma_gemm({"TRACE": traced}, {"trace_ptr": "*i64"})
    print("mma", traced, m.asm["ptx"].count("%globaltimer"), m.asm["ptx"].count("%smid"))
"""


def test_traced_kernels_read_the_timer_four_times_in_a_gemm_and_twice_in_the_router_and_never_untraced():
    """A traced GEMM program (the tl.dot kernel and the mma one) reads the global timer at its start,
    after its wait, after its K loop and at its end, the router's at its start and end, each its SM id
    once; untraced builds hold neither instruction."""
    lines = run_compiler_script(_COMPILE_TRACED).split("\n")
    assert lines[:6] == ["gemm False 0 0", "route False 0 0", "mma False 0 0",
                         "gemm True 4 1", "route True 2 1", "mma True 4 1"], lines
