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
