"""The quantized Triton experts (WNA16, fp8, MXFP4) end to end against moe-core's fp32 reference:
the launch sequence per token count, the sinks of the top-k sums, refusals, and real shapes on a GPU.

On a machine without a GPU the kernels run under TRITON_INTERPRET=1 at tiny shapes.
"""

import dataclasses

import pytest
import torch
from _quant_support import DEV, DEVICE, RUN_ON, refuse_zeroing_launches, rel_l2, run_layer

from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.presets import PRESETS, get_preset
from moe_core.quant import fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton import configs
from moe_triton._common.pdl import dependent_launch
from moe_triton.act_quant import act_quant
from moe_triton.align import align_block_size
from moe_triton.configs import GemmConfig, QuantKernelConfig
from moe_triton.quant_gemm import _prefetchable, grouped_quant_gemm
from moe_triton.quantized import (
    LAST_ARRIVAL_MAX_TOKENS,
    TritonFp8Experts,
    TritonMxfp4Experts,
    TritonWna16Experts,
)


@pytest.mark.parametrize(("quant", "activation", "dtype"), [
    (int4_w4a16(128), Activation.silu(), torch.float16),
    (int4_w4a16(64, zero_point=True), Activation.gelu(), torch.bfloat16),
    (int4_w4a16(32), Activation.gelu_tanh(), torch.float16),
    (int4_w4a16(-1, zero_point=True), Activation.relu2(), torch.float16),
    (int8_w8a16(-1), Activation.silu(), torch.bfloat16),
    (int8_w8a16(32, zero_point=True), Activation.swiglu_oai(), torch.float16),
])
def test_wna16_matches_reference(quant, activation, dtype):
    out, ref = run_layer(TritonWna16Experts, quant, activation, dtype)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("quant", [int8_w8a16(-1), int8_w8a16(128)])
@pytest.mark.parametrize("M", [1, 7])  # 1: the direct launches (split K, last-arrival sums, GEMM2's L2 prefetch)
def test_int8_byte_quads_layer(quant, M):
    """int8 where 128 divides K runs on byte quads (int32 words) for both GEMMs; per channel with
    K = 192, GEMM1 keeps canonical codes beside GEMM2's quads."""
    for K in (256, 192) if quant.weight.group_size is None else (256,):
        out, ref = run_layer(TritonWna16Experts, quant, Activation.silu(), torch.bfloat16, K=K, N=128, M=M)
        assert rel_l2(out, ref) < 1e-2, K


def test_int4_layer_with_both_layouts():
    # Per-channel scales, K = 192: GEMM1's weights take the halves layout, GEMM2's (K = N = 128) the quads.
    out, ref = run_layer(TritonWna16Experts, int4_w4a16(-1, zero_point=True), Activation.swiglu_oai(), torch.bfloat16,
                    K=192, N=128, bias=True)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize(("cls", "quant"), [(TritonWna16Experts, int4_w4a16(64)), (TritonMxfp4Experts, mxfp4_w4a16()),
                                           (TritonWna16Experts, int8_w8a16(-1)),
                                           (TritonFp8Experts, fp8_w8a8("block")),
                                           (TritonFp8Experts, fp8_w8a8("channel", activation_scales="token"))])
@pytest.mark.parametrize("M", [3, 8])
def test_direct_launches_of_a_few_tokens(monkeypatch, cls, quant, M):
    """Calls of up to `DIRECT_MAX_TOKENS` tokens take their pairs a block each, without alignment: pairs
    of different tokens may share an expert (4 experts, top-3, 3 or 8 tokens), each streams it, and
    the top-k sums (split GEMM2, last arrival) match the reference, another rank's experts among them."""
    from moe_triton import quantized

    monkeypatch.setattr(quantized, "DIRECT_MAX_TOKENS", 8)
    monkeypatch.setattr(quantized, "align_block_size", None)  # no alignment launch: calling it fails
    out, ref = run_layer(cls, quant, Activation.silu(), torch.bfloat16, K=256, N=128, E=8, topk=3, M=M, bias=True,
                         parallel=ParallelConfig(ep_size=2, ep_rank=1), override=_splits(2, 2))
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize(("E", "topk", "M", "direct"), [(128, 8, 4, True), (128, 8, 5, False), (8, 2, 2, True),
                                                       (8, 2, 3, False), (64, 8, 4, False), (128, 4, 4, False)])
def test_which_calls_skip_the_alignment(monkeypatch, E, topk, M, direct):
    """Up to 2 tokens, or 4 where the router chooses 8 or more of 128 or more experts, a call's GEMMs
    take a block per pair without the alignment launch; the layer matches the reference either way."""
    from moe_triton import quantized

    aligned = []

    def align(*args, **kwargs):
        aligned.append(True)
        return align_block_size(*args, **kwargs)

    monkeypatch.setattr(quantized, "align_block_size", align)
    out, ref = run_layer(TritonWna16Experts, int4_w4a16(128), Activation.silu(), torch.float16, K=128, N=128, E=E,
                         topk=topk, M=M, override=_splits(1, 1))
    assert rel_l2(out, ref) < 1e-2
    assert aligned == ([] if direct else [True])


@pytest.mark.parametrize("M", [7, 1])  # 1: one token's pairs go to the GEMMs directly, without alignment
def test_wna16_bias_expert_map_and_weight_on_input(M):
    out, ref = run_layer(TritonWna16Experts, int4_w4a16(64), Activation.swiglu_oai(), torch.float16, bias=True,
                    E=6, topk=3, M=M, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    assert rel_l2(out, ref) < 1e-2
    out, ref = run_layer(TritonWna16Experts, int4_w4a16(128), topk=1, M=M, routing=Routing.llama4())
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("cls_quant", [(TritonWna16Experts, int8_w8a16(32, zero_point=True)),
                                       (TritonFp8Experts, fp8_w8a8("tensor", activation_scales="tensor")),
                                       (TritonMxfp4Experts, mxfp4_w4a16())])
def test_single_token_direct_path(cls_quant):
    cls, quant = cls_quant
    out, ref = run_layer(cls, quant, Activation.silu(), torch.bfloat16, K=256, N=128, E=8, topk=4, M=1)
    assert rel_l2(out, ref) < 1e-2


def _splits(gemm1: int, gemm2: int, block_n: int = 64) -> QuantKernelConfig:
    return QuantKernelConfig(GemmConfig(16, block_n, gemm1, 4, 2, True), GemmConfig(16, block_n, gemm2, 4, 2, True))


@pytest.mark.parametrize(("cls", "quant", "activation"), [
    (TritonWna16Experts, int4_w4a16(64), Activation.swiglu_oai()),
    (TritonWna16Experts, int8_w8a16(-1, zero_point=True), Activation.gelu()),
    (TritonMxfp4Experts, mxfp4_w4a16(), Activation.silu()),
    (TritonWna16Experts, int4_w4a16(128), Activation.relu2()),
])
@pytest.mark.parametrize("splits", [(1, 1), (2, 1), (1, 3), (4, 2)])
def test_one_token_sums_finish_at_last_arrival(cls, quant, activation, splits):
    """M=1: GEMM1's K-splits and GEMM2's top-k x K-splits are finished by their last contributor
    (the activation, the 16-bit store); another rank's experts count as contributions of nothing.
    K = 512: 4 K tiles, so 3 splits leave none empty."""
    out, ref = run_layer(cls, quant, activation, torch.bfloat16, K=512, N=128, E=6, topk=3, M=1, bias=True,
                    parallel=ParallelConfig(ep_size=2, ep_rank=0), override=_splits(*splits))
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize(("cls", "quant"), [(TritonWna16Experts, int4_w4a16(128)), (TritonMxfp4Experts, mxfp4_w4a16()),
                                           (TritonFp8Experts, fp8_w8a8("block")),
                                           (TritonFp8Experts, fp8_w8a8("channel", activation_scales="token"))])
@pytest.mark.parametrize("M", [1, LAST_ARRIVAL_MAX_TOKENS])
@pytest.mark.parametrize("splits", [(2, 1), (4, 3)])
def test_routing_launch_clears_split_gemm1_sums(monkeypatch, cls, quant, M, splits):
    """FusedMoE's call (`apply_monolithic`): a split GEMM1's sums (16-bit activations: finished by
    last arrival; fp8: quantized by the activation launch) are cleared by the routing launch, with no
    zeroing launch of their own (made to fail here), though every new buffer holds garbage; the layer
    matches the reference routed by route_torch."""

    cfg = MoEConfig(num_experts=6, top_k=3, hidden_size=512, intermediate_size=128, dtype=torch.bfloat16,
                    has_bias=True, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    experts = cls(cfg, quant, RUN_ON)
    assert experts.monolithic
    weights = ExpertWeights.random(cfg, quant, seed=M, device=DEV)
    experts.load_weights(weights)
    experts.config_override = _splits(*splits)
    gen = torch.Generator().manual_seed(M + 1)
    x = torch.randn(M, 512, generator=gen).to(torch.bfloat16).to(DEV)
    logits = torch.randn(M, 6, generator=gen).to(DEV)
    assert experts._gemm1_sums_numel(M) > 0
    refuse_zeroing_launches(monkeypatch)
    out = experts.apply_monolithic(x, logits, None)
    monkeypatch.undo()
    tw, ids = route_torch(logits, cfg.routing, cfg.top_k)
    ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("M", [1, 8, 9])
def test_routing_launch_quantizes_block_fp8_input(monkeypatch, M):
    """FusedMoE's call of a block fp8 layer: up to ROUTE_QUANTIZES_MAX_TOKENS tokens the routing launch
    quantizes GEMM1's input (no input quantization launch: made to fail here, only GEMM2's activation
    launch runs), bitwise the layer's output with it apart; beyond, the activation launch does it."""
    from moe_triton import quantized

    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=384, intermediate_size=128, dtype=torch.bfloat16)
    quant = fp8_w8a8("block")
    experts = TritonFp8Experts(cfg, quant, RUN_ON)
    weights = ExpertWeights.random(cfg, quant, seed=M, device=DEV)
    experts.load_weights(weights)
    gen = torch.Generator().manual_seed(M + 1)
    x = torch.randn(M, 384, generator=gen).to(torch.bfloat16).to(DEV)
    logits = torch.randn(M, 8, generator=gen).to(DEV)
    apart = experts.apply_monolithic(x, logits, None)
    launches = []

    def counted(h, activation, *args, **kwargs):
        launches.append(activation)
        return act_quant(h, activation, *args, **kwargs)

    monkeypatch.setattr(quantized, "act_quant", counted)
    out = experts.apply_monolithic(x, logits, None)
    in_routing = M <= quantized.ROUTE_QUANTIZES_MAX_TOKENS
    assert launches == ([cfg.activation] if in_routing else [None, cfg.activation])
    torch.testing.assert_close(out, apart, rtol=0, atol=0)
    tw, ids = route_torch(logits, cfg.routing, cfg.top_k)
    assert rel_l2(out, reference_moe(x, weights.to(DEV), cfg, tw, ids, quant)) < 2e-2


def test_routing_inside_the_experts_checks_its_rows():
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128, dtype=torch.float16)
    quant = int4_w4a16(128)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, quant, seed=0, device=DEV))
    x = torch.randn(3, 128, device=DEV).to(torch.float16)
    with pytest.raises(ValueError, match=r"router_logits must be \[3, 4\] \(a row per token of hidden_states\)"):
        experts.apply_monolithic(x, torch.randn(2, 4, device=DEV), None)


@pytest.mark.device("cuda")
def test_one_token_gemm2_prefetches_on_gpu():
    """With dependent launches (Hopper and later), the one-token GEMM2 asks L2 for its first K tiles
    before waiting for GEMM1: the processors' int4 layout allows it, and the layer (another rank's
    experts among the choices, GEMM2 split) matches the reference with it."""
    cfg = MoEConfig(num_experts=8, top_k=4, hidden_size=512, intermediate_size=256, dtype=torch.bfloat16,
                    parallel=ParallelConfig(ep_size=2, ep_rank=1))
    quant = int4_w4a16(128)
    weights = ExpertWeights.random(cfg, quant, seed=3, device=DEV)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    experts.load_weights(weights)
    experts.config_override = _splits(2, 2)
    assert _prefetchable(experts._operand("w2", cfg.hidden_size, cfg.intermediate_size)) == dependent_launch(DEV)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, cfg.hidden_size, generator=gen).to(torch.bfloat16).to(DEV)
    tw, ids = route_torch(torch.randn(1, 8, generator=gen).to(DEV), cfg.routing, cfg.top_k)
    ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert rel_l2(experts.apply(x, tw, ids), ref) < 1e-2


@pytest.mark.device("cuda")
@pytest.mark.parametrize(("quant", "routing"), [
    (int4_w4a16(128), Routing.softmax_topk(True)),
    (fp8_w8a8("block"), Routing.deepseek_v3(num_expert_groups=4, topk_groups=2)),
    (mxfp4_w4a16(), Routing.softmax_topk(True)),
])
def test_fused_layer_on_gpu(quant, routing):
    """FusedMoE over the quantized Triton classes (the experts route, `apply_monolithic`): its plan
    names moe_triton's router, and the layer matches the reference at one token and at 40."""
    from moe_core import FusedMoE
    from moe_triton.routing import route

    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=256, intermediate_size=256, routing=routing,
                    dtype=torch.bfloat16)
    layer = FusedMoE(cfg, quant, device="cuda", prefer="triton")
    assert layer.plan.router is route, layer.plan.explain()
    weights = ExpertWeights.random(cfg, quant, seed=11, device=DEV)
    gen = torch.Generator().manual_seed(12)
    bias = (torch.randn(16, generator=gen) * 0.1).to(DEV) if routing.has_correction_bias else None
    layer.load_weights(weights, correction_bias=bias)
    for M in (1, 40):
        x = torch.randn(M, 256, generator=gen).to(torch.bfloat16).to(DEV)
        logits = torch.randn(M, 16, generator=gen).to(DEV)
        tw, ids = route_torch(logits, routing, 4, bias)
        ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
        assert rel_l2(layer(x, logits), ref) < 1e-2, M


@pytest.mark.device("cuda")
def test_one_token_split_layer_launches_on_gpu():
    """A one-token FusedMoE layer whose GEMM1 is split over K runs route (which clears GEMM1's sums),
    GEMM1 and GEMM2: three launches. Routed by the caller (`apply`), a zeroing launch comes fourth.
    Eager calls: a replayed CUDA graph would show its input copy and capture-time launches instead."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from moe_core import FusedMoE
    from moe_triton.routing import route

    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=512, intermediate_size=256, dtype=torch.bfloat16)
    quant = int4_w4a16(128)
    layer = FusedMoE(cfg, quant, device="cuda", prefer="triton", cuda_graphs=False)
    layer.load_weights(ExpertWeights.random(cfg, quant, seed=5, device=DEV))
    layer.experts.config_override = _splits(2, 2)
    x = torch.randn(1, 512, device=DEV).to(torch.bfloat16)
    logits = torch.randn(1, 16, device=DEV)

    def kernels(call) -> list[str]:
        call()  # compiled before the profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        return sorted(e.name for e in prof.events() if e.device_type == DeviceType.CUDA)

    fused = kernels(lambda: layer(x, logits))
    apart = kernels(lambda: layer.experts.apply(x, *route(logits, cfg.routing, cfg.top_k)))
    assert len(fused) == 3 and "_route_kernel" in fused and "_zero_kernel" not in fused, fused
    assert sorted([*fused, "_zero_kernel"]) == apart, (fused, apart)


@pytest.mark.parametrize("M", [LAST_ARRIVAL_MAX_TOKENS, LAST_ARRIVAL_MAX_TOKENS + 1])
@pytest.mark.parametrize("splits", [(1, 1), (2, 2)])
def test_many_tokens_sums_finish_row_by_row_or_by_a_cast(splits, M):
    """Aligned tokens: up to LAST_ARRIVAL_MAX_TOKENS, the activation in GEMM1's epilogue after the last
    K-split of a row, and GEMM2's top-k x K-split sums finished row by row by their last contributor
    (rows of a tile finish in different programs); beyond, atomic sums, the activation launch after
    a split GEMM1 and a cast after GEMM2."""
    out, ref = run_layer(TritonWna16Experts, int4_w4a16(128, zero_point=True), Activation.silu(), torch.float16,
                    K=256, N=128, E=4, topk=2, M=M, bias=True, override=_splits(*splits, block_n=128))
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("cls, quant", [
    (TritonWna16Experts, int4_w4a16(128, zero_point=True)),
    (TritonFp8Experts, fp8_w8a8(activation_scales="tensor")),
])
@pytest.mark.parametrize("topk, threshold", [(3, "ROWS_SUM_MIN_PAIRS"), (8, "ROWS_SUM_MIN_PAIRS_TOP8")])
def test_many_pairs_sum_stored_rows(monkeypatch, cls, quant, topk, threshold):
    """From ROWS_SUM_MIN_PAIRS pairs (ROWS_SUM_MIN_PAIRS_TOP8 at top-8; lowered here to this test's
    pairs) GEMM2 stores each pair's 16-bit row, with bias and router weight, and one reduce sums a
    token's top-k rows; one pair fewer, it adds fp32 sums."""
    from moe_triton import quantized

    M = 12
    gemm2_outputs = []

    def recording_gemm(a, w, out, *args, **kwargs):
        if a.shape[1] == 128:  # GEMM2 (K of w2 = N)
            gemm2_outputs.append((out.shape, out.dtype, kwargs["reduce_topk"]))
        return grouped_quant_gemm(a, w, out, *args, **kwargs)

    monkeypatch.setattr(quantized, "grouped_quant_gemm", recording_gemm)
    for least in (M * topk, M * topk + 1):
        monkeypatch.setattr(quantized, "ROWS_SUM_MIN_PAIRS", 10**9)
        monkeypatch.setattr(quantized, threshold, least)
        out, ref = run_layer(cls, quant, Activation.silu(), torch.bfloat16, K=256, N=128, E=8, topk=topk, M=M, bias=True)
        assert rel_l2(out, ref) < 1e-2
    rows_dtype = torch.float32 if DEV.type == "cpu" else torch.bfloat16  # the interpreter's bf16 stores truncate
    assert gemm2_outputs == [((M * topk, 256), rows_dtype, 1), ((M, 256), torch.float32, topk)]


@pytest.mark.parametrize(("gran", "act_scales", "activation"), [
    ("tensor", "tensor", Activation.silu()), ("tensor", "token", Activation.silu()),
    ("channel", "token", Activation.relu2()), ("block", None, Activation.gelu())])
def test_fp8_matches_reference(gran, act_scales, activation):
    quant = fp8_w8a8(gran, activation_scales=act_scales) if act_scales else fp8_w8a8(gran)
    out, ref = run_layer(TritonFp8Experts, quant, activation, torch.bfloat16, K=256, N=128, M=9)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize(("gran", "act_scales", "M", "block_n", "split"), [
    ("block", None, 1, 64, 2), ("block", None, 9, 128, 1), ("block", None, 9, 256, 2),
    ("channel", "token", 1, 128, 1), ("channel", "token", 9, 64, 2), ("tensor", "tensor", 9, 128, 1),
    ("tensor", "tensor", 1, 64, 1)])
def test_fp8_swapped_matches_reference(gran, act_scales, M, block_n, split):
    """fp8 run swapped (GemmConfig.swap_ab: out^T = W . X^T, Hopper's fp8 wgmma for few rows): every
    activation scale mode (per 128-wide group, per token, per expert's tensor), one token's direct
    launch and aligned blocks, split-K, a block scale per tile and per column."""
    quant = fp8_w8a8(gran, activation_scales=act_scales) if act_scales else fp8_w8a8(gran)
    tile = GemmConfig(16, block_n, split, 4, 2, swap_ab=True)
    out, ref = run_layer(TritonFp8Experts, quant, Activation.silu(), torch.bfloat16, K=256, N=256, M=M,
                         override=QuantKernelConfig(tile, tile))
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize(("gran", "act_scales"), [("channel", "token"), ("tensor", "tensor")])
@pytest.mark.parametrize("M", [1, 9])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_fp8_k_padded_to_whole_tiles(gran, act_scales, M, swap_ab):
    """Per-channel and per-tensor fp8 codes whose K 128 does not divide (gpt-oss's 2880; here
    K = 192 and N = 320) are padded to whole 128-wide tiles with +0.0 codes, the activation launch
    writes zero columns there, and the layer matches the reference, swapped or not."""
    quant = fp8_w8a8(gran, activation_scales=act_scales)
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=192, intermediate_size=320, dtype=torch.bfloat16)
    experts = TritonFp8Experts(cfg, quant, RUN_ON)
    weights = ExpertWeights.random(cfg, quant, seed=2, device=DEV)
    experts.load_weights(weights)
    w13, w2 = experts._operand("w13", 640, 192), experts._operand("w2", 192, 320)
    assert (w13.k, w2.k, w13.block_k) == (256, 384, 128)
    assert torch.equal(w13.codes[:, :, :192].view(torch.uint8), weights.w13.to(DEV).view(torch.uint8))
    assert not w13.codes[:, :, 192:].view(torch.uint8).any() and not w2.codes[:, :, 320:].view(torch.uint8).any()
    tile = GemmConfig(16, 64, 2 if M == 1 else 1, 4, 2, swap_ab)
    out, ref = run_layer(TritonFp8Experts, quant, Activation.silu(), torch.bfloat16, K=192, N=320, M=M, bias=True,
                         override=QuantKernelConfig(tile, tile))
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("swap_ab", [False, True])
@pytest.mark.parametrize("block_n", [64, 128, 256])
def test_fp8_block_scale_of_each_output_block(block_n, swap_ab):
    """Tiles inside one 128-row weight block take its scale as one number per K tile (block_n <= 128),
    wider tiles one per column; every other block's scales are 4x larger, so a tile that read its
    neighbour's scale would be far off."""
    def spread(weights):
        for scale in (weights.w13_scale, weights.w2_scale):
            scale[:, 1::2] *= 4.0

    tile = GemmConfig(16, block_n, 1, 4, 2, swap_ab)
    out, ref = run_layer(TritonFp8Experts, fp8_w8a8("block"), Activation.silu(), torch.bfloat16, K=256, N=256, M=9,
                         override=QuantKernelConfig(tile, tile), edit_weights=spread)
    assert rel_l2(out, ref) < 2e-2  # 1.1e-2 here, as unspread; a neighbour's scale gives ~1


@pytest.mark.parametrize(("K", "N", "dtype", "M"), [(128, 128, torch.bfloat16, 7), (192, 320, torch.bfloat16, 1),
                                                     (320, 192, torch.float16, 9)])
def test_mxfp4_gpt_oss_style(K, N, dtype, M):
    """gpt-oss's layer (MXFP4 weights, clamped SwiGLU with biases); a K or N that 128 does not divide
    (gpt-oss's 2880) pads that GEMM's quads to whole tiles; fp16 takes each weight rounded once."""
    out, ref = run_layer(TritonMxfp4Experts, mxfp4_w4a16(), Activation.swiglu_oai(), dtype, K=K, N=N, M=M, bias=True)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize(("quant", "K", "N", "M"), [(int8_w8a16(-1), 192, 320, 7), (int8_w8a16(-1), 320, 192, 1),
                                                  (int8_w8a16(-1, zero_point=True), 192, 320, 9),
                                                  (int8_w8a16(64, zero_point=True), 320, 192, 5)])
def test_int8_pads_k_to_whole_byte_quads_tiles(quant, K, N, M):
    """int8 with a K or N that 128 does not divide (gpt-oss's 2880) takes byte quads with K padded
    to whole tiles, whose padding dequantizes to exactly 0 (per-channel codes at their row's zero
    under the one scale row, grouped ones under zero scale rows); the layer matches the reference."""
    from moe_triton.quant_gemm_details._dequant import dequantize_padded

    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=K, intermediate_size=N, dtype=torch.bfloat16,
                    activation=Activation.swiglu_oai(), has_bias=True)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, quant, seed=4, device=DEV))
    for w in (experts._operand("w13", cfg.w13_rows, K), experts._operand("w2", K, N)):
        assert w.quads and w.codes.dtype == torch.int32
        padded = dequantize_padded(w)
        assert padded.shape[2] == -(-w.k // 128) * 128
        assert torch.equal(padded[:, :, w.k:], torch.zeros_like(padded[:, :, w.k:]))
    out, ref = run_layer(TritonWna16Experts, quant, Activation.swiglu_oai(), torch.bfloat16, K=K, N=N, M=M, bias=True)
    assert rel_l2(out, ref) < 1e-2


def test_refusals_name_the_reason():
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128, dtype=torch.float16)
    assert TritonWna16Experts.supports(cfg, int4_w4a16(128, act_order=True), DEVICE)  # tests/test_act_order.py
    odd = MoEConfig(num_experts=4, top_k=2, hidden_size=96, intermediate_size=64, dtype=torch.float16)
    assert "multiple of 64" in TritonWna16Experts.supports(odd, int4_w4a16(32), DEVICE).reason
    assert "group size 128" in TritonWna16Experts.supports(
        MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64), int4_w4a16(128), DEVICE).reason
    blk = MoEConfig(num_experts=4, top_k=2, hidden_size=192, intermediate_size=128, dtype=torch.bfloat16)
    assert "divisible by 128" in TritonFp8Experts.supports(blk, fp8_w8a8("block"), DEVICE).reason
    experts = TritonWna16Experts(cfg, int4_w4a16(128), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, int4_w4a16(128), device=DEV))
    x = torch.randn(3, 100, dtype=torch.float16, device=DEV)
    with pytest.raises(ValueError, match="hidden_states must be"):
        experts.apply(x, torch.rand(3, 2, device=DEV), torch.zeros(3, 2, dtype=torch.int32, device=DEV))


@pytest.mark.device("cuda")
@pytest.mark.parametrize(("quant", "K", "N", "activation"), [
    (int4_w4a16(128), 2048, 768, Activation.silu()),
    (int4_w4a16(64, zero_point=True), 2880, 2880, Activation.swiglu_oai()),
    (int8_w8a16(-1), 2048, 768, Activation.silu()),
    (int8_w8a16(-1), 2880, 2880, Activation.swiglu_oai()),  # byte quads, K padded to whole tiles
    (fp8_w8a8("block"), 2048, 768, Activation.silu()),
    (fp8_w8a8("channel"), 2048, 768, Activation.silu()),
    (fp8_w8a8("channel"), 2880, 2880, Activation.swiglu_oai()),  # 64-wide K tiles
    (mxfp4_w4a16(), 2880, 2880, Activation.swiglu_oai()),
])
@pytest.mark.parametrize("M", [1, 64, 1024, 4096])  # 4096 x top-4: GEMM2 stores rows (ROWS_SUM_MIN_PAIRS)
def test_real_shapes_on_gpu(quant, K, N, activation, M):
    cls = {"int4": TritonWna16Experts, "int8": TritonWna16Experts, "fp8e4m3": TritonFp8Experts,
           "fp4e2m1": TritonMxfp4Experts}[quant.weight.dtype.value]
    out, ref = run_layer(cls, quant, activation, torch.bfloat16, K=K, N=N, E=32, topk=4, M=M,
                    bias=activation.kind.value == "swiglu_oai")
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.device("cuda")
@pytest.mark.parametrize("M", [1024, 2048])
def test_top8_stored_rows_on_gpu(M):
    """Top-8 layers store GEMM2's rows from ROWS_SUM_MIN_PAIRS_TOP8 pairs (1024 tokens), below the
    other layers' ROWS_SUM_MIN_PAIRS; the qwen3-30b-a3b shape."""
    from moe_triton import quantized

    assert quantized.ROWS_SUM_MIN_PAIRS_TOP8 <= M * 8
    out, ref = run_layer(TritonWna16Experts, int4_w4a16(128), Activation.silu(), torch.bfloat16, K=2048, N=768, E=128,
                    topk=8, M=M)
    assert rel_l2(out, ref) < 1e-2


# The shipped files' families a quantized layer runs, and how each is built.
_SHIPPED_FAMILIES = {"wna16-int4-": "int4", "wna16-int8-channel": "int8", "mxfp4": "mxfp4",
                     "fp8-block": "fp8-block", "fp8-channel": "fp8-channel"}


def _shipped_quant_shapes() -> list[tuple[str, str, int, QuantKernelConfig, str]]:
    """(scheme, preset, M, config, device tag of the first file holding it) for each distinct launch
    shape of a preset in the int4, int8, MXFP4 and fp8 files found (shipped, and those in
    $MOE_TRITON_CONFIG_DIR: a tuning run's output can be checked before it ships)."""
    found, seen = [], set()
    for key, (_, table) in sorted(configs._load().items(), key=lambda kv: kv[0].file_name()):
        scheme = next((s for prefix, s in _SHIPPED_FAMILIES.items() if key.kernel.startswith(prefix)), None)
        if scheme is None:
            continue
        preset = next(p for p in PRESETS.values() if p.name != "tiny" and (
            p.config.num_experts, p.config.intermediate_size, p.config.hidden_size, p.config.top_k)
            == (key.num_experts, key.intermediate, key.hidden, key.top_k))
        for m in sorted(table):
            if (scheme, preset.name, table[m]) not in seen:
                seen.add((scheme, preset.name, table[m]))
                found.append((scheme, preset.name, m, table[m], key.device))
    return found


@pytest.mark.device("cuda")
@pytest.mark.parametrize(("scheme", "preset", "M", "tuned"),
                         [pytest.param(s, p, m, c, id=f"{s}-{p}-{dev}-M{m}") for s, p, m, c, dev in _shipped_quant_shapes()])
def test_shipped_quant_shapes_on_gpu(scheme, preset, M, tuned):
    """Every launch shape the tuned int4, int8, MXFP4 and fp8 files ship, at the preset's N, K, group,
    activation and bias, against the reference (fp8: its activations quantized per token or 128-wide
    group, as the reference does); a GEMM1 that ranks its own experts also as FusedMoE calls it, from the
    router logits. Fewer experts (16, or the preset's 8) keep the fp32 reference in
    memory; at most 2048 tokens still give each expert more rows than the widest block."""
    p = get_preset(preset)
    E = min(p.config.num_experts, 16)
    cls, quant = {"int4": (TritonWna16Experts, int4_w4a16(p.int4_group_size)),
                  "int8": (TritonWna16Experts, int8_w8a16()), "mxfp4": (TritonMxfp4Experts, mxfp4_w4a16()),
                  "fp8-block": (TritonFp8Experts, fp8_w8a8("block")),
                  "fp8-channel": (TritonFp8Experts, fp8_w8a8("channel"))}[scheme]
    cfg = dataclasses.replace(p.config, num_experts=E, dtype=torch.bfloat16)
    weights = ExpertWeights.random(cfg, quant, seed=M, device=DEV)
    experts = cls(cfg, quant, RUN_ON)
    experts.load_weights(weights)
    experts.config_override = tuned
    M = min(M, 2048)
    gen = torch.Generator().manual_seed(M + 1)
    x = torch.randn(M, cfg.hidden_size, generator=gen).to(torch.bfloat16).to(DEV)
    bias = torch.randn(E, generator=gen).to(DEV) * 0.1 if cfg.routing.has_correction_bias else None
    logits = torch.randn(M, E, generator=gen).to(DEV)
    tw, ids = route_torch(logits, cfg.routing, cfg.top_k, bias)
    ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert rel_l2(experts.apply(x, tw, ids), ref) < 1e-2
    if tuned.gemm1.own_route:  # GEMM1 ranks its pairs' experts from the logits only in FusedMoE's call
        assert rel_l2(experts.apply_monolithic(x, logits, bias), ref) < 1e-2
