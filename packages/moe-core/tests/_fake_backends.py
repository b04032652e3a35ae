"""Fake plugins and experts classes for oracle and discovery tests (no hardware needed)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_core.backends import Platform
from moe_core.config import ActivationKind
from moe_core.experts import UNQUANTIZED, Capability, SchemeSupport
from moe_core.plugins import BackendSpec, ExpertsRef
from moe_core.quant import Granularity, QuantDType
from moe_core.reference import ReferenceExperts
from moe_core.routing import route_torch
from moe_core.weights.processor import PackedWeights


class _Canonical:
    layout = "fake.canonical"

    def __call__(self, weights, config, device):
        return PackedWeights(self.layout, {"canonical": weights.to(device)})


class FakeCpuExperts(ReferenceExperts):
    """The reference math under a CPU backend name, unquantized SiLU only."""

    backend = "cpu"
    weight_processor = _Canonical()
    capability = Capability(platforms=frozenset({Platform.CPU}), schemes=(UNQUANTIZED,),
                            activations=frozenset({ActivationKind.SILU}))


def inverted_router(router_logits, routing, top_k, correction_bias=None):
    """A router that disagrees with route_torch: it picks the lowest scores."""
    return route_torch(-router_logits, routing, top_k, correction_bias)


class FakeCpuInvertedRouterExperts(FakeCpuExperts):
    """FakeCpuExperts naming a router of its own, which a conformance run must expose."""

    router = "_fake_backends:inverted_router"


class FakeCpuInt4Experts(ReferenceExperts):
    backend = "cpu"
    weight_processor = _Canonical()
    capability = Capability(platforms=frozenset({Platform.CPU}),
                            schemes=(SchemeSupport(QuantDType.INT4, frozenset({Granularity.GROUP}),
                                                   group_sizes=frozenset({128})),),
                            activations=frozenset(ActivationKind))


class FakeGpuExperts(ReferenceExperts):
    backend = "triton"
    weight_processor = _Canonical()
    capability = Capability(platforms=frozenset({Platform.CUDA}), schemes=(UNQUANTIZED,),
                            activations=frozenset(ActivationKind), min_capability=(9, 0))


class NotExperts:
    pass


def cpu_spec() -> BackendSpec:
    return BackendSpec("cpu", (1, 0), (Platform.CPU,), (
        ExpertsRef("cpu", "_fake_backends:FakeCpuExperts"), ExpertsRef("cpu", "_fake_backends:FakeCpuInt4Experts")))


def gpu_spec() -> BackendSpec:
    return BackendSpec("triton", (1, 0), (Platform.CUDA,), (ExpertsRef("triton", "_fake_backends:FakeGpuExperts"),),
                       probe="_fake_backends:no_gpu")


def no_gpu():
    from moe_core.experts import Support

    return Support.no("no CUDA device visible to torch")


def future_api_spec() -> BackendSpec:
    return BackendSpec("future", (1, 99), (Platform.CPU,), ())


def old_major_spec() -> BackendSpec:
    return BackendSpec("oldmajor", (0, 3), (Platform.CPU,), ())


def wrong_name_spec() -> BackendSpec:
    return BackendSpec("not-its-name", (1, 0), (Platform.CPU,), ())


def returns_garbage():
    return {"name": "garbage"}


def raises_in_factory():
    raise RuntimeError("driver library libfoo.so.1 not found")


def bad_class_spec() -> BackendSpec:
    return BackendSpec("badclass", (1, 0), (Platform.CPU,), (ExpertsRef("badclass", "_fake_backends:NotExperts"),
                                                             ExpertsRef("badclass", "_fake_backends:Missing")))


@dataclass
class FakeDist:
    name: str
    version: str = "0.1.0"
    requires: tuple[str, ...] = ()

    @property
    def metadata(self):
        return {"Name": self.name}


@dataclass
class FakeEntryPoint:
    name: str
    target: object  # the object `load()` returns, or an exception to raise
    dist: FakeDist | None = None

    def load(self):
        if isinstance(self.target, BaseException):
            raise self.target
        return self.target


def entry_points(*eps: FakeEntryPoint):
    return lambda: list(eps)




class FakeCpuRefusesAllExperts(ReferenceExperts):
    """Claims the CPU but only float64 layers, which no conformance scenario uses."""

    backend = "refuser"
    weight_processor = _Canonical()
    capability = Capability(platforms=frozenset({Platform.CPU}), schemes=(UNQUANTIZED,),
                            activations=frozenset(ActivationKind), dtypes=frozenset({torch.float64}))


def refuser_spec() -> BackendSpec:
    return BackendSpec("refuser", (1, 1), (Platform.CPU,), (ExpertsRef("refuser", "_fake_backends:FakeCpuRefusesAllExperts"),))
