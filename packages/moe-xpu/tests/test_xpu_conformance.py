"""moe-core's conformance suite, run against every moe-xpu experts class (cases exist only on an XPU)."""

from moe_core.testing.conformance import *  # noqa: F403  (the suite's tests)

CONFORMANCE_PLUGIN = "xpu"
