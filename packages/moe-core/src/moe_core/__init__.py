"""moe-core: fused Mixture-of-Experts contracts, the explainable backend oracle and the fp32 reference.

Importing this package discovers nothing and touches no device; plugins are discovered on the
first `select()` / `FusedMoE(...)` / `moe doctor`.
"""

from moe_core.__about__ import PLUGIN_API, __version__
from moe_core.backends import DeviceInfo, Platform, detect_device
from moe_core.config import (
    Activation,
    ActivationKind,
    MoEConfig,
    ParallelConfig,
    Routing,
    RoutingMethod,
    Scoring,
)
from moe_core.experts import Capability, Experts, SchemeSupport, Support
from moe_core.layer import FusedMoE
from moe_core.oracle import BackendUnavailableError, Candidate, NoBackendError, Plan, select
from moe_core.quant import (
    Granularity,
    MoEQuantConfig,
    QuantDType,
    QuantFamily,
    QuantKey,
    ScaleSpec,
    ZeroPoint,
    fp8_w8a8,
    int4_w4a16,
    int8_w8a16,
    mxfp4_w4a16,
    unquantized,
)
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights import ExpertWeights, PackedWeights, WeightProcessor

__all__ = [
    "PLUGIN_API",
    "Activation",
    "ActivationKind",
    "BackendUnavailableError",
    "Candidate",
    "Capability",
    "DeviceInfo",
    "ExpertWeights",
    "Experts",
    "FusedMoE",
    "Granularity",
    "MoEConfig",
    "MoEQuantConfig",
    "NoBackendError",
    "PackedWeights",
    "ParallelConfig",
    "Plan",
    "Platform",
    "QuantDType",
    "QuantFamily",
    "QuantKey",
    "Routing",
    "RoutingMethod",
    "ScaleSpec",
    "SchemeSupport",
    "Scoring",
    "Support",
    "WeightProcessor",
    "ZeroPoint",
    "__version__",
    "detect_device",
    "fp8_w8a8",
    "int4_w4a16",
    "int8_w8a16",
    "mxfp4_w4a16",
    "reference_moe",
    "route_torch",
    "select",
    "unquantized",
]
