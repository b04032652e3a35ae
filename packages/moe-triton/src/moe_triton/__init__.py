"""Portable Triton fused-MoE kernels for moe-core.

Importing this package imports no Triton code: kernels load when a module that needs them is
imported (`moe_triton.align`, `moe_triton.routing`, `moe_triton.experts`, ...), so the plugin entry
point and `moe doctor` stay cheap.
"""

from moe_triton.__about__ import __version__

__all__ = ["__version__"]
