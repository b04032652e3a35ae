"""The `device(kind)` marker declared in the root pyproject: a test needing a device absent here is
skipped, with the reason, unless MOE_TEST_REQUIRE_DEVICE (comma-separated kinds) names that kind, in
which case it fails: a CI runner that should have the device must not pass by skipping."""

from __future__ import annotations

import os

import pytest
import torch


def _available(kind: str) -> bool:
    if kind == "cuda":
        return torch.cuda.is_available() and torch.version.hip is None
    if kind == "rocm":
        return torch.cuda.is_available() and torch.version.hip is not None
    if kind == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    raise ValueError(f"device marker: unknown kind {kind!r}; expected cuda, rocm or xpu")


def pytest_runtest_setup(item: pytest.Item) -> None:
    required = {k.strip() for k in os.environ.get("MOE_TEST_REQUIRE_DEVICE", "").split(",") if k.strip()}
    for marker in item.iter_markers("device"):
        kind = marker.args[0]
        if _available(kind):
            continue
        if kind in required:
            pytest.fail(f"MOE_TEST_REQUIRE_DEVICE names {kind!r} but torch sees no {kind} device")
        pytest.skip(f"needs a {kind} device")
