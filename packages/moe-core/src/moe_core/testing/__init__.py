"""Test support shipped with moe-core: the backend conformance suite and its pytest plugin.

A distribution runs the suite against its own experts with a test module like::

    from moe_core.testing.conformance import *  # noqa: F403  (the suite's tests)
    CONFORMANCE_PLUGIN = "cpu"

and pytest loaded with ``-p moe_core.testing.pytest_plugin`` (the workspace's pytest config does it).
"""
