"""What the `moe bench` tests share (their fixtures are in conftest.py)."""

from __future__ import annotations

import argparse

from moe_core import bench


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))
