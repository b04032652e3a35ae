"""`select(config, quant, device, prefer) -> Plan`: the backend choice, with every candidate's reason.

The plan is made before any weight is allocated and fixes the weight layout, so what was selected
and what gets converted can never disagree. A forced backend (`prefer=` or `MOE_BACKEND`) is served
or refused with its reason; it is never silently replaced by another. Backends are tried in the
order of a measured ranking where one covers the device and layer (`moe_core.rankings`), else in
the static order their plugins declare.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import torch

from moe_core.backends import REFERENCE_BACKEND, DeviceInfo, Platform, detect_device
from moe_core.config import MoEConfig
from moe_core.experts import Experts
from moe_core.plugins import ExpertsRef, PluginState, PluginStatus, Registry, registry
from moe_core.quant import MoEQuantConfig, unquantized
from moe_core.rankings import RankingMatch, find_ranking
from moe_core.routing import route_torch

__all__ = ["BackendUnavailableError", "Candidate", "NoBackendError", "Plan", "apply_layer", "router_of", "select"]

ENV_BACKEND = "MOE_BACKEND"
_BUILTIN = (ExpertsRef(REFERENCE_BACKEND, "moe_core.reference:ReferenceExperts"),)
# The distributions that bring kernels for each platform: the remedy printed when none is installed.
INSTALL_HINTS: dict[Platform, str] = {
    Platform.CPU: "moe-cpu",
    Platform.CUDA: "moe-triton moe-cuda",
    Platform.ROCM: "moe-rocm moe-triton",
    Platform.XPU: "moe-xpu[kernels] moe-triton",
}


class NoBackendError(RuntimeError):
    """No installed backend can serve the layer; the message is the candidate table."""


class BackendUnavailableError(RuntimeError):
    """The backend the user asked for cannot serve the layer; the message says why."""


@dataclass(frozen=True)
class Candidate:
    backend: str
    experts: str  # class name, or "-" when the backend is not installed
    source: str  # distribution that provides it
    ok: bool
    reason: str  # why refused ("" when ok)
    chosen: bool = False

    def to_dict(self) -> dict:
        return {"backend": self.backend, "experts": self.experts, "source": self.source, "ok": self.ok,
                "reason": self.reason, "chosen": self.chosen}


@dataclass(frozen=True)
class Plan:
    config: MoEConfig
    quant: MoEQuantConfig
    device: DeviceInfo
    backend: str
    experts_cls: type[Experts]
    candidates: tuple[Candidate, ...]
    forced: bool  # chosen because the user named it
    ranking: RankingMatch | None = None  # the measured order the candidates were tried in, if any

    @property
    def weight_layout(self) -> str:
        return self.experts_cls.weight_processor.layout

    @property
    def router(self) -> Callable:
        return router_of(self.experts_cls)

    def make_experts(self) -> Experts:
        """A fresh experts instance: one per layer, never shared."""
        return self.experts_cls(self.config, self.quant, self.device)

    def table(self) -> str:
        return format_candidates(self.candidates)

    def explain(self) -> str:
        if self.forced:
            how = "forced by the user"
        elif self.ranking is not None and self.backend in self.ranking.order:
            how = "the fastest measured backend that supports the layer"
        else:
            how = "first supported backend in priority order"
        order = f"order:   {self.ranking.describe()}\n" if self.ranking is not None else \
            "order:   static plugin priorities (no measured ranking covers this device and layer)\n"
        return (f"layer:   {self.config.describe()}\nquant:   {self.quant.name} ({self.quant})\n"
                f"device:  {self.device}\nchosen:  {self.backend} / {self.experts_cls.name()} ({how}); "
                f"weight layout {self.weight_layout}\n{order}\n{self.table()}")

    def to_dict(self) -> dict:
        ranking = None if self.ranking is None else {
            "source": self.ranking.ranking.source, "device": self.ranking.ranking.device,
            "measured": self.ranking.ranking.measured, "basis": self.ranking.basis,
            "us": dict(self.ranking.us)}
        return {"backend": self.backend, "experts": self.experts_cls.name(), "forced": self.forced,
                "weight_layout": self.weight_layout, "device": str(self.device), "quant": self.quant.name,
                "config": self.config.describe(), "ranking": ranking,
                "candidates": [c.to_dict() for c in self.candidates]}


@functools.cache
def router_of(experts_cls: type[Experts]) -> Callable:
    """The router a layer of a modular experts class routes with: the one the class names
    (`Experts.router`), else moe_core's `route_torch`."""
    path = experts_cls.router
    if path is None:
        return route_torch
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def apply_layer(experts: Experts, hidden_states: torch.Tensor, router_logits: torch.Tensor,
                correction_bias: torch.Tensor | None) -> torch.Tensor:
    """One layer call as `FusedMoE` makes it: a monolithic class routes itself; a modular one gets
    the choices of its class's router (`router_of`)."""
    if experts.monolithic:
        return experts.apply_monolithic(hidden_states, router_logits, correction_bias)
    cfg = experts.config
    topk_weights, topk_ids = router_of(type(experts))(router_logits, cfg.routing, cfg.top_k, correction_bias)
    return experts.apply(hidden_states, topk_weights, topk_ids)


# Text tables keep lines to about this width: long reasons wrap under their column (to_dict() and the
# CLI's --json keep every reason whole, on one line).
TEXT_WIDTH = 120
_ABSENT = re.compile(r"plugin (\S+) is device_absent: (.*)", re.DOTALL)


def format_candidates(candidates: tuple[Candidate, ...] | list[Candidate]) -> str:
    """The candidate table as text: a row per class of the plugins that can run here; each plugin whose
    device this machine lacks gets one line after them (on a CPU-only machine most rows are those)."""
    rows = [("", "backend", "experts", "from", "verdict")]
    absent: dict[tuple[str, str, str], list[Candidate]] = {}
    for c in candidates:
        match = _ABSENT.fullmatch(c.reason) if not c.ok else None
        if match:
            absent.setdefault((match[1], c.source, match[2]), []).append(c)
        else:
            rows.append(("*" if c.chosen else "", c.backend, c.experts, c.source, c.reason or "ok"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    indent = sum(widths) + 2 * 4
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  "
             + _wrap(r[4], TEXT_WIDTH - indent, indent) for r in rows]
    if absent:
        lines.append("   no device here for these plugins' classes (--json lists each class):")
        for (plugin, source, why), group in absent.items():
            backends = ", ".join(dict.fromkeys(c.backend for c in group))
            n = len(group)
            lines.append("     " + _wrap(f"{backends} ({source}, plugin {plugin}, {n} class{'es' if n > 1 else ''}): "
                                         f"{why}", TEXT_WIDTH - 5, 7))
    return "\n".join(line.rstrip() for line in lines)


def _wrap(text: str, width: int, indent: int) -> str:
    """`text` wrapped to `width` columns (at least 40), continuation lines indented by `indent` spaces."""
    return ("\n" + " " * indent).join(textwrap.wrap(text, max(width, 40), break_on_hyphens=False) or [""])


def _backend_order(device: DeviceInfo, quant: MoEQuantConfig, reg: Registry,
                   measured: RankingMatch | None = None) -> list[str]:
    """Installed backends: those a measured ranking covers first, fastest first; then the rest by the
    rank their plugins declare for this platform and quantization family (larger first, then by
    name); the reference last."""
    plugged = reg.backends() - {REFERENCE_BACKEND}
    static = sorted(plugged, key=lambda b: (-reg.rank(b, device.platform, quant.family), b))
    fastest = [b for b in measured.order if b in plugged] if measured is not None else []
    return [*fastest, *(b for b in static if b not in fastest), REFERENCE_BACKEND]


def _failed_plugin(name: str, reg: Registry) -> PluginStatus | None:
    """The plugin named `name` if it failed before returning a spec (so its backends are unknown)."""
    status = reg.statuses.get(name)
    return status if status is not None and status.spec is None else None


def select(config: MoEConfig, quant: MoEQuantConfig | None = None,
           device: object = None, prefer: str | None = None, *, num_tokens: int | None = None,
           plugins: Registry | None = None) -> Plan:
    """Choose the experts class for a layer. `prefer` (or env MOE_BACKEND) forces a backend.
    `num_tokens`: the token count the layer is mostly called with; where a measured ranking covers
    the device and layer, that count's bucket decides the order (None: every measured count)."""
    if not isinstance(config, MoEConfig):
        raise TypeError(f"select: config must be a MoEConfig, got {type(config).__name__}")
    quant = quant if quant is not None else unquantized()
    if not isinstance(quant, MoEQuantConfig):
        raise TypeError(f"select: quant must be a MoEQuantConfig (see moe_core.quant factories), got {quant!r}")
    dev = detect_device(device)
    reg = plugins if plugins is not None else registry()
    forced = prefer if prefer is not None else (os.environ.get(ENV_BACKEND) or None)
    measured = find_ranking(dev.name, config, quant, num_tokens) if forced is None else None
    order = _backend_order(dev, quant, reg, measured)
    measured_us = dict(measured.us) if measured is not None else {}
    if forced is not None:
        forced = forced.strip().lower()
        if forced not in order:
            src = "prefer" if prefer is not None else ENV_BACKEND
            failed = _failed_plugin(forced, reg)
            if failed is not None:
                raise BackendUnavailableError(f"{src}={forced!r}: plugin {failed.name} ({failed.distribution}) "
                                              f"is {failed.state.value}: {failed.reason}")
            raise BackendUnavailableError(f"{src}={forced!r} names no installed backend; installed: "
                                          f"{', '.join(sorted(order))}")

    refs_by_backend: dict[str, list[tuple[PluginStatus | None, ExpertsRef]]] = {}
    for status, ref in [*((None, r) for r in _BUILTIN), *reg.refs()]:
        refs_by_backend.setdefault(ref.backend, []).append((status, ref))

    # Plugins that failed before naming their backends still get a row saying why.
    candidates: list[Candidate] = [
        Candidate(s.name, "-", s.distribution, False, f"plugin {s.name} is {s.state.value}: {s.reason}")
        for s in reg.statuses.values() if s.spec is None]
    chosen: tuple[str, type[Experts]] | None = None
    for backend in order:
        for status, ref in refs_by_backend[backend]:
            source = status.distribution if status else "moe-core"
            name = ref.path.rpartition(":")[2]
            if status is not None and status.state is not PluginState.READY:
                candidates.append(Candidate(backend, name, source, False,
                                            f"plugin {status.name} is {status.state.value}: {status.reason}"))
                continue
            try:
                cls = reg.resolve(ref)
            except ImportError as exc:
                candidates.append(Candidate(backend, name, source, False, f"import failed: {exc}"))
                continue
            support = cls.supports(config, quant, dev)
            ok, reason = bool(support), support.reason
            if ok and backend == REFERENCE_BACKEND and forced != backend:
                ok, reason = False, "never chosen automatically (prefer='reference' to use it)"
            take = ok and chosen is None and forced in (None, backend)
            if ok and not take:
                reason = f"supported; {forced!r} was forced" if forced not in (None, backend) else \
                    "supported; a preferred candidate was chosen"
            if ok and backend in measured_us:
                reason = f"{reason}; measured {measured.time_text(backend)}" if reason else \
                    f"measured {measured.time_text(backend)}, the fastest that supports the layer"
            candidates.append(Candidate(backend, cls.name(), source, ok, reason, take))
            if take:
                chosen = (backend, cls)

    if chosen is None:
        table = format_candidates(candidates)
        head = f"{config.describe()}, {quant.name}, on {dev}"
        if forced:
            why = dict.fromkeys(c.reason for c in candidates if c.backend == forced)
            raise BackendUnavailableError(f"backend {forced!r} cannot serve {head}: {'; '.join(why)}\n\n{table}")
        hint = ""
        if not any(dev.platform in s.spec.platforms for s in reg.statuses.values() if s.spec is not None):
            hint = f"\n\nno kernels for {dev.platform.value} are installed: pip install {INSTALL_HINTS[dev.platform]}"
        raise NoBackendError(f"no backend can serve {head}\n\n{table}{hint}")
    return Plan(config, quant, dev, chosen[0], chosen[1], tuple(candidates), forced is not None, measured)
