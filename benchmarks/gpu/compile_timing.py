"""pytest plugin: how much of each test's time is Triton compiling kernels.

Load with `-p compile_timing` (benchmarks/gpu on PYTHONPATH). At the end of the session it prints
the total compile time and count, and the tests that spent the most time compiling, beside their
whole time. A JIT kernel binds `triton.compiler.compile` on its first launch, so patching the
module attribute at plugin load covers every kernel, Gluon ones included.
"""

import time
from collections import defaultdict

import pytest
import triton.compiler

_compile = triton.compiler.compile
_compile_s: dict[str, float] = defaultdict(float)
_compiles: dict[str, int] = defaultdict(int)
_test_s: dict[str, float] = {}
_current = "(outside tests)"


def _timed_compile(*args, **kwargs):
    start = time.perf_counter()
    try:
        return _compile(*args, **kwargs)
    finally:
        _compile_s[_current] += time.perf_counter() - start
        _compiles[_current] += 1


triton.compiler.compile = _timed_compile


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current
    _current = item.nodeid
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        _test_s[item.nodeid] = time.perf_counter() - start
        _current = "(outside tests)"


def pytest_terminal_summary(terminalreporter):
    total_test = sum(_test_s.values())
    total_compile = sum(_compile_s.values())
    write = terminalreporter.write_line
    write(f"triton compile: {total_compile:.1f} s in {sum(_compiles.values())} compiles, "
          f"of {total_test:.1f} s in {len(_test_s)} tests")
    for nodeid, seconds in sorted(_compile_s.items(), key=lambda kv: -kv[1])[:25]:
        write(f"  {seconds:6.1f} s compiling ({_compiles[nodeid]:3d}) of {_test_s.get(nodeid, 0.0):6.1f} s  {nodeid}")
    write("most time besides compiling:")
    rest = {nodeid: seconds - _compile_s.get(nodeid, 0.0) for nodeid, seconds in _test_s.items()}
    for nodeid, seconds in sorted(rest.items(), key=lambda kv: -kv[1])[:15]:
        write(f"  {seconds:6.1f} s  {nodeid}")
