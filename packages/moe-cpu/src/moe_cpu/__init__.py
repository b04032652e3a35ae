"""moe-cpu: CPU experts for moe-core. The classes live in `moe_cpu.experts` and load on first use."""

from moe_cpu.__about__ import __version__

__all__ = ["__version__"]
