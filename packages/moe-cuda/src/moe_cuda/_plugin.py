"""Entry point of the `moe_core.backends` group. Cheap: names classes by string, loads no library."""

from __future__ import annotations

from moe_core.backends import Platform
from moe_core.plugins import BackendSpec, ExpertsRef, Priority
from moe_core.quant import QuantFamily

TORCH_GROUPED_MM = "torch_grouped_mm"
MARLIN = "marlin"
SGLANG_FP8_BLOCK = "sglang_fp8_block"
FLASHINFER_CUTLASS = "flashinfer_cutlass"
FLASHINFER_TRTLLM = "flashinfer_trtllm"

_EXPERTS = (
    ExpertsRef(TORCH_GROUPED_MM, "moe_cuda.grouped_mm:TorchGroupedMmExperts"),
    ExpertsRef(TORCH_GROUPED_MM, "moe_cuda.grouped_mm:TorchFp8GroupedMmExperts"),
    ExpertsRef(MARLIN, "moe_cuda.marlin:MarlinExperts"),
    ExpertsRef(SGLANG_FP8_BLOCK, "moe_cuda.sglang_fp8:SglangFp8BlockExperts"),
)
_FLASHINFER_EXPERTS = (
    ExpertsRef(FLASHINFER_CUTLASS, "moe_cuda.flashinfer:FlashInferCutlassExperts"),
    ExpertsRef(FLASHINFER_CUTLASS, "moe_cuda.flashinfer:FlashInferCutlassMxfp4Experts"),
    ExpertsRef(FLASHINFER_TRTLLM, "moe_cuda.flashinfer:FlashInferTrtllmBf16Experts"),
)


def backend_spec() -> BackendSpec:
    # Ranks below moe-triton's 100 on CUDA until measured rankings exist: on the H200 the Triton
    # kernels ran bf16 layers 1.5-2x faster than torch._grouped_mm (shared/reference anchors), and
    # Marlin and SGLang's block-fp8 GEMM have not been timed against them here. So these serve what
    # Triton refuses, and `prefer=` reaches them; marlin and sglang_fp8_block rank above the
    # grouped-mm fallback only in the families they are built for.
    return BackendSpec(
        name="cuda",
        api_version=(1, 1),
        platforms=(Platform.CUDA,),
        experts=_EXPERTS,
        probe="moe_cuda._probe:probe",
        priorities=(
            Priority(TORCH_GROUPED_MM, Platform.CUDA, 60),
            Priority(MARLIN, Platform.CUDA, 70,
                     frozenset({QuantFamily.WNA16, QuantFamily.MXFP4, QuantFamily.FP8})),
            Priority(SGLANG_FP8_BLOCK, Platform.CUDA, 70, frozenset({QuantFamily.FP8})),
        ),
    )


def flashinfer_spec() -> BackendSpec:
    """FlashInfer's kernels, a plugin of their own (no prebuilt sm_90 MoE; the TRT-LLM kernels are
    Blackwell-only): no static rank, so the oracle serves them where a measured ranking has them fastest,
    or through `prefer=`; their state in `moe doctor` says whether flashinfer-python is installed."""
    return BackendSpec(name="flashinfer", api_version=(1, 1), platforms=(Platform.CUDA,),
                       experts=_FLASHINFER_EXPERTS, probe="moe_cuda._probe:flashinfer_probe")
