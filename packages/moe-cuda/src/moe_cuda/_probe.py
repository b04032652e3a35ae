"""Cheap platform probe for the plugin table: a CUDA build of torch that sees an NVIDIA GPU.

Whether a vendor library is present is each experts class's business (`supports_extra`), so the
plugin table states the device and the candidate table states the missing library and its remedy.
"""

from __future__ import annotations

import importlib.util

import torch

from moe_core.experts import Support


def probe() -> Support:
    if torch.version.hip:
        return Support.no(f"torch {torch.__version__} is a ROCm build; moe-cuda needs NVIDIA CUDA")
    if not torch.cuda.is_available():
        return Support.no("torch sees no NVIDIA CUDA device")
    return Support.yes()


def flashinfer_probe() -> Support:
    if importlib.util.find_spec("flashinfer") is None:
        # Which FlashInfer classes were validated is each class's `validated_on` (`moe doctor`), not the
        # plugin's: one sentence here would be appended to every class's row, the unvalidated ones too.
        return Support.no("flashinfer-python is not installed (pip install flashinfer-python==0.7.2.post1)")
    return probe()
