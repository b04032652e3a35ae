"""Run the Triton kernels under the CPU interpreter when no GPU is visible; gate device-marked tests.

TRITON_INTERPRET must be set before Triton is first imported, hence at conftest import time.
A test marked `@pytest.mark.device("cuda")` is skipped without that device, unless
MOE_TEST_REQUIRE_DEVICE names it (then the missing device is an error, as on GPU CI runners).
"""

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _available(kind: str) -> bool:
    if kind == "cuda":
        return HAS_GPU and torch.version.hip is None
    if kind == "rocm":
        return HAS_GPU and torch.version.hip is not None
    if kind == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    raise ValueError(f"unknown device kind {kind!r} in @pytest.mark.device: expected cuda, rocm or xpu")


def pytest_runtest_setup(item):
    required = {k.strip() for k in os.environ.get("MOE_TEST_REQUIRE_DEVICE", "").split(",") if k.strip()}
    for mark in item.iter_markers("device"):
        kind = mark.args[0]
        if _available(kind):
            continue
        if kind in required:
            pytest.fail(f"MOE_TEST_REQUIRE_DEVICE names {kind} but torch sees no {kind} device")
        pytest.skip(f"needs a {kind} device")


@pytest.fixture
def device() -> torch.device:
    """Where the tiny tests run: the GPU when there is one, else the CPU interpreter."""
    return torch.device("cuda" if HAS_GPU else "cpu")
