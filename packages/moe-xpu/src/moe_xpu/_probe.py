"""Cheap platform probe for the plugin table: does torch see an Intel GPU. Imports no kernel."""

from __future__ import annotations

import torch

from moe_core.experts import Support


def probe() -> Support:
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return Support.yes()
    return Support.no("torch sees no XPU device (needs an Intel GPU and torch's XPU build)")
