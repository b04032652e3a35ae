"""moe-xpu: Intel GPU experts for moe-core over vllm-xpu-kernels. The classes live in `moe_xpu.experts`."""

from moe_xpu.__about__ import __version__

__all__ = ["__version__"]
