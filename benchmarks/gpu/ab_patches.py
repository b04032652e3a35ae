"""Launch-shape patches for `ab_layer.py` variants (`--variant NAME=ab_patches:FUNCTION`, with
benchmarks/gpu on PYTHONPATH): each forces the quantized layer's launch shapes at the timed token
count to those it would run, with one field changed.

- `group_m4`, `group_m8`, `group_m16`: both GEMMs with their M blocks launched in groups of that
  many (`GemmConfig.group_m`); for token counts whose launch puts N tiles first.
"""

from __future__ import annotations

import dataclasses
from unittest import mock

from moe_triton.configs import QuantKernelConfig


def _group_m(size: int):
    def patch(layer, tokens: int):
        experts = layer.experts
        served = experts._find_config(tokens).config
        grouped = QuantKernelConfig(dataclasses.replace(served.gemm1, group_m=size),
                                    dataclasses.replace(served.gemm2, group_m=size))
        return mock.patch.object(experts, "config_override", grouped)
    return patch


group_m4 = _group_m(4)
group_m8 = _group_m(8)
group_m16 = _group_m(16)
