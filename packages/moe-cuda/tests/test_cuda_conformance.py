"""moe-core's conformance suite, run against every moe-cuda experts class (on a CUDA device)."""

from moe_core.testing.conformance import *  # noqa: F403  (the suite's tests)

CONFORMANCE_PLUGIN = "cuda"
