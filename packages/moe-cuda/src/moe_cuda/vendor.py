"""The prebuilt vendor libraries moe-cuda calls, found by path and loaded on first use.

Neither vendor's Python package is imported: vLLM's pins torch and pulls a large tree, and both
import far more than the one library each kernel lives in. A library is found (cheaply, without
loading it) from an environment variable naming the file, else inside an installed wheel of the
pinned version through its metadata; it is loaded with `torch.ops.load_library` when a kernel first
runs, which registers its operators under `torch.ops.<namespace>`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from moe_core.experts import Support

__all__ = ["MARLIN_LIBRARY", "SGLANG_SM90_LIBRARY", "VendorLibrary", "persistent_cuda_cache"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VendorLibrary:
    """One prebuilt shared library and how to find it."""

    what: str  # for messages, e.g. "vLLM 0.26.0's Marlin MoE library"
    env_var: str  # names the library file directly; wins over the installed wheel
    distribution: str  # the wheel that ships it
    version: str  # the only version whose operator signatures this package was written against
    member: str  # the library's path inside the wheel
    namespace: str  # torch.ops namespace its operators register under
    operator: str  # an operator that must exist once loaded
    install: str  # the remedy, one line

    def locate(self) -> Path | None:
        """The library file, or None. Reads only the environment and installed metadata."""
        named = os.environ.get(self.env_var)
        if named:
            return Path(named) if Path(named).is_file() else None
        try:
            dist = importlib.metadata.distribution(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None
        if dist.version != self.version:
            return None
        path = Path(dist.locate_file(self.member))
        return path if path.is_file() else None

    def availability(self) -> Support:
        """Whether the library can be found, with the remedy when it cannot. Loads nothing."""
        named = os.environ.get(self.env_var)
        if named and not Path(named).is_file():
            return Support.no(f"{self.env_var}={named} is not a file; point it at {Path(self.member).name} "
                              f"({self.what})")
        if self.locate() is not None:
            return Support.yes()
        try:
            found = importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            found = None
        have = (f"{self.distribution} {found} is installed, this backend needs {self.version}" if found
                else f"{self.distribution} is not installed")
        return Support.no(f"needs {self.what} ({Path(self.member).name}): {have}; {self.install}, "
                          f"or set {self.env_var} to the file")

    def load(self) -> None:
        """Load once per process; raise RuntimeError with the remedy when the library is missing or broken."""
        _load(self)


@functools.cache
def _load(library: VendorLibrary) -> None:
    path = library.locate()
    if path is None:
        raise RuntimeError(library.availability().reason)
    try:
        torch.ops.load_library(str(path))
    except OSError as exc:
        raise RuntimeError(f"{library.what} at {path} failed to load: {exc}") from exc
    if not hasattr(getattr(torch.ops, library.namespace), library.operator):
        raise RuntimeError(f"{path} loaded but registers no torch.ops.{library.namespace}.{library.operator}; "
                           f"it is not {library.what}")


MARLIN_LIBRARY = VendorLibrary(
    what="vLLM 0.26.0's Marlin MoE library",
    env_var="MOE_CUDA_MARLIN_LIB",
    distribution="vllm",
    version="0.26.0",
    member="vllm/_moe_C_stable_libtorch.abi3.so",
    namespace="_moe_C",
    operator="moe_wna16_marlin_gemm",
    install="`pip install vllm==0.26.0 --no-deps` (it needs torch 2.11 and CUDA 13)",
)

SGLANG_SM90_LIBRARY = VendorLibrary(
    what="sglang-kernel 0.4.6's sm90 library",
    env_var="MOE_CUDA_SGLANG_LIB",
    distribution="sglang-kernel",
    version="0.4.6",
    member="sgl_kernel/sm90/common_ops.abi3.so",
    namespace="sgl_kernel",
    operator="fp8_blockwise_scaled_grouped_mm",
    install="`pip install sglang-kernel==0.4.6 --no-deps` (built for torch 2.11 and CUDA 13)",
)


def persistent_cuda_cache() -> str | None:
    """Where the driver keeps JIT-compiled PTX, if it persists across processes (None: it does not).

    The Marlin library carries sm_80 PTX but no sm_90 machine code, so the driver compiles it on a
    Hopper GPU's first call: about a minute, once per machine when CUDA_CACHE_PATH is persistent
    (the driver's default, ~/.nv/ComputeCache, is, unless CUDA_CACHE_DISABLE is set or the cache is
    smaller than the library: raise CUDA_CACHE_MAXSIZE to 4 GiB).
    """
    if os.environ.get("CUDA_CACHE_DISABLE") == "1":
        return None
    return os.environ.get("CUDA_CACHE_PATH") or str(Path.home() / ".nv" / "ComputeCache")


@functools.cache
def announce_first_compile(device_capability: tuple[int, int]) -> None:
    """Say, once per process and GPU kind, that the first Marlin call compiles PTX on Hopper and newer."""
    if device_capability < (9, 0):
        return
    cache = persistent_cuda_cache()
    where = (f"later processes reuse CUDA_CACHE_PATH={cache} (keep CUDA_CACHE_MAXSIZE >= 4294967296 so it fits)"
             if cache else "CUDA_CACHE_DISABLE=1, so every process compiles it again")
    print(f"moe-cuda: compiling Marlin for sm_{device_capability[0]}{device_capability[1]} on first use, about a "
          f"minute; {where}", file=sys.stderr, flush=True)
