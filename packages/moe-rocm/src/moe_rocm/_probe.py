"""Cheap platform probe for the plugin table: a ROCm build of torch that sees an AMD GPU.

Whether AMD's AITER is installed is the experts class's business (`Capability.requires` and
`moe_rocm.aiter_api.aiter_installation`), so the plugin table states the device and the candidate
table states the missing package.
"""

from __future__ import annotations

import torch

from moe_core.experts import Support


def probe() -> Support:
    if not torch.version.hip:
        return Support.no(f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None)")
    if not torch.cuda.is_available():
        return Support.no("torch sees no ROCm GPU")
    return Support.yes()
