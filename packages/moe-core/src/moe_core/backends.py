"""Backend names, the distribution that provides each, and per-platform priorities, as data.

One name space for every quantization family: a backend name is what `MOE_BACKEND` and
`prefer=` take, what the candidate table prints and what an experts class declares. The oracle
walks `PRIORITIES[platform][family]` in order; backends that a plugin brings and this table does
not list are tried after the listed ones, in name order.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from moe_core.quant import QuantFamily

__all__ = ["DISTRIBUTION", "PRIORITIES", "Backend", "DeviceInfo", "Platform", "detect_device"]


class Platform(enum.StrEnum):
    CPU = "cpu"
    CUDA = "cuda"
    ROCM = "rocm"
    XPU = "xpu"


class Backend(enum.StrEnum):
    CPU = "cpu"  # moe-cpu: torch grouped GEMM, packed int4/int8 ATen kernels
    TRITON = "triton"  # moe-triton: portable Triton fused-MoE kernels
    TORCH_GROUPED_MM = "torch_grouped_mm"  # moe-cuda: torch._grouped_mm (sm90+)
    FLASHINFER_CUTLASS = "flashinfer_cutlass"  # moe-cuda: flashinfer cutlass_fused_moe (sm90)
    FLASHINFER_TRTLLM = "flashinfer_trtllm"  # moe-cuda: flashinfer trtllm-gen (sm100 only)
    AITER = "aiter"  # moe-rocm: AMD AITER fused MoE
    XPU = "xpu"  # moe-xpu: vllm-xpu-kernels XpuFusedMoe
    REFERENCE = "reference"  # moe-core: the fp32 reference, never auto-selected, for debugging


# The distribution that ships each backend: the remedy printed when one is missing.
DISTRIBUTION: dict[Backend, str] = {
    Backend.CPU: "moe-cpu",
    Backend.TRITON: "moe-triton",
    Backend.TORCH_GROUPED_MM: "moe-cuda",
    Backend.FLASHINFER_CUTLASS: "moe-cuda",
    Backend.FLASHINFER_TRTLLM: "moe-cuda",
    Backend.AITER: "moe-rocm",
    Backend.XPU: "moe-xpu",
    Backend.REFERENCE: "moe-core",
}

_U, _F8, _W, _MX = QuantFamily.UNQUANTIZED, QuantFamily.FP8, QuantFamily.WNA16, QuantFamily.MXFP4

# Order = preference. Reasons for each order live here, not inside the selector:
# - CUDA: Triton first on Hopper: the measured anchors (anchors-h100.md) put tuned Triton ahead of
#   torch._grouped_mm at M <= 512; FlashInfer trtllm paths run only on sm100 (their records refuse sm90).
# - ROCm: AITER's assembly kernels lead on MI300 where they apply; Triton covers the rest.
PRIORITIES: dict[Platform, dict[QuantFamily, tuple[Backend, ...]]] = {
    Platform.CPU: {f: (Backend.CPU,) for f in QuantFamily},
    Platform.CUDA: {
        _U: (Backend.FLASHINFER_TRTLLM, Backend.TRITON, Backend.TORCH_GROUPED_MM, Backend.FLASHINFER_CUTLASS),
        _F8: (Backend.FLASHINFER_TRTLLM, Backend.TRITON, Backend.FLASHINFER_CUTLASS),
        _W: (Backend.FLASHINFER_TRTLLM, Backend.TRITON),
        _MX: (Backend.FLASHINFER_TRTLLM, Backend.TRITON, Backend.FLASHINFER_CUTLASS),
    },
    Platform.ROCM: {f: (Backend.AITER, Backend.TRITON) for f in QuantFamily},
    Platform.XPU: {f: (Backend.XPU, Backend.TRITON) for f in QuantFamily},
}


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
    device = torch.device(device)
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
    raise ValueError(f"device type {device.type!r} is not supported: expected cpu, cuda (NVIDIA or ROCm) or xpu")


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
