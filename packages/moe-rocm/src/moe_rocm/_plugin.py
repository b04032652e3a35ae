"""Entry point of the `moe_core.backends` group. Cheap: names the class by string, imports no kernel."""

from __future__ import annotations

from moe_core.backends import Platform
from moe_core.plugins import BackendSpec, ExpertsRef, Priority

_AITER = "aiter"


def backend_spec() -> BackendSpec:
    # AITER is ROCm's native MoE kernel: it goes ahead of moe-triton's portable kernels (50 on ROCm),
    # which stay candidates for whatever AITER refuses.
    return BackendSpec(name=_AITER, api_version=(1, 1), platforms=(Platform.ROCM,),
                       experts=(ExpertsRef(_AITER, "moe_rocm.experts:AiterExperts"),),
                       probe="moe_rocm._probe:probe",
                       priorities=(Priority(_AITER, Platform.ROCM, 100),))
