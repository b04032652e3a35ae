"""Programmatic dependent launch (PDL) on NVIDIA Hopper and later.

A kernel launched dependent (`launch_pdl=True`) may start while the kernel ahead of it on the stream
still runs; its programs call griddepcontrol.wait (`gdc_wait`) before they read or write anything,
which returns once that kernel has finished and its writes are visible. A kernel that calls
griddepcontrol.launch_dependents (`gdc_launch_dependents`) lets the dependent launch behind it start
early. The small-M chain route -> align -> GEMM1 -> GEMM2 so hides each launch's latency behind the
kernel before it. MOE_TRITON_PDL=0 in the environment of the process turns it off everywhere (to compare).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from types import MappingProxyType

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from moe_triton._common.target import interpreting


@functools.cache
def dependent_launch(device: torch.device) -> bool:
    """Whether kernels on `device` launch dependent and trigger their dependents: compiled kernels on
    NVIDIA sm_90 or later, unless MOE_TRITON_PDL=0 (read at the first launch on the device)."""
    flag = os.environ.get("MOE_TRITON_PDL", "1")
    if flag not in ("0", "1"):
        raise ValueError(f"MOE_TRITON_PDL={flag!r}: accepted values are 0 (plain launches) and 1 (dependent "
                         "launches where the GPU has them, the default)")
    return (flag == "1" and device.type == "cuda" and torch.version.hip is None and not interpreting()
            and torch.cuda.get_device_capability(device)[0] >= 9)


_DEPENDENT = MappingProxyType({"PDL": True, "launch_pdl": True})
_PLAIN = MappingProxyType({"PDL": False})


def dependent_options(device: torch.device) -> Mapping[str, bool]:
    """Launch options of a kernel that starts with `wait_then_release(PDL)`: its PDL constexpr, and
    `launch_pdl` where it launches dependent."""
    return _DEPENDENT if dependent_launch(device) else _PLAIN


@triton.jit
def wait_then_release(PDL: tl.constexpr):
    """First thing in a dependent kernel: wait for the kernel ahead (its writes visible), then let
    the next dependent launch start."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """Lets the next dependent launch start without waiting for the kernel ahead: for a kernel that
    synchronizes with that one by other means (counters it publishes)."""
    if PDL:
        gdc_launch_dependents()
