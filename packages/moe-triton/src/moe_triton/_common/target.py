"""What the kernels run on: the CPU interpreter, NVIDIA Hopper (wgmma), and the GPU's SM count."""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """Kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def wgmma_capable(device: torch.device) -> bool:
    """The wgmma kernels' GPUs: NVIDIA Hopper (sm_90; wgmma is not in later architectures), compiled kernels."""
    return (device.type == "cuda" and torch.version.hip is None and not interpreting()
            and torch.cuda.get_device_capability(device)[0] == 9)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 elsewhere (the interpreter's nominal GPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
