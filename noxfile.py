"""Build and test sessions for every distribution, and the device x package matrix.

CPU sessions (lint, tests, wheels, bench) run anywhere; `device(cuda|rocm|xpu)` sessions need that
hardware and fail, rather than pass vacuously, when it is absent. `nox -l --json` lists them; the
GitHub workflow's device jobs call them by name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv"
nox.options.sessions = ["lint", "tests", "wheels"]

ROOT = Path(__file__).parent
PACKAGES = ("moe-core", "moe-cpu", "moe-triton", "moe-cuda", "moe-rocm", "moe-xpu")
TEST_DIRS = [f"packages/{p}/tests" for p in PACKAGES] + ["integration"]
# Which plugins each device runs, and the distributions that bring them.
DEVICE_PLUGINS = {"cuda": ("triton", "cuda"), "rocm": ("aiter", "triton"), "xpu": ("xpu", "triton")}
# Combinations of built wheels that must install and work on their own.
COMBINATIONS = {
    "core": ("moe-core",),
    "core+cpu": ("moe-core", "moe-cpu"),
    "core+cuda": ("moe-core", "moe-triton", "moe-cuda"),  # moe-cuda runs moe-triton's row kernels
    "core+rocm": ("moe-core", "moe-rocm"),
    "core+xpu": ("moe-core", "moe-xpu"),
    "all": PACKAGES,
}
# The plugins (entry points) each distribution brings.
PLUGINS_OF = {
    "moe-cpu": ("cpu",),
    "moe-triton": ("triton",),
    "moe-cuda": ("cuda", "flashinfer"),
    "moe-rocm": ("aiter",),
    "moe-xpu": ("xpu",),
}
TEST_DEPS = ("pytest>=8", "hypothesis>=6.100")
# The lock holds the default registry's torch. Runners of other vendors swap in their vendor's torch
# build and kernels after the sync (written from the vendors' install docs; no such runner has run it).
VENDOR_INSTALLS = {
    "rocm": (("--index-url", "https://download.pytorch.org/whl/rocm6.4", "torch>=2.11"), ("--pre", "amd-aiter")),
    "xpu": (("--index-url", "https://download.pytorch.org/whl/xpu", "torch>=2.14"), ("vllm-xpu-kernels~=0.1.16.2",)),
}
# Device runs spend most of their time compiling Triton kernels, one CPU process per compile (93% of
# a serial H100 run): they spread the tests over up to 8 pytest-xdist workers.
DEVICE_WORKERS = ("-n", str(min(8, os.cpu_count() or 1)))
# The CPU suite takes 10-14 minutes serially on 2 cores; where there are more, pytest-xdist spreads it
# (on 2 cores the workers would only contend with the tests' own torch threads).
CPU_WORKERS = ("-n", "auto") if (os.cpu_count() or 1) > 2 else ()


def _sync(session: nox.Session) -> None:
    """Install the locked workspace (all members, editable) into the session's venv."""
    session.env["UV_PROJECT_ENVIRONMENT"] = session.virtualenv.location
    session.run_install("uv", "sync", "--locked", "--all-packages", external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """Run ruff over the whole repository."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def tests(session: nox.Session) -> None:
    """Run every distribution's tests and the cross-distribution integration tests on CPU."""
    _sync(session)
    # Triton kernels run under its CPU interpreter here; the flag must be set before triton is imported.
    session.run("pytest", "-q", "-p", "no:cacheprovider", *CPU_WORKERS, *TEST_DIRS, *session.posargs,
                env={"TRITON_INTERPRET": "1"})


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every distribution, install each combination from the wheels alone, and test it."""
    dist = ROOT / "dist"
    for old in dist.glob("*"):
        old.unlink()
    session.run("uv", "build", "--all-packages", "--out-dir", str(dist), external=True)
    built = {p: next(dist.glob(f"{p.replace('-', '_')}-*.whl")) for p in PACKAGES}
    for name, members in COMBINATIONS.items():
        venv = ROOT / ".nox" / f"wheels-{name}"
        session.run("uv", "venv", "--quiet", "--clear", str(venv), external=True)
        py = str(venv / "bin" / "python")
        # The project comes from its built wheels only; third-party dependencies from the registry.
        session.run("uv", "pip", "install", "--quiet", "--python", py, *[str(built[m]) for m in members],
                    *TEST_DEPS, external=True)
        plugins = [p for m in members for p in PLUGINS_OF.get(m, ())]
        _check_doctor(session, py, expected=set(plugins))
        for plugin in ["reference", *plugins]:
            session.run(py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "moe_core.testing.pytest_plugin",
                        "--rootdir", str(ROOT / "integration" / "installed"), "-c", os.devnull,
                        str(ROOT / "integration" / "installed"), env={"MOE_CONFORMANCE_PLUGIN": plugin},
                        external=True)


def _check_doctor(session: nox.Session, python: str, expected: set[str]) -> None:
    out = session.run(python, "-m", "moe_core", "doctor", "--json", silent=True, external=True)
    report = json.loads(out)
    states = {p["name"]: p["state"] for p in report["plugins"]}
    if set(states) != expected:
        session.error(f"doctor lists plugins {sorted(states)}, expected {sorted(expected)}")
    broken = {n: s for n, s in states.items() if s not in ("ready", "device_absent")}
    if broken:
        session.error(f"plugins failed in a clean install: {broken}")
    session.log(f"doctor: core {report['core']['version']}, plugins {states}")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmark the CPU backend on the presets and write results under benchmarks/results/."""
    _sync(session)
    session.run("moe", "bench", *(session.posargs or ["--preset", "qwen3-30b-a3b", "--preset", "tiny"]))


@nox.session
@nox.parametrize("device", list(DEVICE_PLUGINS))
def device(session: nox.Session, device: str) -> None:
    """Run the device-marked tests and the conformance suite on real hardware (self-hosted runners)."""
    _sync(session)
    for args in VENDOR_INSTALLS.get(device, ()):
        session.install(*args)
    session.run("moe", "doctor", "--require", device)
    env = {"MOE_TEST_REQUIRE_DEVICE": device}
    session.run("pytest", "-q", "-p", "no:cacheprovider", *DEVICE_WORKERS, *TEST_DIRS, env=env)
    for plugin in DEVICE_PLUGINS[device]:
        session.run("pytest", "-q", "-p", "no:cacheprovider", "integration/installed",
                    env={**env, "MOE_CONFORMANCE_PLUGIN": plugin})
