"""moe-cuda: NVIDIA experts for moe-core. Classes live in their modules and load on first use."""

from moe_cuda.__about__ import __version__

__all__ = ["__version__"]
