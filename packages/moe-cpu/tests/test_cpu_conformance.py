"""moe-core's conformance suite, run against every moe-cpu experts class."""

from moe_core.testing.conformance import *  # noqa: F403  (the suite's tests)

CONFORMANCE_PLUGIN = "cpu"
