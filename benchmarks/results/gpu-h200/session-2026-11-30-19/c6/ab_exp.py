"""The sixth call's variants (ab_layer.py --variant vector=ab_exp:vector_arrival --variant
gemm1-one-row=ab_exp:gemm1_one_row --variant both-one-row=ab_exp:both_one_row), run on wheels of b9db9fb
plus an experiment toggle: quant_gemm.ONE_ROW_SINK passed to the kernel, whose main call gave
`_finish_rows` ONE_ROW = DIRECT and (ONE_ROW_SINK == 2 or (ONE_ROW_SINK == 1 and ACT != 0)). Mode 1 builds
the same SASS as af4ec61 (five builds compared offline)."""
from unittest import mock

from moe_triton import quant_gemm


def vector_arrival(layer, tokens: int):
    return mock.patch.object(quant_gemm, "ONE_ROW_SINK", 0)


def gemm1_one_row(layer, tokens: int):
    return mock.patch.object(quant_gemm, "ONE_ROW_SINK", 1)


def both_one_row(layer, tokens: int):
    return mock.patch.object(quant_gemm, "ONE_ROW_SINK", 2)
