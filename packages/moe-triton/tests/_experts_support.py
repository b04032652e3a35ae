"""Tiny layers and tiles the 16-bit tests share."""

import torch

from moe_core.config import MoEConfig
from moe_triton.configs import TileConfig

GEMV1, GEMV2 = TileConfig(8, 32, 1, 4, 1, direct=True), TileConfig(4, 16, 1, 4, 1, direct=True)


def tiny(**kw) -> MoEConfig:
    base = dict(num_experts=8, top_k=2, hidden_size=48, intermediate_size=40, dtype=torch.float32)
    return MoEConfig(**{**base, **kw})


WGMMA_TILE = TileConfig(256, 64, 1, 8, 4, wgmma=True)
