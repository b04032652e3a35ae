"""Plugin discovery over the `moe_core.backends` entry-point group.

A hardware distribution declares one entry point whose value is a zero-argument callable
returning a `BackendSpec`. The callable must be cheap: no device access, no kernel imports.
Discovery runs once, on first use (never at `import moe_core`), under a lock, and records one
`PluginStatus` per entry point. A failing plugin is recorded quietly (debug log); it becomes an
error only when the user asks for one of its backends (`moe_core.oracle` raises then).

Checks, in order, each before anything of the plugin runs that the next needs:
1. the distribution's declared `moe-core` requirement admits the installed core (metadata only);
2. the entry point imports and returns a valid `BackendSpec` named like the entry point;
3. the spec's plugin API (major, minor) has core's major and a minor not above core's;
4. the spec's probe says its platform is usable here.

A spec also says where its backends rank on each platform (`Priority`: core keeps no table of
vendors) and may contribute `moe` subcommands (`CommandRef`), imported only when run.
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata as md
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from moe_core.__about__ import PLUGIN_API, __version__
from moe_core.backends import Platform
from moe_core.quant import QuantFamily

__all__ = [
    "GROUP",
    "BackendSpec",
    "CommandRef",
    "ExpertsRef",
    "PluginState",
    "PluginStatus",
    "Priority",
    "Registry",
    "registry",
    "reset_registry",
]

GROUP = "moe_core.backends"
log = logging.getLogger("moe_core.plugins")


@dataclass(frozen=True)
class ExpertsRef:
    backend: str  # the backend name the class serves, as its Experts.backend says
    path: str  # "module:Class", imported only when the oracle needs it


@dataclass(frozen=True)
class Priority:
    """Where a backend ranks on a platform. The oracle tries the larger rank first; ties go by
    backend name. Convention: 100 for the platform's native kernels, 50 for portable ones."""

    backend: str  # one of the spec's ExpertsRef backends
    platform: Platform
    rank: int
    families: frozenset[QuantFamily] | None = None  # the quantization families it applies to; None: all


@dataclass(frozen=True)
class CommandRef:
    """A `moe NAME ...` subcommand a plugin contributes."""

    name: str  # the subcommand; unique across installed plugins
    path: str  # "module:function": function(argv: list[str]) -> exit code, imported only when run
    help: str  # one line for `moe --help`


@dataclass(frozen=True)
class BackendSpec:
    name: str  # == the entry point's name
    api_version: tuple[int, int]  # the plugin API this plugin was written against
    platforms: tuple[Platform, ...]  # where its kernels can run
    experts: tuple[ExpertsRef, ...]  # in preference order within each backend
    probe: str | None = None  # "module:function" -> moe_core.experts.Support: is the platform usable here
    priorities: tuple[Priority, ...] = ()  # API 1.1; a backend without one for a platform ranks 0 there
    commands: tuple[CommandRef, ...] = ()  # API 1.1

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"BackendSpec.name={self.name!r} must be a non-empty string")
        v = self.api_version
        if not (isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, int) for x in v)):
            raise ValueError(f"BackendSpec.api_version={v!r} must be a (major, minor) tuple of ints")
        if not all(isinstance(r, ExpertsRef) and ":" in r.path for r in self.experts):
            raise ValueError("BackendSpec.experts must be ExpertsRef(backend, 'module:Class') entries")
        backends = {r.backend for r in self.experts}
        for p in self.priorities:
            if not isinstance(p, Priority) or not isinstance(p.rank, int):
                raise ValueError(f"BackendSpec.priorities entry {p!r} must be a Priority with an int rank")
            if p.backend not in backends:
                raise ValueError(f"BackendSpec.priorities names backend {p.backend!r}, which the spec's experts "
                                 f"do not serve (they serve {sorted(backends)})")
        names = [c.name for c in self.commands]
        if not all(isinstance(c, CommandRef) and c.name and ":" in c.path for c in self.commands):
            raise ValueError("BackendSpec.commands must be CommandRef(name, 'module:function', help) entries")
        if len(set(names)) != len(names):
            raise ValueError(f"BackendSpec.commands repeats a name: {names}")


class PluginState(enum.StrEnum):
    READY = "ready"
    DEVICE_ABSENT = "device_absent"  # installed and compatible; its hardware is not here
    INCOMPATIBLE = "incompatible"  # built for another moe-core (metadata or plugin API)
    IMPORT_ERROR = "import_error"  # its entry point or probe raised
    SPEC_ERROR = "spec_error"  # returned something that is not a valid BackendSpec


@dataclass(frozen=True)
class PluginStatus:
    name: str
    distribution: str
    version: str
    state: PluginState
    reason: str = ""
    spec: BackendSpec | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {"name": self.name, "distribution": self.distribution, "version": self.version,
                "state": self.state.value, "reason": self.reason,
                "backends": sorted({r.backend for r in self.spec.experts}) if self.spec else []}


def _load_object(path: str):
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _core_conflict(dist: md.Distribution | None) -> str | None:
    """The distribution's moe-core requirement, if the installed core does not satisfy it."""
    if dist is None:
        return None
    for text in dist.requires or ():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.replace("_", "-").lower() != "moe-core" or req.marker is not None:
            continue
        if req.specifier and not req.specifier.contains(Version(__version__), prereleases=True):
            return f"requires moe-core{req.specifier}, installed moe-core is {__version__}"
    return None


def _inspect(ep: md.EntryPoint) -> PluginStatus:
    dist = getattr(ep, "dist", None)
    dist_name = dist.metadata["Name"] if dist is not None else "?"
    version = dist.version if dist is not None else "?"

    def status(state: PluginState, reason: str = "", spec: BackendSpec | None = None) -> PluginStatus:
        return PluginStatus(ep.name, dist_name, version, state, reason, spec)

    conflict = _core_conflict(dist)
    if conflict:
        return status(PluginState.INCOMPATIBLE, conflict)
    try:
        factory = ep.load()
        spec = factory() if callable(factory) and not isinstance(factory, BackendSpec) else factory
    except Exception as exc:  # a broken plugin must never break core
        return status(PluginState.IMPORT_ERROR, f"{type(exc).__name__}: {exc}")
    if not isinstance(spec, BackendSpec):
        return status(PluginState.SPEC_ERROR, f"entry point returned {type(spec).__name__}, expected BackendSpec")
    if spec.name != ep.name:
        return status(PluginState.SPEC_ERROR, f"spec is named {spec.name!r} but its entry point {ep.name!r}")
    major, minor = spec.api_version
    if major != PLUGIN_API[0] or minor > PLUGIN_API[1]:
        return status(PluginState.INCOMPATIBLE,
                      f"written for plugin API {major}.{minor}; this moe-core {__version__} provides "
                      f"{PLUGIN_API[0]}.{PLUGIN_API[1]}", spec)
    if spec.probe is not None:
        try:
            support = _load_object(spec.probe)()
        except Exception as exc:
            return status(PluginState.IMPORT_ERROR, f"probe {spec.probe} raised {type(exc).__name__}: {exc}", spec)
        if not support:
            return status(PluginState.DEVICE_ABSENT, support.reason, spec)
    return status(PluginState.READY, "", spec)


class Registry:
    """The discovered plugins and lazy access to their experts classes."""

    def __init__(self, statuses: Iterable[PluginStatus]) -> None:
        self.statuses: dict[str, PluginStatus] = {}
        for s in statuses:
            if s.name in self.statuses:
                prev = self.statuses[s.name]
                s = PluginStatus(s.name, f"{prev.distribution}, {s.distribution}", s.version,
                                 PluginState.SPEC_ERROR, "two distributions register this plugin name")
            self.statuses[s.name] = s
        self._classes: dict[str, type | Exception] = {}
        self._lock = threading.Lock()

    def refs(self) -> list[tuple[PluginStatus, ExpertsRef]]:
        """Every experts reference of every plugin that produced a spec, ready or not."""
        return [(s, r) for s in self.statuses.values() if s.spec is not None for r in s.spec.experts]

    def backends(self) -> set[str]:
        return {r.backend for _, r in self.refs()}

    def distribution_versions(self) -> dict[str, str]:
        """moe-core's version and each plugin distribution's, as discovery found them."""
        versions = {"moe-core": __version__}
        for s in self.statuses.values():
            versions.setdefault(s.distribution, s.version)
        return versions

    def rank(self, backend: str, platform: Platform, family: QuantFamily) -> int:
        """The highest rank any spec gives `backend` on `platform` for `family` (0 if none does)."""
        ranks = [p.rank for s in self.statuses.values() if s.spec is not None for p in s.spec.priorities
                 if p.backend == backend and p.platform is platform and (p.families is None or family in p.families)]
        return max(ranks, default=0)

    def commands(self) -> dict[str, tuple[PluginStatus, CommandRef]]:
        """Subcommands of every plugin that produced a spec. A name two plugins claim raises ValueError."""
        found: dict[str, tuple[PluginStatus, CommandRef]] = {}
        for s in self.statuses.values():
            for c in s.spec.commands if s.spec is not None else ():
                if c.name in found:
                    raise ValueError(f"plugins {found[c.name][0].name} and {s.name} both contribute "
                                     f"`moe {c.name}`: uninstall one of {found[c.name][0].distribution}, "
                                     f"{s.distribution}")
                found[c.name] = (s, c)
        return found

    def load_command(self, ref: CommandRef) -> Callable[[list[str]], int]:
        return _load_object(ref.path)

    def resolve(self, ref: ExpertsRef) -> type:
        """Import an experts class once; raises ImportError describing the failure."""
        from moe_core.experts import Experts

        with self._lock:
            if ref.path not in self._classes:
                try:
                    cls = _load_object(ref.path)
                    if not (isinstance(cls, type) and issubclass(cls, Experts)):
                        raise TypeError(f"{ref.path} is not an Experts subclass")
                    self._classes[ref.path] = cls
                except Exception as exc:
                    self._classes[ref.path] = exc
            got = self._classes[ref.path]
        if isinstance(got, Exception):
            raise ImportError(f"{ref.path}: {type(got).__name__}: {got}") from got
        return got


_registry: Registry | None = None
_registry_lock = threading.Lock()
EntryPointSource = Callable[[], Iterable[md.EntryPoint]]


def _installed_entry_points() -> Iterable[md.EntryPoint]:
    return md.entry_points(group=GROUP)


def registry(source: EntryPointSource | None = None) -> Registry:
    """The process-wide registry, discovered on first call (thread-safe)."""
    global _registry
    with _registry_lock:
        if _registry is None or source is not None:
            statuses = [_inspect(ep) for ep in (source or _installed_entry_points)()]
            for s in statuses:
                log.debug("plugin %s (%s %s): %s %s", s.name, s.distribution, s.version, s.state.value, s.reason)
            _registry = Registry(statuses)
        return _registry


def reset_registry() -> None:
    """Forget the discovered plugins (tests; after installing a plugin at run time)."""
    global _registry
    with _registry_lock:
        _registry = None
