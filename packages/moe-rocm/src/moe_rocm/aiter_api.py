"""What this distribution knows of AMD's AITER without importing it: the enums its `fused_moe` takes,
the GPU architectures it serves with their fp8 type, and how to tell AMD's package from PyPI's
unrelated `aiter`.

Importing `aiter` starts its JIT machinery (and raises on machines without ROCm), so nothing here
imports it; `moe_rocm.experts` does, on the first call of the kernel.
"""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from moe_core.experts import Support

__all__ = ["ARCHS", "GFX942", "GFX950", "INSTALL", "ActivationType", "GfxArch", "QuantType", "aiter_installation",
           "arch_of"]

INSTALL = ("AMD's AITER, on a ROCm build of torch: git clone --recursive https://github.com/ROCm/aiter && "
           "cd aiter && python3 setup.py develop (or pip install -e .); PyPI holds only the pre-release "
           "amd-aiter 0.1.7.post2.dev18 (pip install amd-aiter), which compiles its kernels with ROCm's hipcc "
           "on first use. PyPI's 'aiter' is an unrelated project")


class ActivationType(enum.IntEnum):
    """AITER's `ActivationType` (csrc/include/aiter_enum.h): the members this distribution passes."""

    Silu = 0  # silu(gate) * up
    Gelu = 1  # gelu(gate) * up, erf form (AITER's references use torch's default F.gelu)


class QuantType(enum.IntEnum):
    """AITER's `QuantType` (csrc/include/aiter_enum.h): the members this distribution passes."""

    No = 0  # weights and activations in the layer dtype
    per_Token = 2  # weights: one scale per output row; activations: one dynamic scale per row
    per_128x128 = 5  # weights: one scale per 128x128 block; activations: one dynamic scale per row and 128 columns


@dataclass(frozen=True)
class GfxArch:
    """A GPU architecture AITER's fused MoE serves."""

    name: str  # the gfx target, e.g. "gfx942"
    capability: tuple[int, int]  # (major, minor) as torch reports it, which is moe-core's DeviceInfo.capability
    fp8_dtype: torch.dtype  # AITER's fp8 on this chip (`aiter.dtypes.fp8`): weights and activations
    products: str  # for messages

    @property
    def fp8_max(self) -> float:
        """Largest finite fp8 value: AITER's dynamic activation scale is amax / fp8_max."""
        return torch.finfo(self.fp8_dtype).max


GFX942 = GfxArch("gfx942", (9, 4), torch.float8_e4m3fnuz, "MI300X/MI325X")
GFX950 = GfxArch("gfx950", (9, 5), torch.float8_e4m3fn, "MI350X/MI355X")
ARCHS = (GFX942, GFX950)


def arch_of(capability: tuple[int, int] | None) -> GfxArch:
    """The architecture of a ROCm device whose torch capability is `capability`."""
    for arch in ARCHS:
        if arch.capability == capability:
            return arch
    known = ", ".join(f"{a.name} {a.capability}" for a in ARCHS)
    raise ValueError(f"ROCm device capability {capability} is not an architecture AITER's fused MoE serves here "
                     f"(known: {known})")


def aiter_installation() -> Support:
    """Whether the importable `aiter` is AMD's (a package with `fused_moe.py`), found without importing it."""
    spec = importlib.util.find_spec("aiter")
    if spec is None:
        return Support.no(f"needs the Python package 'aiter', which is not installed: {INSTALL}")
    locations = spec.submodule_search_locations or ()
    if not any((Path(location) / "fused_moe.py").is_file() for location in locations):
        where = spec.origin or ", ".join(locations) or "?"
        return Support.no(f"the installed 'aiter' ({where}) is not AMD's AITER (no aiter/fused_moe.py): {INSTALL}")
    return Support.yes()
