"""Integer arithmetic of the launchers (grids, block counts) in plain Python.

Triton's `triton.cdiv` and `triton.next_power_of_2` are constexpr functions: called from host code
each costs several microseconds of argument unwrapping, a dozen times per layer call.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1
