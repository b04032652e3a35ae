"""Entry point of the `moe_core.backends` group. Cheap: names classes by string, imports no kernel."""

from __future__ import annotations

from moe_core.backends import Platform
from moe_core.plugins import BackendSpec, ExpertsRef, Priority

_CLASSES = (
    "CpuOneDnnExperts",
    "CpuUnquantizedExperts",
    "CpuInt4Experts",
    "CpuInt8Experts",
    "CpuFp8EmulatedExperts",
    "CpuDequantizedExperts",
)


def backend_spec() -> BackendSpec:
    # The dequantizing class is last: it serves int4/int8 only where the packed classes refuse.
    return BackendSpec(name="cpu", api_version=(1, 1), platforms=(Platform.CPU,),
                       experts=tuple(ExpertsRef("cpu", f"moe_cpu.experts:{c}") for c in _CLASSES),
                       priorities=(Priority("cpu", Platform.CPU, 100),))
