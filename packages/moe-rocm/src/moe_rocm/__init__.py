"""moe-rocm: AMD AITER experts for moe-core. The classes live in `moe_rocm.experts` and load on first use."""

from moe_rocm.__about__ import __version__

__all__ = ["__version__"]
