"""The fourth call's variant (ab_layer.py --variant vector=ab_exp:vector_arrival --variant one-row), run on
wheels of b9db9fb (the one-row arrival, since backed out) plus an experiment toggle: quant_gemm.ONE_ROW_SINK
(default True) passed to the kernel, whose main call gave `_finish_rows` ONE_ROW = DIRECT and ONE_ROW_SINK."""
from unittest import mock

from moe_triton import quant_gemm


def vector_arrival(layer, tokens: int):
    return mock.patch.object(quant_gemm, "ONE_ROW_SINK", False)
