"""The vendor kernels themselves, on an NVIDIA GPU, against moe-core's fp32 reference at shapes larger
than the conformance suite's. Skipped without a CUDA device; MOE_TEST_REQUIRE_DEVICE=cuda makes a
missing GPU or a missing vendor library a failure."""

from __future__ import annotations

import pytest
import torch
from _cuda_helpers import cuda_device, layer, rel_err, run_against_reference

from moe_core.config import Activation, ParallelConfig
from moe_core.layer import FusedMoE
from moe_core.quant import (
    FP8_BLOCK128_WEIGHT,
    FP8_CHANNEL_WEIGHT,
    MoEQuantConfig,
    QuantDType,
    fp8_w8a8,
    int4_w4a16,
    int8_w8a16,
    mxfp4_w4a16,
    unquantized,
)
from moe_core.weights.canonical import ExpertWeights
from moe_cuda.flashinfer import (
    FlashInferCutlassExperts,
    FlashInferCutlassMxfp4Experts,
    FlashInferTrtllmBf16Experts,
    fold_scales_for_sm90,
    interleave_fp4_for_sm90,
)
from moe_cuda.grouped_mm import TorchFp8GroupedMmExperts, TorchGroupedMmExperts
from moe_cuda.marlin import MarlinExperts, align_blocks, block_size_m, library_align_blocks
from moe_cuda.sglang_fp8 import SglangFp8BlockExperts
from moe_cuda.vendor import MARLIN_LIBRARY, SGLANG_SM90_LIBRARY

pytestmark = pytest.mark.device("cuda")

MS = (1, 37, 700)  # 700 x top-8 > 2048 rows: SGLang's large-M kernel configuration


def _check(cls, config, quant, tol=1e-2):
    device = cuda_device()
    support = cls.supports(config, quant, device)
    assert support, f"{cls.name()} refuses on {device}: {support.reason}"
    for m in MS:
        err, _ = run_against_reference(cls, config, quant, device, m=m, seed=m)
        assert err < tol, f"{cls.name()} M={m}: relative L2 error {err:.2e} >= {tol}"


def test_torch_grouped_mm_bf16():
    _check(TorchGroupedMmExperts, layer(E=32, K=1024, N=512, top_k=8), unquantized())


def test_torch_grouped_mm_bias_and_expert_parallel():
    config = layer(E=32, K=512, N=256, top_k=4, activation=Activation.swiglu_oai(), bias=True,
                   parallel=ParallelConfig(ep_size=4, ep_rank=3))
    _check(TorchGroupedMmExperts, config, unquantized())


def test_torch_scaled_grouped_mm_fp8_channel():
    _check(TorchFp8GroupedMmExperts, layer(E=32, K=1024, N=512, top_k=8), fp8_w8a8("channel"), tol=2e-2)


def test_marlin_library_loads():
    MARLIN_LIBRARY.load()
    assert hasattr(torch.ops._moe_C, "moe_wna16_marlin_gemm")


@pytest.mark.parametrize("quant", [
    int4_w4a16(128), int4_w4a16(32, zero_point=True), int4_w4a16(64, act_order=True), int4_w4a16(-1),
    int8_w8a16(-1), int8_w8a16(128), MoEQuantConfig(FP8_CHANNEL_WEIGHT), MoEQuantConfig(FP8_BLOCK128_WEIGHT),
], ids=lambda q: q.name + ("" if q.weight.dtype.value != "fp8e4m3" else f"_{q.weight.scale.granularity.value}"))
def test_marlin_wna16_and_fp8(quant):
    _check(MarlinExperts, layer(E=32, K=1024, N=512, top_k=8), quant)


def test_marlin_fp16_expert_parallel():
    config = layer(E=32, K=512, N=256, top_k=4, dtype=torch.float16, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    _check(MarlinExperts, config, int4_w4a16(128), tol=5e-3)


def test_marlin_mxfp4_swiglu_oai_bias():
    config = layer(E=32, K=1024, N=512, top_k=4, activation=Activation.swiglu_oai(), bias=True)
    _check(MarlinExperts, config, mxfp4_w4a16())


def test_align_blocks_on_the_gpu_equals_the_cpu():
    ids = torch.randint(0, 64, (300, 8), generator=torch.Generator().manual_seed(0))
    block = block_size_m(300, 8, 64)
    cpu = align_blocks(ids, block, 64, None)
    gpu = align_blocks(ids.cuda(), block, 64, None)
    for name in ("sorted_ids", "expert_ids", "num_tokens_post_padded"):
        assert torch.equal(getattr(cpu, name), getattr(gpu, name).cpu()), name


def test_marlin_act_order_halves_grouped_apart():
    from test_cuda_marlin import halves_grouped_apart

    config, quant = layer(E=32, K=1024, N=512, top_k=4), int4_w4a16(128, act_order=True)
    _, apart = halves_grouped_apart(config, quant)
    err, _ = run_against_reference(MarlinExperts, config, quant, cuda_device(), weights=apart)
    assert err < 1e-2, err


def test_library_align_blocks_holds_the_same_blocks():
    """The library's kernel may order pairs within an expert its own way: same rows in use, each
    local pair once, every block of one expert holding that expert's pairs only."""
    ids = torch.randint(0, 64, (300, 8), generator=torch.Generator().manual_seed(0))
    block = block_size_m(300, 8, 64)
    ours = align_blocks(ids, block, 64, None)
    theirs = library_align_blocks(ids.cuda(), block, 64)
    used = int(theirs.num_tokens_post_padded)
    assert used == int(ours.num_tokens_post_padded)
    rows = theirs.sorted_ids[:used].cpu().long()
    real = rows[rows < ids.numel()]
    assert torch.equal(real.sort().values, torch.arange(ids.numel()))
    experts = theirs.expert_ids[:used // block].cpu().long().repeat_interleave(block)
    is_real = rows < ids.numel()
    assert torch.equal(ids.reshape(-1)[rows[is_real]], experts[is_real])


def _layer_and_inputs(prefer: str, quant: MoEQuantConfig) -> tuple[FusedMoE, torch.Tensor, torch.Tensor]:
    """A small layer on `prefer` with random weights, and one call's inputs (5 tokens)."""
    config = layer(E=32, K=512, N=256, top_k=4)
    moe = FusedMoE(config, quant, "cuda", prefer=prefer)
    moe.load_weights(ExpertWeights.random(config, quant, seed=3, device="cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(5, 512, device="cuda", generator=gen, dtype=torch.bfloat16)
    return moe, x, torch.randn(5, 32, device="cuda", generator=gen)


def _eager_and_graph_replay(prefer: str, quant: MoEQuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's output from a first eager call and from a CUDA graph captured after it."""
    moe, x, logits = _layer_and_inputs(prefer, quant)
    eager = moe(x, logits)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        moe(x, logits)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe(x, logits)
    graph.replay()
    torch.cuda.synchronize()
    return eager, out


@pytest.mark.parametrize("prefer,quant", [("marlin", int4_w4a16(128)), ("sglang_fp8_block", fp8_w8a8("block")),
                                          ("flashinfer_cutlass", unquantized()), ("torch_grouped_mm", unquantized())],
                         ids=["marlin-int4", "sglang-fp8-block", "flashinfer-bf16", "torch-grouped-mm-bf16"])
@torch.no_grad()
def test_eager_calls_replay_the_layers_graphs_and_compile_as_one_op(prefer, quant):
    """Where users call the layer: repeated eager calls replay its own CUDA graph (moe_core._graphs),
    torch.compile(fullgraph=True) traces it as the custom op (moe_core._op), in mode "default" and in
    "reduce-overhead" (inductor's CUDA graphs, recorded on a later call), and the caller's own CUDA
    graph captures it; all equal a plain call."""
    if prefer == "flashinfer_cutlass":
        pytest.importorskip("flashinfer")
    moe, x, logits = _layer_and_inputs(prefer, quant)
    plain = moe._run(x, logits)
    for call in range(3):  # eager, captured, replayed; each output dropped before the next call
        assert rel_err(moe(x, logits), plain) < 1e-3, f"call {call}"
    assert len(moe._graphs) == 1
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        compiled = torch.compile(moe, fullgraph=True, mode=mode)
        for call in range(3):
            assert rel_err(compiled(x, logits), plain) < 1e-3, f"{mode}, call {call}"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe(x, logits)
    graph.replay()
    assert rel_err(captured, plain) < 1e-3


def test_marlin_layer_is_captured_in_a_cuda_graph():
    eager, replayed = _eager_and_graph_replay("marlin", int4_w4a16(128))
    assert torch.equal(replayed, eager)


def test_sglang_library_loads():
    SGLANG_SM90_LIBRARY.load()
    assert hasattr(torch.ops.sgl_kernel, "fp8_blockwise_scaled_grouped_mm")


def test_sglang_fp8_block():
    _check(SglangFp8BlockExperts, layer(E=32, K=1024, N=512, top_k=8), fp8_w8a8("block"), tol=2e-2)


def test_sglang_fp8_block_expert_parallel_fp16():
    config = layer(E=32, K=512, N=256, top_k=4, dtype=torch.float16, parallel=ParallelConfig(ep_size=4, ep_rank=1))
    _check(SglangFp8BlockExperts, config, fp8_w8a8("block"), tol=2e-2)


# These run where flashinfer-python is importable, on the hardware each class claims (on the project's
# GPU machines: run_moe_cuda.sh's flashinfer phase builds its sm_90 module first).


def test_flashinfer_cutlass_bf16_and_fp8_block():
    pytest.importorskip("flashinfer")
    _check(FlashInferCutlassExperts, layer(E=32, K=1024, N=512, top_k=8), unquantized())
    _check(FlashInferCutlassExperts, layer(E=32, K=1024, N=512, top_k=8, dtype=torch.float16), unquantized())
    _check(FlashInferCutlassExperts, layer(E=32, K=1024, N=512, top_k=8), fp8_w8a8("block"), tol=2e-2)


@pytest.mark.parametrize("quant", [unquantized(), fp8_w8a8("block"), mxfp4_w4a16()],
                         ids=["bf16", "fp8-block", "mxfp4"])
def test_flashinfer_cutlass_tuned_then_captured_in_a_cuda_graph(quant):
    # The first eager call tunes FlashInfer's tactics; the capture reads them (profiling would break it).
    pytest.importorskip("flashinfer")
    if quant.weight.dtype is QuantDType.FP4_E2M1:
        _skip_off_the_gpus_claimed(FlashInferCutlassMxfp4Experts)
    eager, replayed = _eager_and_graph_replay("flashinfer_cutlass", quant)
    assert float((replayed - eager).float().norm() / eager.float().norm()) < 1e-3


def test_flashinfer_trtllm_bf16():
    pytest.importorskip("flashinfer")
    _skip_off_the_gpus_claimed(FlashInferTrtllmBf16Experts)
    _check(FlashInferTrtllmBf16Experts, layer(E=32, K=1024, N=512, top_k=8), unquantized())


def _skip_off_the_gpus_claimed(cls) -> None:
    """A class whose capability claims other GPUs than this one (FlashInfer's MXFP4 path: sm90's mixed-input
    GEMM; its TRT-LLM kernels: sm100/sm103) has nothing to run here; MOE_TEST_REQUIRE_DEVICE does not
    require it."""
    cap, here = cls.capability, torch.cuda.get_device_capability()
    if not (cap.min_capability or here) <= here <= (cap.max_capability or here):
        pytest.skip(f"{cls.__name__} runs on compute capability {cap.min_capability} to {cap.max_capability}, "
                    f"this GPU has {here}")


def test_flashinfer_mxfp4_layout_ports_equal_flashinfer():
    pytest.importorskip("flashinfer")
    _skip_off_the_gpus_claimed(FlashInferCutlassMxfp4Experts)
    from flashinfer.fused_moe import (
        interleave_moe_scales_for_sm90_mixed_gemm,
        interleave_moe_weights_for_sm90_mixed_gemm,
    )

    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in ((3, 48, 96), (2, 1024, 256), (1, 512, 512)):
        w = torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda", generator=gen)
        assert torch.equal(interleave_fp4_for_sm90(w), interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")), shape
    s = torch.randint(0, 256, (4, 256, 32), dtype=torch.uint8, device="cuda", generator=gen)
    assert torch.equal(fold_scales_for_sm90(s), interleave_moe_scales_for_sm90_mixed_gemm(s, group_size=32))


def test_flashinfer_cutlass_mxfp4_swiglu_oai_bias_and_silu():
    pytest.importorskip("flashinfer")
    _skip_off_the_gpus_claimed(FlashInferCutlassMxfp4Experts)
    gpt_oss_like = layer(E=32, K=512, N=512, top_k=4, activation=Activation.swiglu_oai(), bias=True)
    _check(FlashInferCutlassMxfp4Experts, gpt_oss_like, mxfp4_w4a16())
    _check(FlashInferCutlassMxfp4Experts, layer(E=32, K=1024, N=512, top_k=8), mxfp4_w4a16())
