"""The third call's variants (ab_layer.py --variant NAME=ab_exp:FUNCTION), run on wheels of ce13a69
(GemmConfig.pair_tiles, since backed out) with this file beside ab_layer.py."""
import dataclasses
from unittest import mock

from moe_triton.configs import QuantKernelConfig


def _change(gemm1: dict | None, gemm2: dict | None, fewer_stages: bool):
    def patch(layer, tokens: int):
        served = layer.experts._find_config(tokens).config

        def ch(g, c):
            if c is None:
                return g
            c = dict(c)
            if fewer_stages:
                c["num_stages"] = max(2, g.num_stages - 1)
            return dataclasses.replace(g, **c)
        return mock.patch.object(layer.experts, "config_override",
                                 QuantKernelConfig(ch(served.gemm1, gemm1), ch(served.gemm2, gemm2)))
    return patch


paired_s2 = _change(dict(pair_tiles=True), dict(pair_tiles=True), True)
paired_s2_gemm1 = _change(dict(pair_tiles=True), None, True)
stages_less = _change({}, {}, True)
