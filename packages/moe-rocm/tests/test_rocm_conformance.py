"""moe-core's conformance suite, run against AITER's experts (its cases exist only on a ROCm GPU)."""

from moe_core.testing.conformance import *  # noqa: F403  (the suite's tests)

CONFORMANCE_PLUGIN = "aiter"
