"""The `moe_core.backends` entry point: what this distribution offers, as lazy import strings."""

from __future__ import annotations

from moe_core.backends import Platform
from moe_core.plugins import BackendSpec, CommandRef, ExpertsRef, Priority

_TRITON = "triton"


def backend_spec() -> BackendSpec:
    return BackendSpec(
        name="triton",
        api_version=(1, 1),
        platforms=(Platform.CUDA, Platform.ROCM, Platform.XPU),
        experts=(
            ExpertsRef(_TRITON, "moe_triton.experts:TritonExperts"),
            ExpertsRef(_TRITON, "moe_triton.quantized:TritonWna16Experts"),
            ExpertsRef(_TRITON, "moe_triton.quantized:TritonFp8Experts"),
            ExpertsRef(_TRITON, "moe_triton.quantized:TritonMxfp4Experts"),
        ),
        probe="moe_triton._probe:probe",
        # The portable kernels lead on NVIDIA; on AMD and Intel the vendor's own backend (rank 100) goes first.
        priorities=(
            Priority(_TRITON, Platform.CUDA, 100),
            Priority(_TRITON, Platform.ROCM, 50),
            Priority(_TRITON, Platform.XPU, 50),
        ),
        commands=(CommandRef("tune", "moe_triton.tune:main",
                             "search Triton kernel configs on this GPU and write them"),),
    )
