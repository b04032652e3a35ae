"""Run the Triton kernels under the CPU interpreter when no GPU is visible.

TRITON_INTERPRET must be set before Triton is first imported, hence at conftest import time.
The `device` marker is handled by moe_core.testing.pytest_plugin (loaded by the pytest config).
"""

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    """Where the tiny tests run: the GPU when there is one, else the CPU interpreter."""
    return torch.device("cuda" if HAS_GPU else "cpu")
