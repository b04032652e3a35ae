"""pytest plugin: the `device` marker and the conformance-case parametrisation.

`@pytest.mark.device("cuda")` skips a test when torch sees no such device, unless the environment
variable MOE_TEST_REQUIRE_DEVICE names it (device CI runners), which turns the skip into a failure
so a GPU job can never pass by testing nothing.
"""

from __future__ import annotations

import os

import pytest
import torch

from moe_core.testing import conformance

REQUIRE_ENV = "MOE_TEST_REQUIRE_DEVICE"


def available_devices() -> set[str]:
    found = {"cpu"}
    if torch.cuda.is_available():
        found.add("rocm" if torch.version.hip else "cuda")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        found.add("xpu")
    return found


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "device(kind): needs that device kind (cpu, cuda, rocm, xpu)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    have = available_devices()
    required = {d.strip() for d in os.environ.get(REQUIRE_ENV, "").split(",") if d.strip()}
    if required - have:
        raise pytest.UsageError(f"{REQUIRE_ENV} requires {sorted(required - have)} but torch sees only {sorted(have)}")
    for item in items:
        for mark in item.iter_markers("device"):
            if mark.args[0] not in have:
                item.add_marker(pytest.mark.skip(reason=f"needs a {mark.args[0]} device"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_case" in metafunc.fixturenames:
        plugin = getattr(metafunc.module, "CONFORMANCE_PLUGIN", None)
        if plugin is None:
            raise pytest.UsageError(f"{metafunc.module.__name__} uses the conformance suite but sets no "
                                    "CONFORMANCE_PLUGIN = '<plugin name>'")
        cases = conformance.cases(plugin)
        metafunc.parametrize("conformance_case", cases, ids=[c.id for c in cases])
