"""Platforms and devices as the oracle sees them, and the device helpers every module shares.

Backend names and their priorities are not listed here: each hardware distribution declares its
own in its `BackendSpec` (`moe_core.plugins`), so core names no distribution it does not ship.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import torch

__all__ = ["REFERENCE_BACKEND", "DeviceInfo", "Platform", "available_memory_bytes", "detect_device", "synchronize"]


class Platform(enum.StrEnum):
    CPU = "cpu"
    CUDA = "cuda"
    ROCM = "rocm"
    XPU = "xpu"


# The fp32 reference experts that core ships: always a candidate, never chosen automatically.
REFERENCE_BACKEND = "reference"


@dataclass(frozen=True)
class DeviceInfo:
    """The device a layer runs on, as the oracle sees it."""

    platform: Platform
    index: int | None = None
    name: str = ""
    capability: tuple[int, int] | None = None  # CUDA compute capability, e.g. (9, 0); ROCm gfx major/minor

    @property
    def torch_device(self) -> torch.device:
        kind = "cuda" if self.platform is Platform.ROCM else self.platform.value
        return torch.device(kind, self.index) if self.index is not None else torch.device(kind)

    def __str__(self) -> str:
        s = self.platform.value
        if self.name:
            s += f" ({self.name}"
            s += f", sm{self.capability[0]}{self.capability[1]})" if self.capability else ")"
        return s


def detect_device(device: torch.device | str | DeviceInfo | None = None) -> DeviceInfo:
    """Describe `device`; None means the current accelerator if torch sees one, else the CPU."""
    if isinstance(device, DeviceInfo):
        return device
    if device is None:
        if torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        elif hasattr(torch, "xpu") and torch.xpu.is_available():
            device = torch.device("xpu", torch.xpu.current_device())
        else:
            device = torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not supported: expected cpu, cuda, cuda:N (NVIDIA or ROCm), "
                         "xpu or xpu:N") from None
    if device.type == "cpu":
        return DeviceInfo(Platform.CPU, name=_cpu_name())
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device} was requested but torch sees no CUDA/ROCm device")
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        platform = Platform.ROCM if torch.version.hip else Platform.CUDA
        return DeviceInfo(platform, index, props.name, (props.major, props.minor))
    if device.type == "xpu":
        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            raise ValueError(f"device {device} was requested but torch sees no XPU device")
        index = device.index if device.index is not None else torch.xpu.current_device()
        return DeviceInfo(Platform.XPU, index, torch.xpu.get_device_name(index))
    raise ValueError(f"device {str(device)!r} is not supported: expected cpu, cuda, cuda:N (NVIDIA or ROCm), "
                     "xpu or xpu:N")


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def available_memory_bytes(device: torch.device) -> int:
    """Memory that can still be allocated on `device`: the accelerator's free memory, or the host's
    MemAvailable on the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "xpu":
        return torch.xpu.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"
