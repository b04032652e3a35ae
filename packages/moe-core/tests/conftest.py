"""Fixtures of moe-core's tests."""

from __future__ import annotations

import pytest
import torch

from moe_core import bench
from moe_core.bench import cli as bench_cli


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """A bench run pins torch's thread count; later tests get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fast(monkeypatch):
    """Plenty of memory, ceilings without the 256 MiB copy, and the quick ceilings the same throughout."""
    monkeypatch.setattr(bench_cli, "available_memory_bytes", lambda device: 1 << 40)
    monkeypatch.setattr(bench_cli, "measure_ceilings", lambda device, dtype, host_samples: bench.Ceilings(
        1e10, {"bfloat16": 1e11}, "bfloat16", 1, 1, None, "test"))
    monkeypatch.setattr(bench_cli, "quick_ceilings", lambda device, dtype: bench.QuickCeilings(1e10, 1e11))


@pytest.fixture
def interrupt_at(monkeypatch):
    """interrupt_at(n): the bench's n-th timed point raises KeyboardInterrupt, as Ctrl-C would."""

    def arm(n: int) -> None:
        calls = []
        real = bench_cli._time_interleaved

        def interrupting(*args):
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt
            return real(*args)

        monkeypatch.setattr(bench_cli, "_time_interleaved", interrupting)

    return arm
