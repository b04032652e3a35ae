"""The entry point: a valid, cheap spec whose classes resolve and whose refusals carry remedies."""

from __future__ import annotations

import subprocess
import sys

from moe_core.plugins import BackendSpec
from moe_core.quant import QuantFamily
from moe_cuda._plugin import backend_spec, flashinfer_spec


def test_spec_is_valid_and_ranks_below_triton():
    spec = backend_spec()
    assert isinstance(spec, BackendSpec) and spec.name == "cuda"
    backends = {ref.backend for ref in spec.experts}
    assert backends == {"torch_grouped_mm", "marlin", "sglang_fp8_block"}
    assert all(p.rank < 100 for p in spec.priorities)
    marlin = next(p for p in spec.priorities if p.backend == "marlin")
    assert QuantFamily.UNQUANTIZED not in marlin.families


def test_flashinfer_is_a_plugin_of_its_own_without_ranks():
    spec = flashinfer_spec()
    assert spec.name == "flashinfer" and not spec.priorities
    assert {ref.backend for ref in spec.experts} == {"flashinfer_cutlass", "flashinfer_trtllm"}


def test_every_class_resolves_with_a_layout_and_claims_only_the_hardware_its_device_tests_ran_on():
    import importlib

    for ref in backend_spec().experts + flashinfer_spec().experts:
        module, name = ref.path.split(":")
        cls = getattr(importlib.import_module(module), name)
        assert cls.backend == ref.backend and cls.weight_processor.layout
        # Every class but FlashInfer's MXFP4 (its module never finished building) and TRT-LLM (Blackwell) ones
        # passed test_cuda_device.py on an H100 and on an H200.
        never_ran = name in ("FlashInferCutlassMxfp4Experts", "FlashInferTrtllmBf16Experts")
        expected = () if never_ran else ("cuda: NVIDIA H100 80GB HBM3", "cuda: NVIDIA H200")
        assert cls.capability.validated_on == expected, cls.name()


def test_registration_loads_no_library_and_no_experts_module():
    code = ("import sys, moe_cuda._plugin as p; p.backend_spec(); p.flashinfer_spec(); "
            "print(sorted(m for m in sys.modules if m.startswith('moe_cuda')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['moe_cuda', 'moe_cuda.__about__', 'moe_cuda._plugin']"
