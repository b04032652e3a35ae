"""Cheap platform probe for the plugin table: is there a GPU Triton can drive, and is Triton installed."""

from __future__ import annotations

import importlib.util

import torch

from moe_core.experts import Support


def probe() -> Support:
    if importlib.util.find_spec("triton") is None:
        return Support.no("the Python package 'triton' is not installed")
    if torch.cuda.is_available():
        return Support.yes()  # NVIDIA CUDA or AMD ROCm (torch.version.hip)
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return Support.yes()
    return Support.no("torch sees no CUDA, ROCm or XPU device")
