"""The moe-core conformance suite against one installed plugin, named by MOE_CONFORMANCE_PLUGIN.

The `wheels` and `device` nox sessions run this file once per plugin of an installation
('reference' checks moe-core's built-in reference experts, which every installation has).
"""

import os

from moe_core.testing.conformance import *  # noqa: F403  (the suite's tests)

CONFORMANCE_PLUGIN = os.environ.get("MOE_CONFORMANCE_PLUGIN", "reference")
