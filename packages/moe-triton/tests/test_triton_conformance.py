"""moe-core's conformance suite, run against every moe-triton experts class on the GPUs present.

On a machine without a GPU the plugin is `device_absent` and no case is generated; the GPU runner
(benchmarks/gpu/run.sh) and the `device` nox sessions run it for real.
"""

from moe_core.testing.conformance import *  # noqa: F403  (the suite's tests)

CONFORMANCE_PLUGIN = "triton"
