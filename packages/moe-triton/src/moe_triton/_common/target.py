"""What the kernels run on: the CPU interpreter, NVIDIA Hopper (wgmma, TMA), NVIDIA sm_80+ (mma.sync), and
the GPU's SM count."""

from __future__ import annotations

import functools
import os

import torch

from moe_core.backends import DeviceInfo, Platform, detect_device


@functools.cache
def interpreting() -> bool:
    """Kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1). Read once: Triton itself
    decides at import whether its kernels are interpreted."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def wgmma_capable(device: torch.device) -> bool:
    """The wgmma kernels' GPUs: NVIDIA Hopper (sm_90; wgmma is not in later architectures), compiled kernels."""
    return (device.type == "cuda" and torch.version.hip is None and not interpreting()
            and torch.cuda.get_device_capability(device)[0] == 9)


def tma_capable(device: DeviceInfo) -> bool:
    """Tensor-descriptor (TMA) weight loads: NVIDIA GPUs of sm_90 and later, and the CPU interpreter,
    which emulates them. ROCm and XPU GPUs read the same tiles with plain loads."""
    if device.platform is Platform.CPU:
        return interpreting()
    return device.platform is Platform.CUDA and device.capability is not None and device.capability >= (9, 0)


def mma_capable(device: DeviceInfo) -> bool:
    """The mma.sync kernel's GPUs (`quant_gemm_details._mma`): NVIDIA sm_80 and later, compiled kernels."""
    return (device.platform is Platform.CUDA and device.capability is not None and device.capability >= (8, 0)
            and not interpreting())


@functools.cache
def device_info(device: torch.device) -> DeviceInfo:
    """`detect_device` of a tensor's device, once per device: launchers check it on every call."""
    return detect_device(device)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 elsewhere (the interpreter's nominal GPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
