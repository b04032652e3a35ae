"""The activation / fp8 quantization kernel against its torch twin (`act_quant.act_quant_torch`).
"""

import pytest
import torch
from _quant_support import DEV, rel_l2

from moe_core.config import Activation
from moe_triton.act_quant import QMode, act_quant, act_quant_torch
from moe_triton.quant_gemm_details._layouts import GateUpInterleave
from moe_triton.quantized import GATE_UP_CHUNK


@pytest.mark.parametrize(("qmode", "chunk"), [(QMode.NONE, 0), (QMode.NONE, GATE_UP_CHUNK), (QMode.TOKEN, 0),
                                           (QMode.GROUP128, 0), (QMode.TENSOR, 0)])
def test_act_quant_matches_twin(qmode, chunk):
    rows, pexp = 6, torch.tensor([0, 1, 1, -1, 0, 2], dtype=torch.int32, device=DEV)
    h = torch.randn(rows, 512, device=DEV) * 3
    act = Activation.gelu_tanh()
    dt = torch.float16 if qmode is QMode.NONE else torch.float8_e4m3fn
    y, s = act_quant(h, act, qmode, dt, rows, 1, pexp, 3, gate_up_chunk=chunk)
    yt, st = act_quant_torch(h, act, qmode, dt, rows, 1, pexp, 3, gate_up_chunk=chunk)
    if chunk:  # the twin de-interleaves with the processor's row order
        from moe_core.reference import apply_activation

        canonical = torch.empty_like(h)
        canonical[:, GateUpInterleave(chunk).row_order(256, DEV)] = h
        torch.testing.assert_close(yt.float(), apply_activation(canonical, act).half().float())
    keep = pexp >= 0
    if s is not None:
        torch.testing.assert_close(s[keep], st[keep], rtol=1e-6, atol=0)
    assert rel_l2(y.float()[keep], yt.float()[keep]) < 1e-3


@pytest.mark.parametrize("qmode", [QMode.TOKEN, QMode.TENSOR])
def test_rows_padded_to_whole_tiles_end_in_zero_codes(qmode):
    """out_cols past the output width (a GEMM whose K is padded to whole tiles): the extra columns
    hold +0.0 codes over garbage, the scales are those of the unpadded rows."""
    rows, pexp = 4, torch.tensor([0, 1, 1, 0], dtype=torch.int32, device=DEV)
    h = torch.randn(rows, 2 * 320, device=DEV) * 3
    act = Activation.silu()
    plain, plain_s = act_quant(h, act, qmode, torch.float8_e4m3fn, rows, 1, pexp, 2)
    empty = torch.empty

    def garbage(*args, **kwargs):
        t = empty(*args, **kwargs)
        t.view(torch.uint8).fill_(0x7E)
        return t

    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch, "empty", garbage)
        y, s = act_quant(h, act, qmode, torch.float8_e4m3fn, rows, 1, pexp, 2, out_cols=384)
    yt, st = act_quant_torch(h, act, qmode, torch.float8_e4m3fn, rows, 1, pexp, 2, out_cols=384)
    assert y.shape == yt.shape == (rows, 384)
    assert torch.equal(y[:, :320].view(torch.uint8), plain.view(torch.uint8)) and torch.equal(s, plain_s)
    assert not y[:, 320:].view(torch.uint8).any() and not yt[:, 320:].float().any()
    torch.testing.assert_close(s, st, rtol=1e-6, atol=0)
    assert rel_l2(y.float(), yt.float()) < 1e-3
    with pytest.raises(ValueError, match="out_cols=256: at least the output width 320"):
        act_quant(h, act, qmode, torch.float8_e4m3fn, rows, 1, pexp, 2, out_cols=256)


@pytest.mark.parametrize(("width", "activation"), [(384, None), (1536, Activation.silu())])
def test_group128_rows_wider_than_their_groups_match_twin(width, activation):
    """Group-128 rows whose width is no power of two (qwen3's 768, here 384): the kernel's last groups
    are masked off, the stored codes and scales are exactly the twin's."""
    rows = 5
    h = torch.randn(rows, width, device=DEV) * 2
    y, s = act_quant(h, activation, QMode.GROUP128, torch.float8_e4m3fn, rows)
    yt, st = act_quant_torch(h, activation, QMode.GROUP128, torch.float8_e4m3fn, rows)
    assert y.shape == yt.shape and s.shape == st.shape == (rows, y.shape[1] // 128)
    torch.testing.assert_close(s, st, rtol=1e-6, atol=0)
    assert rel_l2(y.float(), yt.float()) < 1e-3


_COMPILE_STORES = """
from moe_triton._common.offline_compile import compile_kernel
from moe_triton.act_quant import _act_quant_kernel
pointers = {"h_ptr": "*bf16", "y_ptr": "*fp8e4nv", "s_ptr": "*fp32", "amax_ptr": "*fp32", "pexp_ptr": "*i32",
            "alpha": "fp32", "limit": "fp32"}
for act, block, warps in ((0, 2048, 4), (1, 1024, 2)):
    ptx = compile_kernel(_act_quant_kernel, dict(ACT=act, QMODE=2, PHASE=0, GATE_UP_CHUNK=0, BLOCK=block,
                                                 INTERPRET=False, PDL=True), pointers, num_warps=warps).asm["ptx"]
    print(ptx.count("st.global.b8"), ptx.count("st.global.v4.b32"))
"""


def test_group128_codes_are_stored_in_vectors_on_hopper():
    """Group-128 fp8 codes built for sm_90 by the installed Triton leave in 16-byte stores, not byte by
    byte (Triton 3.6 stored single bytes 128 apart across a warp when the pointers were a reshaped 1D
    tensor: 41 us for [2048, 2048] on the H200). In a child process: this module interprets kernels."""
    from moe_triton._common.offline_compile import run_compiler_script

    for line in run_compiler_script(_COMPILE_STORES).splitlines():
        byte_stores, vector_stores = map(int, line.split())
        assert byte_stores == 0 and vector_stores >= 1, line
