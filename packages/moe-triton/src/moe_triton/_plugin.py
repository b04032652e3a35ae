"""The `moe_core.backends` entry point: what this distribution offers, as lazy import strings."""

from __future__ import annotations

from moe_core.backends import Backend, Platform
from moe_core.plugins import BackendSpec, ExpertsRef

_TRITON = Backend.TRITON.value


def backend_spec() -> BackendSpec:
    return BackendSpec(
        name="triton",
        api_version=(1, 0),
        platforms=(Platform.CUDA, Platform.ROCM, Platform.XPU),
        experts=(
            ExpertsRef(_TRITON, "moe_triton.experts:TritonExperts"),
            ExpertsRef(_TRITON, "moe_triton.quantized:TritonWna16Experts"),
            ExpertsRef(_TRITON, "moe_triton.quantized:TritonFp8Experts"),
            ExpertsRef(_TRITON, "moe_triton.quantized:TritonMxfp4Experts"),
        ),
        probe="moe_triton._probe:probe",
    )
