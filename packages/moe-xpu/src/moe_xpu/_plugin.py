"""Entry point of the `moe_core.backends` group. Cheap: names classes by string, imports no kernel."""

from __future__ import annotations

from moe_core.backends import Platform
from moe_core.plugins import BackendSpec, ExpertsRef, Priority

_XPU = "xpu"
_CLASSES = ("XpuExperts", "XpuInt4Experts", "XpuFp8Experts", "XpuMxfp4Experts")


def backend_spec() -> BackendSpec:
    # 100: the vendor kernel goes ahead of moe-triton's portable kernels (50 on XPU), which stay candidates.
    return BackendSpec(name=_XPU, api_version=(1, 1), platforms=(Platform.XPU,),
                       experts=tuple(ExpertsRef(_XPU, f"moe_xpu.experts:{c}") for c in _CLASSES),
                       probe="moe_xpu._probe:probe",
                       priorities=(Priority(_XPU, Platform.XPU, 100),))
