"""Quantized Triton experts against the fp32 reference and against their torch twins.

On a machine without a GPU the kernels run under TRITON_INTERPRET=1 at tiny shapes.
"""

import dataclasses
import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.presets import PRESETS, get_preset
from moe_core.quant import fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton import configs
from moe_triton._details.offline import run_compiler_script
from moe_triton._details.pdl import dependent_launch
from moe_triton._details.quant_act import QMode, act_quant, act_quant_torch
from moe_triton._details.quant_gemm import (
    GemmConfig,
    LastArrival,
    _prefetchable,
    moe_gemm,
    moe_gemm_torch,
    pack_int4_quads,
    pack_int4_tiles,
    stored_k_major,
    stored_tile_major,
    unpack_int4_quads,
    unpack_int4_tiles,
    wgmma_capable,
    zeroed_int32,
)
from moe_triton.align import align_block_size
from moe_triton.configs import ConfigKey, QuantKernelConfig
from moe_triton.quantized import (
    GATE_UP_CHUNK,
    LAST_ARRIVAL_MAX_TOKENS,
    TritonFp8Experts,
    TritonMxfp4Experts,
    TritonWna16Experts,
)
from moe_triton.tune import _tune_int4_layer, per_gemm_grid, quant_candidates, wgmma_grid

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# What `supports` is asked about (a Hopper GPU), and where the kernels run (the interpreter on CPU).
DEVICE = DeviceInfo(Platform.CUDA, 0, "H100", (9, 0))
RUN_ON = DEVICE if DEV.type == "cuda" else DeviceInfo(Platform.CPU)


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def _run(cls, quant, activation=None, dtype=torch.float16, K=128, N=128, E=4, topk=2, M=7, bias=False,
         parallel=None, seed=0, routing=None, override=None):
    cfg = MoEConfig(num_experts=E, top_k=topk, hidden_size=K, intermediate_size=N,
                    activation=activation or Activation.silu(), routing=routing or Routing.softmax_topk(True),
                    dtype=dtype, parallel=parallel or ParallelConfig(), has_bias=bias)
    assert cls.supports(cfg, quant, DEVICE), cls.supports(cfg, quant, DEVICE).reason
    weights = ExpertWeights.random(cfg, quant, seed=seed, device=DEV)
    experts = cls(cfg, quant, RUN_ON)
    experts.config_override = override
    experts.load_weights(weights)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(M, K, generator=gen).to(dtype).to(DEV)
    tw, ids = route_torch(torch.randn(M, E, generator=gen).to(DEV), cfg.routing, topk)
    out = experts.apply(x, tw, ids)
    ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert out.shape == (M, K) and out.dtype == dtype
    return out, ref


@pytest.mark.parametrize(("quant", "activation", "dtype"), [
    (int4_w4a16(128), Activation.silu(), torch.float16),
    (int4_w4a16(64, zero_point=True), Activation.gelu(), torch.bfloat16),
    (int4_w4a16(32), Activation.gelu_tanh(), torch.float16),
    (int4_w4a16(-1, zero_point=True), Activation.relu2(), torch.float16),
    (int8_w8a16(-1), Activation.silu(), torch.bfloat16),
    (int8_w8a16(32, zero_point=True), Activation.swiglu_oai(), torch.float16),
])
def test_wna16_matches_reference(quant, activation, dtype):
    out, ref = _run(TritonWna16Experts, quant, activation, dtype)
    assert rel_l2(out, ref) < 1e-2


def test_int4_layer_with_both_layouts():
    # Per-channel scales, K = 192: GEMM1's weights take the halves layout, GEMM2's (K = N = 128) the quads.
    out, ref = _run(TritonWna16Experts, int4_w4a16(-1, zero_point=True), Activation.swiglu_oai(), torch.bfloat16,
                    K=192, N=128, bias=True)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("zero_point", [False, True])
def test_int4_pads_k_to_whole_quads_tiles(zero_point):
    """Grouped int4 whose K 128 does not divide (gpt-oss's 2880; 192 here): the quads layout padded to
    whole tiles, the padding dequantizing to exactly 0, and the layer (M = 1 and many) as the reference."""
    from moe_triton._details.quant_gemm import dequantize_padded

    quant = int4_w4a16(64, zero_point=zero_point)
    w = _gemm1_operand(quant, 192, seed=4)
    assert w.quads and w.k == 192 and w.k_tiles == 2 and w.codes.shape[2] == 2
    assert w.scale.shape[1] == 256 // 64 and (w.zero is None or w.zero.shape[1] == 4)
    full = dequantize_padded(w)
    assert full.shape[2] == 256 and bool((full[:, :, 192:] == 0).all()) and bool((full[:, :, :192] != 0).any())
    for M in (1, 9):
        out, ref = _run(TritonWna16Experts, quant, Activation.swiglu_oai(), torch.bfloat16, K=192, N=192, bias=True,
                        M=M)
        assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("M", [7, 1])  # 1: one token's pairs go to the GEMMs directly, without alignment
def test_wna16_bias_expert_map_and_weight_on_input(M):
    out, ref = _run(TritonWna16Experts, int4_w4a16(64), Activation.swiglu_oai(), torch.float16, bias=True,
                    E=6, topk=3, M=M, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    assert rel_l2(out, ref) < 1e-2
    out, ref = _run(TritonWna16Experts, int4_w4a16(128), topk=1, M=M, routing=Routing.llama4())
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("cls_quant", [(TritonWna16Experts, int8_w8a16(32, zero_point=True)),
                                       (TritonFp8Experts, fp8_w8a8("tensor")),
                                       (TritonMxfp4Experts, mxfp4_w4a16())])
def test_single_token_direct_path(cls_quant):
    cls, quant = cls_quant
    out, ref = _run(cls, quant, Activation.silu(), torch.bfloat16, K=256, N=128, E=8, topk=4, M=1)
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
    out, ref = _run(cls, quant, activation, torch.bfloat16, K=512, N=128, E=6, topk=3, M=1, bias=True,
                    parallel=ParallelConfig(ep_size=2, ep_rank=0), override=_splits(*splits))
    assert rel_l2(out, ref) < 1e-2


def test_zeroing_launch_clears_its_buffer(monkeypatch):
    """The zeroing before a split GEMM1 (a dependent launch, not a fill) clears every element of a
    buffer that held garbage, past the last whole block too."""
    monkeypatch.setattr(torch, "empty", lambda numel, dtype, device: torch.full((numel,), 0x5A5A5A5A, dtype=dtype,
                                                                                device=device))
    buf = zeroed_int32(2500, DEV)
    assert buf.shape == (2500,) and buf.dtype == torch.int32 and not buf.any()


@pytest.mark.parametrize(("cls", "quant"), [(TritonWna16Experts, int4_w4a16(128)), (TritonMxfp4Experts, mxfp4_w4a16())])
@pytest.mark.parametrize("M", [1, LAST_ARRIVAL_MAX_TOKENS])
@pytest.mark.parametrize("splits", [(2, 1), (4, 3)])
def test_routing_launch_clears_split_gemm1_sums(monkeypatch, cls, quant, M, splits):
    """FusedMoE's call (`apply_monolithic`): a split GEMM1's last-arrival sums are cleared by the
    routing launch, with no zeroing launch of their own (made to fail here), though every new
    buffer holds garbage; the layer matches the reference routed by route_torch."""
    from moe_triton import quantized

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

    def no_zeroing_launch(numel, device):
        raise AssertionError("a zeroing launch of its own")

    empty = torch.empty

    def garbage(*args, **kwargs):
        t = empty(*args, **kwargs)
        t.view(torch.uint8).fill_(0x5A)
        return t

    monkeypatch.setattr(quantized, "zeroed_int32", no_zeroing_launch)
    monkeypatch.setattr(torch, "empty", garbage)
    out = experts.apply_monolithic(x, logits, None)
    monkeypatch.undo()
    tw, ids = route_torch(logits, cfg.routing, cfg.top_k)
    ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert rel_l2(out, ref) < 1e-2


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
    GEMM1 and GEMM2: three launches. Routed by the caller (`apply`), a zeroing launch comes fourth."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from moe_core import FusedMoE
    from moe_triton.routing import route

    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=512, intermediate_size=256, dtype=torch.bfloat16)
    quant = int4_w4a16(128)
    layer = FusedMoE(cfg, quant, device="cuda", prefer="triton")
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
    out, ref = _run(TritonWna16Experts, int4_w4a16(128, zero_point=True), Activation.silu(), torch.float16,
                    K=256, N=128, E=4, topk=2, M=M, bias=True, override=_splits(*splits, block_n=128))
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("cls, quant", [
    (TritonWna16Experts, int4_w4a16(128, zero_point=True)),
    (TritonFp8Experts, fp8_w8a8(block=(128, 128))),
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
        return moe_gemm(a, w, out, *args, **kwargs)

    monkeypatch.setattr(quantized, "moe_gemm", recording_gemm)
    for least in (M * topk, M * topk + 1):
        monkeypatch.setattr(quantized, "ROWS_SUM_MIN_PAIRS", 10**9)
        monkeypatch.setattr(quantized, threshold, least)
        out, ref = _run(cls, quant, Activation.silu(), torch.bfloat16, K=256, N=128, E=8, topk=topk, M=M, bias=True)
        assert rel_l2(out, ref) < 1e-2
    rows_dtype = torch.float32 if DEV.type == "cpu" else torch.bfloat16  # the interpreter's bf16 stores truncate
    assert gemm2_outputs == [((M * topk, 256), rows_dtype, 1), ((M, 256), torch.float32, topk)]


def test_gemm1_with_the_activation_matches_twin():
    """The fused epilogue of one GEMM1 launch against the twin's pre-activation rows, de-interleaved
    and activated by the reference."""
    from moe_core.reference import apply_activation
    from moe_triton._details.quant_act import deinterleave_gate_up

    w = _gemm1_operand(int4_w4a16(128), 256, seed=4)  # gated: rows interleaved by the processor
    act = Activation.gelu_tanh()
    M, topk = 5, 2
    ids = torch.randint(0, w.num_experts, (M, topk), dtype=torch.int32, device=DEV)
    x = torch.randn(M, w.k, dtype=torch.float16, device=DEV)
    launch = GemmConfig(16, 128, 1, 4, 2, True)
    sorted_ids, expert_ids, num_post = align_block_size(ids, launch.block_m, w.num_experts)
    out = torch.empty(M * topk, w.n // 2, dtype=torch.float32, device=DEV)
    moe_gemm(x, w, out, sorted_ids, expert_ids, num_post, M * topk, launch, a_rows_div=topk, activation=act,
             gate_up_chunk=GATE_UP_CHUNK)
    h = moe_gemm_torch(x, w, ids.flatten(), a_rows_div=topk)
    assert rel_l2(out, apply_activation(deinterleave_gate_up(h, GATE_UP_CHUNK), act)) < 1e-3
    with pytest.raises(ValueError, match="block_n divisible by 64"):
        moe_gemm(x, w, out, sorted_ids, expert_ids, num_post, M * topk, GemmConfig(16, 32, 1, 4, 2, True),
                 a_rows_div=topk, activation=act, gate_up_chunk=GATE_UP_CHUNK)
    with pytest.raises(ValueError, match="needs whole sums"):
        moe_gemm(x, w, out.new_zeros(M * topk, w.n), sorted_ids, expert_ids, num_post, M * topk,
                 dataclasses.replace(launch, split_k=2), a_rows_div=topk, activation=act, atomic=True,
                 gate_up_chunk=GATE_UP_CHUNK)


def test_processor_interleaves_gated_w13_rows():
    """Gated w13 rows (codes, scales, zero points, bias) are packed in chunks of GATE_UP_CHUNK:
    gate chunk c, then up chunk c; w2 and non-gated w13 keep the canonical order."""
    from moe_triton._details.quant_gemm import dequantize_operand

    q = int4_w4a16(64, zero_point=True)
    for activation, interleaved in ((Activation.silu(), True), (Activation.relu2(), False)):
        cfg = MoEConfig(num_experts=2, top_k=1, hidden_size=128, intermediate_size=128, activation=activation,
                        dtype=torch.float16, has_bias=True)
        weights = ExpertWeights.random(cfg, q, seed=2, device=DEV)
        experts = TritonWna16Experts(cfg, q, RUN_ON)
        experts.load_weights(weights)
        canonical = weights.dequantize()[0].to(DEV)  # [E, R, K]
        packed = dequantize_operand(experts._operand("w13", cfg.w13_rows, 128))
        bias = experts._packed()["w13_bias"]
        if interleaved:
            order = torch.cat([torch.arange(c * 32, c * 32 + 32) + half * 128 for c in range(4) for half in (0, 1)])
            canonical, want_bias = canonical[:, order], weights.w13_bias.float()[:, order]
        else:
            want_bias = weights.w13_bias.float()
        torch.testing.assert_close(packed, canonical.float(), rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(bias.cpu(), want_bias, rtol=0, atol=0)


@pytest.mark.parametrize(("gran", "activation"), [
    ("tensor", Activation.silu()), ("channel", Activation.relu2()), ("block", Activation.gelu())])
def test_fp8_matches_reference(gran, activation):
    out, ref = _run(TritonFp8Experts, fp8_w8a8(gran), activation, torch.bfloat16, K=256, N=128, M=9)
    assert rel_l2(out, ref) < 1e-2


def test_mxfp4_gpt_oss_style():
    out, ref = _run(TritonMxfp4Experts, mxfp4_w4a16(), Activation.swiglu_oai(), torch.bfloat16, bias=True)
    assert rel_l2(out, ref) < 1e-2


def test_refusals_name_the_reason():
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128, dtype=torch.float16)
    s = TritonWna16Experts.supports(cfg, int4_w4a16(128, act_order=True), DEVICE)
    assert not s and "act-order" in s.reason
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


def test_int4_tile_packing_roundtrip():
    codes = torch.randint(0, 256, (2, 3, 64), dtype=torch.uint8)
    packed = pack_int4_tiles(codes, 64)
    assert packed.shape == (2, 3, 2, 32)
    assert packed.stride() == (192, 1, 96, 3)  # K-major: one K tile's byte rows, N contiguous
    unpacked = unpack_int4_tiles(packed)
    assert torch.equal(unpacked[..., 0::2] | (unpacked[..., 1::2] << 4), codes)
    # Tile 1 of row 0: its first byte holds k=64 (low) and k=96 (high).
    assert int(packed[0, 0, 1, 0]) == int(unpacked[0, 0, 64]) | (int(unpacked[0, 0, 96]) << 4)


def test_int4_quad_packing_roundtrip():
    codes = torch.randint(0, 256, (2, 3, 128), dtype=torch.uint8)
    words = pack_int4_quads(codes, 128)
    assert words.shape == (2, 3, 2, 32) and words.dtype == torch.int16
    assert words.stride() == (192, 32, 96, 1)  # tile-major: one K tile's rows are contiguous
    unpacked = unpack_int4_quads(words)
    assert torch.equal(unpacked[..., 0::2] | (unpacked[..., 1::2] << 4), codes)
    # Tile 1 of row 2, word 5: nibble j holds k = 128 + 32 j + 5.
    word = int(words[1, 2, 1, 5]) & 0xFFFF
    assert [(word >> (4 * j)) & 0xF for j in range(4)] == [int(unpacked[1, 2, 128 + 32 * j + 5]) for j in range(4)]


@pytest.mark.parametrize(("quant", "K", "split_k", "swap_ab", "block_n", "warps", "block_m"), [
    (int4_w4a16(32, zero_point=True), 256, 1, True, 64, 4, 16), (int4_w4a16(32, zero_point=True), 256, 2, True, 64, 4, 16),
    # 128-wide tiles in one scale group: scaled after the dots up to 16 x 128 outputs per tile, per weight above
    (int4_w4a16(128), 256, 1, True, 64, 4, 16), (int4_w4a16(128, zero_point=True), 256, 1, True, 64, 4, 32),
    (int4_w4a16(128, zero_point=True), 256, 1, True, 64, 4, 64),
    (int4_w4a16(128), 384, 4, True, 64, 4, 16),  # 3 K tiles in 4 splits: the last split is empty
    (int4_w4a16(64), 256, 2, True, 512, 8, 16),  # wider than N: masked columns, as gpt-oss N=2880 has in 256 tiles
    # K = 192: grouped int4 pads it to two 128-wide quads tiles (as gpt-oss's 2880), per-channel int4
    # takes the halves layout's 64-wide tiles
    (int4_w4a16(64), 192, 1, True, 64, 4, 16), (int4_w4a16(64, zero_point=True), 192, 2, True, 128, 4, 16),
    (int4_w4a16(32, zero_point=True), 192, 1, True, 64, 4, 64), (int4_w4a16(-1), 192, 2, True, 64, 4, 16),
    (int4_w4a16(-1, zero_point=True), 192, 1, True, 128, 4, 32),
    (mxfp4_w4a16(), 256, 1, False, 64, 4, 16), (mxfp4_w4a16(), 256, 2, True, 64, 4, 16),
])
def test_gemm_matches_twin(quant, K, split_k, swap_ab, block_n, warps, block_m):
    """GEMM1 kernel vs its twin on a layout-converted 4-bit operand: split-K (an empty split too), swapped
    operands, and int4 scaled per weight or after the dots (`quant_gemm._POST_SCALE_MAX_TILE`)."""
    w = _gemm1_operand(quant, K, seed=3)
    if quant.weight.dtype.value == "int4":
        assert w.quads == (K % 128 == 0 or w.group < K)  # quads (padded for groups), else halves
    assert _gemm1_error(w, GemmConfig(block_m, block_n, split_k, warps, 2, swap_ab)) < 1e-3


def _routed_counts_layer(counts, quant, launch: QuantKernelConfig, K=256, N=128, dtype=torch.float16, seed=3,
                         cls=TritonWna16Experts):
    """(layer output, fp32 reference) with top-1 routing that gives expert e exactly counts[e] tokens."""
    cfg = MoEConfig(num_experts=len(counts), top_k=1, hidden_size=K, intermediate_size=N, dtype=dtype)
    weights = ExpertWeights.random(cfg, quant, seed=seed, device=DEV)
    experts = cls(cfg, quant, RUN_ON)
    experts.config_override = launch
    experts.load_weights(weights)
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.cat([torch.full((n,), e, dtype=torch.int32) for e, n in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel(), generator=gen)].view(-1, 1).to(DEV)
    tw = (torch.rand(ids.shape, generator=gen) + 0.5).to(DEV)
    x = torch.randn(ids.shape[0], K, generator=gen).to(dtype).to(DEV)
    return experts.apply(x, tw, ids), reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))


@pytest.mark.parametrize(("quant", "block_m"), [(int4_w4a16(128, zero_point=True), 32), (int4_w4a16(64), 64),
                                                (mxfp4_w4a16(), 32)])
def test_narrow_blocks_match_reference(quant, block_m):
    """tl.dot kernel: a block with at most half its pairs valid runs its dots over that half (experts
    with half a block, one pair more, one pair, a whole block, one more and one and a half put
    blocks on both sides of that boundary): as the reference, and as whole blocks."""
    half = block_m // 2
    counts = [half, half + 1, 1, block_m, 0, block_m + 1, block_m + half, half - 1]
    whole = GemmConfig(block_m, 64, 1, 4, 2, swap_ab=True)
    cls = TritonWna16Experts if quant.weight.dtype.value == "int4" else TritonMxfp4Experts
    out, ref = _routed_counts_layer(counts, quant, QuantKernelConfig(whole, whole), cls=cls)
    narrow = dataclasses.replace(whole, narrow=True)
    narrowed, _ = _routed_counts_layer(counts, quant, QuantKernelConfig(narrow, narrow), cls=cls)
    assert rel_l2(narrowed, ref) < 1e-2
    torch.testing.assert_close(narrowed, out, rtol=1e-3, atol=1e-3)


def test_narrow_limits():
    with pytest.raises(ValueError, match=r"narrow is an option of the tl\.dot kernel with block_m >= 32"):
        GemmConfig(16, 64, 1, 4, 2, swap_ab=True, narrow=True)
    with pytest.raises(ValueError, match=r"narrow is an option of the tl\.dot kernel"):
        GemmConfig(128, 256, 1, 4, 3, swap_ab=True, wgmma=True, narrow=True)


@pytest.mark.parametrize(("quant", "K", "block_m", "tail", "narrow"), [
    (int4_w4a16(128, zero_point=True), 256, 32, 16, False),
    (int4_w4a16(64), 192, 64, 32, False),  # quarters of different scale groups, K padded to whole tiles
    (int4_w4a16(128), 256, 64, 16, True),
])
def test_tl_dot_tail_blocks_match_reference(quant, K, block_m, tail, narrow):
    """tl.dot kernel: a full block takes in its expert's last block when that holds at most `tail`
    pairs (experts with 1, tail and tail + 1 pairs past one or two full blocks, a lone short
    block, a lone full one, an empty one): as the reference, and as the launch without tails (with
    `narrow`, the blocks not taken in that hold at most half a block run narrow)."""
    counts = [block_m + 1, block_m + tail, block_m + tail + 1, 0, 2 * block_m + tail, 5, block_m, 2 * block_m + 1]
    plain = GemmConfig(block_m, 64, 1, 4, 2, swap_ab=True, narrow=narrow)
    out, ref = _routed_counts_layer(counts, quant, QuantKernelConfig(plain, plain), K=K)
    taking = dataclasses.replace(plain, tail=tail)
    taken, _ = _routed_counts_layer(counts, quant, QuantKernelConfig(taking, taking), K=K)
    assert rel_l2(taken, ref) < 1e-2
    torch.testing.assert_close(taken, out, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("sink", ["atomic", "last_arrival"])
def test_tl_dot_tail_rows_reach_every_sink(sink):
    """A taken-in tail's rows go through the block's epilogue: split-K sums added atomically, or
    finished by their last contributor (two K-splits each), as the twin."""
    w = _gemm1_operand(int4_w4a16(64, zero_point=True), 192, seed=7)
    counts = [48, 49, 1, 80]  # 32 + 16, one more, a lone pair, 64 + 16
    gen = torch.Generator().manual_seed(8)
    ids = torch.cat([torch.full((n,), e, dtype=torch.int32) for e, n in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel(), generator=gen)].to(DEV)
    P = ids.numel()
    x = torch.randn(P, w.k, generator=gen).to(torch.float16).to(DEV)
    sorted_ids, expert_ids, num_post = align_block_size(ids.view(-1, 1), 32, w.num_experts)
    launch = GemmConfig(32, 64, 2, 4, 2, swap_ab=True, tail=16)
    sums = torch.zeros(P, w.n, dtype=torch.float32, device=DEV)
    if sink == "atomic":
        moe_gemm(x, w, sums, sorted_ids, expert_ids, num_post, P, launch, atomic=True)
        out = sums
    else:
        out = torch.empty(P, w.n, dtype=torch.float16, device=DEV)
        arrivals = zeroed_int32(P * -(-w.n // launch.block_n), DEV)
        moe_gemm(x, w, sums, sorted_ids, expert_ids, num_post, P, launch, last_arrival=LastArrival(out, arrivals))
    assert rel_l2(out, moe_gemm_torch(x, w, ids)) < 2e-3


def test_tl_dot_tail_refuses_other_weights():
    w = _gemm1_operand(mxfp4_w4a16(), 256, seed=1)
    ids = torch.zeros(40, 1, dtype=torch.int32, device=DEV)
    sorted_ids, expert_ids, num_post = align_block_size(ids, 32, w.num_experts)
    out = torch.zeros(40, w.n, dtype=torch.float32, device=DEV)
    with pytest.raises(ValueError, match=r"taken-in tails \(GemmConfig.tail\) are an option of int4 weights in the "
                                         r"quads layout, got MXFP4"):
        moe_gemm(torch.randn(40, 256, device=DEV).half(), w, out, sorted_ids, expert_ids, num_post, 40,
                 GemmConfig(32, 64, 1, 4, 2, swap_ab=True, tail=16), atomic=True)


@pytest.mark.parametrize(("quant", "K"), [(int4_w4a16(128, zero_point=True), 256), (int4_w4a16(64), 192),
                                          (mxfp4_w4a16(), 256)])
def test_gemm_reads_4bit_codes_in_any_memory_order(quant, K):
    """The kernel takes the [E, N, K tile, word] codes through their strides: the same values stored
    tile-major, row-major or K-major give the same result (benchmarks/gpu/layout_ab.py times them)."""
    w = _gemm1_operand(quant, K, seed=5)
    c = w.codes
    orders = {"tile-major": stored_tile_major(c), "row-major": c.contiguous(), "K-major": stored_k_major(c)}
    for name, codes in orders.items():
        assert _gemm1_error(dataclasses.replace(w, codes=codes), GemmConfig(16, 64, 2, 4, 2, True)) < 1e-3, name


def _gemm1_operand(quant, K: int, seed: int):
    """GEMM1's weights (N = 256) of a 4-expert 4-bit layer, in the kernel layout."""
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=K, intermediate_size=128, dtype=torch.float16)
    cls = TritonWna16Experts if quant.weight.dtype.value == "int4" else TritonMxfp4Experts
    experts = cls(cfg, quant, RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, quant, seed=seed, device=DEV))
    return experts._operand("w13", 256, K)


def _gemm1_error(w, launch: GemmConfig) -> float:
    """Relative L2 error of the kernel against its twin for 5 random tokens' top-2 pairs."""
    M, topk = 5, 2
    ids = torch.randint(0, w.num_experts, (M, topk), dtype=torch.int32, device=DEV)
    x = torch.randn(M, w.k, dtype=torch.float16, device=DEV)
    sorted_ids, expert_ids, num_post = align_block_size(ids, launch.block_m, w.num_experts)
    out = torch.zeros(M * topk, w.n, dtype=torch.float32, device=DEV)
    moe_gemm(x, w, out, sorted_ids, expert_ids, num_post, M * topk, launch, a_rows_div=topk, atomic=True)
    return rel_l2(out, moe_gemm_torch(x, w, ids.flatten(), a_rows_div=topk))


_SPECIALIZATIONS = {
    # int4 quads, groups of 64 (scaled per weight), zero points, K padded to whole tiles; the
    # activation in the epilogue and GEMM2's sums zeroed on the side (the launch shape that once
    # failed only in the compiler), launched programmatically dependent
    "quads-store-act": (dict(GROUP=64, WTYPE=0, HAS_ZP=True, QUADS=True, BLOCK_K=128, BLOCK_N=256, ACT=2,
                             GATE_UP_CHUNK=32, ZERO_SIDE=True, HAS_BIAS=True, PDL=True, K_TAIL=True),
                        {"b_ptr": "*i16"}),
    # GEMM2 of many tokens: rows finished by their last contributor
    "quads-gemm2-last-arrival": (dict(GROUP=128, WTYPE=0, HAS_ZP=True, QUADS=True, BLOCK_K=128, SINK=2,
                                      MUL_ROUTED=True, REDUCE_TOPK=8, PDL=True), {"b_ptr": "*i16"}),
    "quads-last-arrival": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, POST_SCALE=True, SINK=2, ACT=4,
                                GATE_UP_CHUNK=32, DIRECT=True, HAS_MAP=True, SPLIT_K=4), {"b_ptr": "*i16"}),
    # one token's GEMM2: its weights prefetched into L2 before the wait, zero points g64 among them
    "quads-direct-prefetch": (dict(GROUP=64, WTYPE=0, HAS_ZP=True, QUADS=True, BLOCK_K=128, BLOCK_N=256, SINK=2,
                                   MUL_ROUTED=True, REDUCE_TOPK=8, DIRECT=True, HAS_MAP=True, SPLIT_K=2, PDL=True,
                                   PREFETCH_TILES=2), {"b_ptr": "*i16"}),
    "halves-atomic": (dict(GROUP=64, WTYPE=0, BLOCK_K=64, SINK=1, MUL_ROUTED=True, REDUCE_TOPK=8, BLOCK_M=64,
                           PDL=True, N_FIRST=True), {"b_ptr": "*u8"}),
    # an expert's last block over its valid half (the K loop built for both row counts), N tiles first
    "quads-narrow": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, BLOCK_M=64, BLOCK_N=256, ACT=1,
                                  GATE_UP_CHUNK=32, NARROW=True, N_FIRST=True, PDL=True), {"b_ptr": "*i16"}),
    # a full block taking in its expert's last 16 pairs, GEMM1 with the activation and GEMM2 finishing
    # its sums at the last arrival
    "quads-tail-act": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, BLOCK_M=32, BLOCK_N=256, ACT=1,
                            GATE_UP_CHUNK=32, N_FIRST=True, PDL=True, TAIL=16), {"b_ptr": "*i16"}),
    "quads-tail-last-arrival": (dict(GROUP=64, WTYPE=0, HAS_ZP=True, QUADS=True, BLOCK_K=128, BLOCK_M=64, SINK=2,
                                     MUL_ROUTED=True, REDUCE_TOPK=8, K_TAIL=True, NARROW=True, TAIL=32),
                                {"b_ptr": "*i16"}),
    "mxfp4-relu2": (dict(GROUP=32, WTYPE=3, CODE_OFFSET=0, BLOCK_K=64, ACT=5, BLOCK_N=256),
                    {"b_ptr": "*u8", "s_ptr": "*u8"}),
    # fp16 activations: the e2m1 values are scaled in fp32 first
    "mxfp4-fp16-unswapped": (dict(GROUP=32, WTYPE=3, CODE_OFFSET=0, BLOCK_K=64, SWAP_AB=False, SINK=1, SPLIT_K=2),
                             {"a_ptr": "*fp16", "b_ptr": "*u8", "s_ptr": "*u8"}),
    "int8-last-arrival": (dict(GROUP=128, WTYPE=1, CODE_OFFSET=128, BLOCK_K=128, SWAP_AB=False, SINK=2, ACT=1,
                               GATE_UP_CHUNK=32, DIRECT=True, REDUCE_TOPK=4), {"b_ptr": "*u8"}),
    "fp8-block-atomic": (dict(GROUP=1, WTYPE=2, A_SCALE=2, CODE_OFFSET=0, BLOCK_K=128, SWAP_AB=False, SINK=1,
                              SPLIT_K=2, BLOCK_M=64, ZERO_SIDE=True, N_FIRST=True),
                         {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "s_ptr": "*fp32"}),
    "fp8-row-store": (dict(GROUP=1, WTYPE=2, A_SCALE=1, CODE_OFFSET=0, BLOCK_K=128, SWAP_AB=False),
                      {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "s_ptr": "*fp32", "c_ptr": "*bf16"}),
}
_COMPILE_ALL = """
import json, sys
from moe_triton._details.offline import compile_quant_gemm
for name, (consts, pointers) in json.loads(sys.stdin.read()).items():
    ptx = compile_quant_gemm(consts, pointers).asm["ptx"]
    print(name, "wgmma" in ptx, "griddepcontrol.wait" in ptx, "cp.async.bulk.prefetch.L2" in ptx, flush=True)
"""


def test_gemm_compiles_for_hopper():
    """Triton's compiler on the kernel, which the interpreter never runs: one specialization per
    epilogue, weight type and layout, built for sm_90 by the installed Triton (in a child process,
    since this module interprets the kernels)."""
    stdout = run_compiler_script(_COMPILE_ALL, json.dumps(_SPECIALIZATIONS))
    built = {name: flags for name, *flags in map(str.split, stdout.splitlines())}
    assert set(built) == set(_SPECIALIZATIONS)
    for name, (consts, _) in _SPECIALIZATIONS.items():
        wgmma, waits, prefetches = (flag == "True" for flag in built[name])
        # The swapped 4-bit GEMMs feed Hopper's wgmma; int8 and fp8 may take unswapped tiles of 16 rows.
        assert wgmma or not consts.get("SWAP_AB", True), name
        assert waits == consts.get("PDL", False), name  # dependent launches wait for the kernel before
        assert prefetches == (consts.get("PREFETCH_TILES", 0) > 0), name


_WGMMA_SPECIALIZATIONS = {
    "gemm1-silu": ({}, {}),
    "gemm2-atomic": (dict(ATOMIC=True, ACT=0, GATE_UP_CHUNK=0, MUL_ROUTED=True, REDUCE_TOPK=8, A_ROWS_DIV=1,
                          ZERO_SIDE=False, STAGES=3), {"c_ptr": "*fp32"}),
    "gemm2-rows": (dict(ACT=0, GATE_UP_CHUNK=0, MUL_ROUTED=True, HAS_BIAS=True, A_ROWS_DIV=1, ZERO_SIDE=False),
                   {}),  # from ROWS_SUM_MIN_PAIRS pairs: bf16 rows, summed by a reduce after the GEMM
    "zero-points-g32": (dict(HAS_ZP=True, GROUP=32, BLOCK_M=64, BLOCK_N=128, STAGES=3), {}),
    "fp16-bias-k-tail": (dict(GROUP=64, K_TAIL=True, HAS_BIAS=True, ACT=4, SPLIT_K=2, BLOCK_N=128),
                         {"a_ptr": "*fp16", "s_ptr": "*fp16", "c_ptr": "*fp16"}),
    "relu2-channel": (dict(GROUP=4096, ACT=5, GATE_UP_CHUNK=0, BLOCK_M=16, BLOCK_N=128), {}),
    "tail8-gemm1-silu": (dict(TAIL=8), {}),
    "tail16-gemm2-atomic-k-tail": (dict(TAIL=16, ATOMIC=True, ACT=0, GATE_UP_CHUNK=0, MUL_ROUTED=True,
                                        REDUCE_TOPK=8, A_ROWS_DIV=1, ZERO_SIDE=False, STAGES=3, K_TAIL=True,
                                        GROUP=64), {"c_ptr": "*fp32"}),
}
_COMPILE_WGMMA = """
import json, sys
from moe_triton._details.offline import compile_wgmma_gemm
for name, (consts, pointers) in json.loads(sys.stdin.read()).items():
    ptx = compile_wgmma_gemm(consts, pointers).asm["ptx"]
    print(name, ptx.count("wgmma.mma_async"), ptx.count("wgmma.wait_group.sync.aligned 1;"),
          ptx.count("cp.async.mbarrier.arrive.noinc"), ptx.count("setmaxnreg"), flush=True)
"""


def test_wgmma_gemm_compiles_for_hopper():
    """The Gluon kernel built for sm_90 by the installed Triton: warp-specialized (registers moved
    between partitions, copies completing on mbarriers), each consumer's quarter MMAs asynchronous
    with one in flight at each of its four waits per 128-wide tile."""
    stdout = run_compiler_script(_COMPILE_WGMMA, json.dumps(_WGMMA_SPECIALIZATIONS))
    built = {name: tuple(map(int, counts)) for name, *counts in map(str.split, stdout.splitlines())}
    assert set(built) == set(_WGMMA_SPECIALIZATIONS)
    for name, (mmas, waits, copy_arrivals, setmaxnreg) in built.items():
        # Two consumers (the default partition and a worker) run the same loop; with 128-pair blocks
        # (copies folded into the consumers) each has a second one for blocks of at most 64 valid pairs,
        # and with TAIL a third one, two MMAs per quarter (block and tail) that it waits for (wait 0).
        loops = 2 * (2 if _WGMMA_SPECIALIZATIONS[name][0].get("BLOCK_M", 128) == 128 else 1)
        tail_loops = 2 if _WGMMA_SPECIALIZATIONS[name][0].get("TAIL", 0) else 0
        assert mmas >= 4 * loops + 8 * tail_loops and waits == 4 * loops, (name, mmas, waits)
        assert copy_arrivals >= 1 and setmaxnreg >= 3, (name, copy_arrivals, setmaxnreg)


def _wgmma(block_m: int, block_n: int, stages: int, split: int = 1) -> GemmConfig:
    return GemmConfig(block_m, block_n, split, 4, stages, swap_ab=True, wgmma=True)


def test_wgmma_config_limits():
    assert _wgmma(128, 256, 3).wgmma
    for bad in (dict(swap_ab=False), dict(block_m=256), dict(num_stages=2), dict(block_n=64),
                dict(num_warps=8)):
        with pytest.raises(ValueError, match="the wgmma kernel takes"):
            dataclasses.replace(_wgmma(128, 128, 3), **bad)


def test_tail_limits():
    assert dataclasses.replace(_wgmma(128, 256, 4), tail=16).tail == 16
    for bad in (dict(tail=4), dict(tail=8, block_m=64), dict(tail=32)):
        with pytest.raises(ValueError, match=r"tail \(8 or 16 pairs taken in by the block before\) is an option "
                                             r"of the wgmma kernel"):
            dataclasses.replace(_wgmma(128, 256, 4), **bad)
    assert GemmConfig(32, 128, 1, 4, 3, swap_ab=True, tail=16).tail == 16
    for bad in (dict(tail=8), dict(tail=32), dict(tail=16, block_m=16), dict(tail=16, swap_ab=False)):
        with pytest.raises(ValueError, match=r"tail \(16 or 32 pairs taken in by the block before\) is an option "
                                             r"of the swapped tl.dot kernel"):
            dataclasses.replace(GemmConfig(32, 128, 1, 4, 3, swap_ab=True), **bad)
    cands = quant_candidates(QuantKernelConfig(_wgmma(128, 256, 4), _wgmma(128, 256, 4)))
    assert cands["tail8"].gemm1.tail == cands["tail8"].gemm2.tail == 8 and cands["tail16"].gemm2.tail == 16
    assert "tail32" not in cands
    assert "tail8" not in quant_candidates(QuantKernelConfig(_wgmma(64, 256, 4), _wgmma(64, 256, 4)))
    tl_dot = GemmConfig(32, 256, 1, 4, 3, swap_ab=True)
    cands = quant_candidates(QuantKernelConfig(tl_dot, tl_dot))
    assert cands["tail16"].gemm1.tail == cands["tail16"].gemm2.tail == 16 and "tail8" not in cands
    assert "tail32" not in cands  # below block_m only
    wide = dataclasses.replace(tl_dot, block_m=64)
    assert quant_candidates(QuantKernelConfig(wide, wide))["tail32"].gemm2.tail == 32


def test_wgmma_grid_fits_hopper_shared_memory():
    for name, cand in wgmma_grid().items():
        t = cand.gemm1
        assert cand.gemm2 == t and t.wgmma
        ring = t.num_stages * (t.block_m * 128 * 2 + t.block_n * 32 * 2 + t.block_n * 2)  # x, words, scales
        assert ring <= 227 * 1024, name


def _int4_bf16_layer(seed: int):
    """A small bf16 int4 (group 128) layer with its weights, and 16 routed tokens."""
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, dtype=torch.bfloat16)
    q = int4_w4a16(128)
    experts = TritonWna16Experts(cfg, q, RUN_ON)
    weights = ExpertWeights.random(cfg, q, seed=seed, device=DEV)
    experts.load_weights(weights)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(16, 256, generator=gen).to(torch.bfloat16).to(DEV)
    tw, ids = route_torch(torch.randn(16, 4, generator=gen).to(DEV), cfg.routing, 2)
    return experts, weights, x, tw, ids


def test_wgmma_gemm_is_refused_off_hopper():
    """On CPU (and any GPU but sm_90) a forced wgmma launch fails with the reason."""
    if wgmma_capable(DEV):
        pytest.skip("this GPU runs the wgmma kernel")
    experts, _, x, tw, ids = _int4_bf16_layer(3)
    experts.config_override = QuantKernelConfig(_wgmma(64, 128, 3), _wgmma(64, 128, 3))
    with pytest.raises(ValueError, match="needs an NVIDIA Hopper GPU"):
        experts.apply(x, tw, ids)


def test_wgmma_entries_of_another_device_run_as_tl_dot(tmp_path, monkeypatch):
    """A tuned file from a Hopper GPU that asks for the wgmma kernel runs its GEMMs as tl.dot ones
    elsewhere, and the lookup says so."""
    if wgmma_capable(DEV):
        pytest.skip("this GPU runs the wgmma kernel")
    experts, weights, x, tw, ids = _int4_bf16_layer(4)
    hopper_key = dataclasses.replace(experts.config_key, device="NVIDIA_H100_80GB_HBM3")
    tails = (dataclasses.replace(_wgmma(128, 256, 3), tail=8), dataclasses.replace(_wgmma(128, 128, 4), tail=16))
    configs.write_configs(hopper_key, {16: QuantKernelConfig(_wgmma(64, 128, 3), _wgmma(64, 128, 3)),
                                       64: QuantKernelConfig(*tails)}, tmp_path)
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    configs.reload()
    try:
        hit = experts.config_for(16)
        assert hit.source == "other-device" and hit.detail.endswith("wgmma off (not an sm_90 GPU)")
        assert hit.config == QuantKernelConfig(GemmConfig(64, 128, 1, 4, 3, True), GemmConfig(64, 128, 1, 4, 3, True))
        # An 8-pair tail (below the tl.dot kernel's 16) goes; a 16-pair one stays.
        as_tl_dot = experts.config_for(64).config
        assert as_tl_dot == QuantKernelConfig(GemmConfig(128, 256, 1, 4, 3, True),
                                              GemmConfig(128, 128, 1, 4, 4, True, tail=16))
        cfg = experts.config
        ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, experts.quant, cfg.expert_map(DEV))
        assert rel_l2(experts.apply(x, tw, ids), ref) < 1e-2
        experts.config_override = as_tl_dot  # the converted tiles run too
        assert rel_l2(experts.apply(x, tw, ids), ref) < 1e-2
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


@pytest.mark.device("cuda")
@pytest.mark.parametrize(("quant", "dtype", "K", "N", "activation", "bias", "M", "launch"), [
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 512,
                 QuantKernelConfig(_wgmma(64, 128, 4), _wgmma(64, 128, 4)), id="g128-silu-64x128"),
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 2048,
                 QuantKernelConfig(_wgmma(128, 256, 3), _wgmma(128, 256, 3)), id="g128-silu-128x256"),
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 700,
                 QuantKernelConfig(_wgmma(128, 256, 4), _wgmma(128, 128, 4)), id="g128-128x256-128x128"),
    pytest.param(int4_w4a16(64, zero_point=True), torch.bfloat16, 2880, 2880, Activation.swiglu_oai(), True, 300,
                 QuantKernelConfig(_wgmma(128, 128, 3), _wgmma(128, 256, 3)), id="g64-zp-bias-k-tail"),
    pytest.param(int4_w4a16(32), torch.float16, 1024, 512, Activation.gelu(), False, 300,
                 QuantKernelConfig(_wgmma(64, 256, 4, split=2), _wgmma(64, 128, 3, split=2)), id="g32-fp16-split"),
    pytest.param(int4_w4a16(-1, zero_point=True), torch.float16, 1024, 512, Activation.relu2(), False, 200,
                 QuantKernelConfig(_wgmma(16, 128, 3), _wgmma(16, 256, 3)), id="channel-zp-relu2"),
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 400,
                 QuantKernelConfig(_wgmma(64, 128, 4), GemmConfig(64, 256, 1, 4, 3, True)), id="gemm1-only"),
])
def test_wgmma_gemm_on_gpu(quant, dtype, K, N, activation, bias, M, launch):
    out, ref = _run(TritonWna16Experts, quant, activation, dtype, K=K, N=N, E=16, topk=4, M=M, bias=bias,
                    override=launch)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.device("cuda")
def test_wgmma_narrow_and_full_blocks_on_gpu():
    """128-pair blocks run their MMAs over 64 rows when at most 64 are valid (an expert's last block):
    experts with exactly 64, 65, 128, 129 and 1 pairs put blocks on both sides of that boundary."""
    counts = [64, 65, 1, 128, 129, 0, 192, 63]
    launch = QuantKernelConfig(_wgmma(128, 256, 3), _wgmma(128, 128, 4))
    out, ref = _routed_counts_layer(counts, int4_w4a16(128), launch, K=1024, N=512, dtype=torch.bfloat16)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.device("cuda")
@pytest.mark.parametrize("tail", [8, 16])
def test_wgmma_tail_blocks_on_gpu(tail):
    """A full block takes in its expert's last block when that holds at most `tail` pairs: experts
    with 1, tail and tail + 1 pairs past one or two full blocks, a lone short block, an expert with
    none between; as the reference and as the launch without it."""
    counts = [129, 128 + tail, 129 + tail, 0, 256 + tail, 5, 128, 257, 128 + tail // 2]
    plain = QuantKernelConfig(_wgmma(128, 256, 3), _wgmma(128, 128, 4))
    taking = QuantKernelConfig(dataclasses.replace(plain.gemm1, tail=tail), dataclasses.replace(plain.gemm2, tail=tail))
    out, ref = _routed_counts_layer(counts, int4_w4a16(128), taking, K=1024, N=512, dtype=torch.bfloat16)
    assert rel_l2(out, ref) < 1e-2
    whole, _ = _routed_counts_layer(counts, int4_w4a16(128), plain, K=1024, N=512, dtype=torch.bfloat16)
    torch.testing.assert_close(out, whole, rtol=1e-3, atol=1e-3)


@pytest.mark.device("cuda")
def test_wgmma_gemm_with_expert_parallel_on_gpu():
    out, ref = _run(TritonWna16Experts, int4_w4a16(128), Activation.silu(), torch.bfloat16, K=1024, N=512, E=16,
                    topk=4, M=300, parallel=ParallelConfig(ep_size=2, ep_rank=1),
                    override=QuantKernelConfig(_wgmma(64, 128, 3), _wgmma(64, 128, 3)))
    assert rel_l2(out, ref) < 1e-2


def test_int4_gemm_refuses_unswapped():
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64, dtype=torch.float16)
    experts = TritonWna16Experts(cfg, int4_w4a16(64), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, int4_w4a16(64), seed=1, device=DEV))
    experts.config_override = QuantKernelConfig(GemmConfig(16, 64, 1, 4, 2), GemmConfig(16, 64, 1, 4, 2))
    x = torch.randn(3, 128, dtype=torch.float16, device=DEV)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="int4 weights run swapped only"):
        experts.apply(x, torch.rand(3, 2, device=DEV), ids)


@pytest.mark.parametrize(("qmode", "chunk"), [(QMode.NONE, 0), (QMode.NONE, GATE_UP_CHUNK), (QMode.TOKEN, 0),
                                           (QMode.GROUP128, 0), (QMode.TENSOR, 0)])
def test_act_quant_matches_twin(qmode, chunk):
    rows, pexp = 6, torch.tensor([0, 1, 1, -1, 0, 2], dtype=torch.int32, device=DEV)
    h = torch.randn(rows, 512, device=DEV) * 3
    act = Activation.gelu_tanh()
    dt = torch.float16 if qmode is QMode.NONE else torch.float8_e4m3fn
    y, s = act_quant(h, act, qmode, dt, rows, 1, pexp, 3, gate_up_chunk=chunk)
    yt, st = act_quant_torch(h, act, qmode, dt, rows, 1, pexp, 3, gate_up_chunk=chunk)
    if chunk:  # the twin de-interleaves with the processor's row order
        from moe_core.reference import apply_activation
        from moe_triton._details.quant_act import interleaved_gate_up_rows

        canonical = torch.empty_like(h)
        canonical[:, interleaved_gate_up_rows(256, chunk, DEV)] = h
        torch.testing.assert_close(yt.float(), apply_activation(canonical, act).half().float())
    keep = pexp >= 0
    if s is not None:
        torch.testing.assert_close(s[keep], st[keep], rtol=1e-6, atol=0)
    assert rel_l2(y.float()[keep], yt.float()[keep]) < 1e-3


@pytest.mark.device("cuda")
@pytest.mark.parametrize(("quant", "K", "N", "activation"), [
    (int4_w4a16(128), 2048, 768, Activation.silu()),
    (int4_w4a16(64, zero_point=True), 2880, 2880, Activation.swiglu_oai()),
    (int8_w8a16(-1), 2048, 768, Activation.silu()),
    (fp8_w8a8("block"), 2048, 768, Activation.silu()),
    (fp8_w8a8("channel"), 2048, 768, Activation.silu()),
    (mxfp4_w4a16(), 2880, 2880, Activation.swiglu_oai()),
])
@pytest.mark.parametrize("M", [1, 64, 1024, 4096])  # 4096 x top-4: GEMM2 stores rows (ROWS_SUM_MIN_PAIRS)
def test_real_shapes_on_gpu(quant, K, N, activation, M):
    cls = {"int4": TritonWna16Experts, "int8": TritonWna16Experts, "fp8e4m3": TritonFp8Experts,
           "fp4e2m1": TritonMxfp4Experts}[quant.weight.dtype.value]
    out, ref = _run(cls, quant, activation, torch.bfloat16, K=K, N=N, E=32, topk=4, M=M,
                    bias=activation.kind.value == "swiglu_oai")
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.device("cuda")
@pytest.mark.parametrize("M", [1024, 2048])
def test_top8_stored_rows_on_gpu(M):
    """Top-8 layers store GEMM2's rows from ROWS_SUM_MIN_PAIRS_TOP8 pairs (1024 tokens), below the
    other layers' ROWS_SUM_MIN_PAIRS; the qwen3-30b-a3b shape."""
    from moe_triton import quantized

    assert quantized.ROWS_SUM_MIN_PAIRS_TOP8 <= M * 8
    out, ref = _run(TritonWna16Experts, int4_w4a16(128), Activation.silu(), torch.bfloat16, K=2048, N=768, E=128,
                    topk=8, M=M)
    assert rel_l2(out, ref) < 1e-2


def test_quant_config_records_and_exact_lookup(tmp_path, monkeypatch):
    g16 = GemmConfig(16, 64, 2, 4, 3, swap_ab=True)
    with pytest.raises(ValueError, match="powers of two"):
        GemmConfig(24, 64, 1, 4, 3)
    with pytest.raises(ValueError, match="share one block_m"):
        QuantKernelConfig(g16, GemmConfig(32, 64, 1, 4, 3))
    key = ConfigKey("wna16-int4-g128", 4, 64, 128, 2, "float16", "GPU_A")
    table = {1: QuantKernelConfig(g16, g16), 64: QuantKernelConfig(GemmConfig(32, 128, 1, 8, 4), GemmConfig(32, 64, 1, 4, 4))}
    configs.write_configs(key, table, tmp_path)
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    configs.reload()
    try:
        hit = configs.lookup_exact(key, 3)
        assert (hit.config, hit.source, hit.detail) == (table[1], "tuned", f"{key.file_name()} at M=1")
        other = configs.lookup_exact(dataclasses.replace(key, device="GPU_B"), 100)
        assert (other.config, other.source) == (table[64], "other-device")
        assert configs.lookup_exact(dataclasses.replace(key, hidden=256), 1) is None
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


def test_quant_candidates_are_distinct_neighbours():
    base = QuantKernelConfig(GemmConfig(16, 128, 4, 4, 4, True), GemmConfig(16, 64, 8, 4, 4, True))
    cands = quant_candidates(base)
    assert next(iter(cands.items())) == ("heuristic", base)
    assert len(set(cands.values())) == len(cands)
    assert "block_m/2" not in cands  # 8 rows per block is not a valid MMA tile
    assert cands["split*2"] == QuantKernelConfig(dataclasses.replace(base.gemm1, split_k=8),
                                                 dataclasses.replace(base.gemm2, split_k=16))
    assert cands["stages-1"] == QuantKernelConfig(dataclasses.replace(base.gemm1, num_stages=3),
                                                  dataclasses.replace(base.gemm2, num_stages=3))
    assert all(c.gemm1.swap_ab and c.gemm2.swap_ab for c in cands.values())  # int4 runs swapped only
    assert "narrow" not in cands  # narrow blocks have 32 pairs or more
    wider = quant_candidates(QuantKernelConfig(dataclasses.replace(base.gemm1, block_m=32),
                                               dataclasses.replace(base.gemm2, block_m=32)))
    assert wider["narrow"].gemm2 == dataclasses.replace(base.gemm2, block_m=32, narrow=True)


def test_wna16_takes_a_tuned_file_of_its_shape(tmp_path, monkeypatch):
    """config_for: the heuristic without a file; a tuned file's entry once one exists (and the layer
    still matches the reference with it); schemes without a tuned family always use the heuristic."""
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128, dtype=torch.float16)
    q = int4_w4a16(64, zero_point=True)
    experts = TritonWna16Experts(cfg, q, RUN_ON)
    weights = ExpertWeights.random(cfg, q, seed=7, device=DEV)
    experts.load_weights(weights)
    assert experts.config_key.kernel == "wna16-int4-g64-zp"
    assert experts.config_for(5).source == "default"
    tuned = QuantKernelConfig(GemmConfig(32, 64, 2, 4, 2, swap_ab=True), GemmConfig(32, 32, 1, 4, 2, swap_ab=True))
    configs.write_configs(experts.config_key, {4: tuned}, tmp_path)
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    configs.reload()
    try:
        fresh = TritonWna16Experts(cfg, q, RUN_ON)
        fresh.load_weights(weights)
        hit = fresh.config_for(5)
        assert (hit.config, hit.source) == (tuned, "tuned")
        gen = torch.Generator().manual_seed(8)
        x = torch.randn(5, 128, generator=gen).to(torch.float16).to(DEV)
        tw, ids = route_torch(torch.randn(5, 4, generator=gen).to(DEV), cfg.routing, 2)
        ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, q, cfg.expert_map(DEV))
        assert rel_l2(fresh.apply(x, tw, ids), ref) < 1e-2
        fp8 = TritonFp8Experts(cfg, fp8_w8a8("tensor"), RUN_ON)
        assert fp8.config_key is None
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


def _tuner_experts() -> TritonWna16Experts:
    """A small fp16 int4 (group 64) layer with random weights, for the tuner's search."""
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64, dtype=torch.float16)
    experts = TritonWna16Experts(cfg, int4_w4a16(64), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, int4_w4a16(64), seed=9, device=DEV))
    return experts


def test_int4_tuner_keeps_the_fastest_candidate():
    """The search and its record, with a stand-in timer (the real one replays CUDA graphs)."""
    experts = _tuner_experts()
    runs = []
    base = experts.heuristic_config(3)

    def timer(layer, rep_ms):
        out = layer()  # the candidate really runs
        assert torch.isfinite(out).all()
        cand = experts.config_override
        runs.append(cand)
        # More splits help most, one stage fewer a little: found only from the first step's winner.
        return (2.0 - 1.0 * (cand.gemm1.split_k > base.gemm1.split_k)
                - 0.5 * (cand.gemm1.num_stages < base.gemm1.num_stages))

    table, measured = _tune_int4_layer(experts, [3], 5, lambda s: None, timer=timer)
    first = quant_candidates(base)
    second = [c for c in quant_candidates(first["split*2"]).values() if c not in first.values()]
    assert runs == list(first.values()) + second and experts.config_override is None
    best = QuantKernelConfig(dataclasses.replace(first["split*2"].gemm1, num_stages=base.gemm1.num_stages - 1),
                             dataclasses.replace(first["split*2"].gemm2, num_stages=base.gemm2.num_stages - 1))
    assert table[3] == best and measured["3"]["best"] == "split*2+stages-1"
    assert measured["3"]["layer_us"]["heuristic"] == 2.0 and measured["3"]["layer_us"]["split*2"] == 1.0
    assert "shipped" not in measured["3"]  # no file holds this shape


@pytest.mark.parametrize("shipped_as", ["split*2", "shipped"])
def test_int4_tuner_records_the_shipped_configuration(monkeypatch, shipped_as):
    """The shipped configuration is timed once: under its own name, or under the candidate it equals."""
    import moe_triton.tune as tune

    experts = _tuner_experts()
    base = experts.heuristic_config(3)
    split = quant_candidates(base)["split*2"]
    shipped = split if shipped_as == "split*2" else dataclasses.replace(
        base, gemm2=dataclasses.replace(base.gemm2, block_n=base.gemm2.block_n // 2))
    monkeypatch.setattr(tune, "lookup_exact", lambda key, m: configs.Lookup(shipped, "tuned", "a file"))
    times = {}

    def timer(layer, rep_ms):
        times[experts.config_override] = 2.0 - (experts.config_override == shipped)
        return times[experts.config_override]

    logged = []
    table, measured = _tune_int4_layer(experts, [3], 5, logged.append, timer=timer)
    assert list(times.values()).count(1.0) == 1 and table[3] == shipped
    assert measured["3"]["shipped"] == shipped_as and measured["3"]["best"] == shipped_as
    assert f"shipped ({shipped_as}) 1.0" in logged[-1]


def test_per_gemm_grid_changes_one_gemm_at_a_time():
    base = QuantKernelConfig(GemmConfig(16, 128, 4, 4, 3, True), GemmConfig(16, 256, 1, 8, 4, True))
    grid = per_gemm_grid(base)
    assert len(grid) == 2 * 4 * 3 * 2 - 2 and base not in grid.values()  # the base itself once per GEMM
    assert len(set(grid.values())) == len(grid)
    for name, cand in grid.items():
        changed, kept = ("gemm1", "gemm2") if name.startswith("gemm1:") else ("gemm2", "gemm1")
        assert getattr(cand, kept) == getattr(base, kept)
        tile, was = getattr(cand, changed), getattr(base, changed)
        assert (tile.block_m, tile.num_stages, tile.swap_ab) == (was.block_m, was.num_stages, was.swap_ab)


def test_int4_tuner_times_wgmma_tiles_only_where_the_layer_can_run_them():
    """Up to LAST_ARRIVAL_MAX_TOKENS tokens the layer's GEMMs are direct or finished by their last
    contributor, which the wgmma kernel refuses: its tiles are not candidates there."""
    experts = _tuner_experts()
    timed = []

    def timer(layer, rep_ms):
        timed.append(experts.config_override)
        return 1.0

    few, many = LAST_ARRIVAL_MAX_TOKENS, LAST_ARRIVAL_MAX_TOKENS + 1
    _, measured = _tune_int4_layer(experts, [few, many], 5, lambda s: None, timer=timer, wgmma=True)
    assert not any(k.startswith("wgmma:") for k in measured[str(few)]["layer_us"])
    assert {k for k in measured[str(many)]["layer_us"] if k.startswith("wgmma:")} == set(wgmma_grid())
    assert sum(c.gemm1.wgmma for c in timed) == len(wgmma_grid())


def test_int4_tuner_per_gemm_finds_a_one_gemm_change():
    """With --per-gemm a change to GEMM2 alone, which no both-GEMM neighbour makes, is found."""
    experts = _tuner_experts()
    base = experts.heuristic_config(1)

    def timer(layer, rep_ms):
        cand = experts.config_override
        return 2.0 - (cand.gemm2.block_n == 64 and cand.gemm2.split_k == 2 and cand.gemm1 == base.gemm1)

    table, measured = _tune_int4_layer(experts, [1], 5, lambda s: None, timer=timer, per_gemm=True)
    assert table[1] == QuantKernelConfig(base.gemm1, dataclasses.replace(base.gemm2, block_n=64, split_k=2))
    assert measured["1"]["best"] == f"heuristic+gemm2:split=2,block_n=64,warps={base.gemm2.num_warps}"


@pytest.mark.parametrize(("gpu", "tag"), [("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
                                         ("NVIDIA H200", "NVIDIA_H200")])
@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"])
def test_shipped_int4_configs_cover_the_presets(preset, gpu, tag):
    """Each preset's int4 layer (its usual group size) finds launch shapes tuned on that GPU at every
    benchmarked token count."""
    from moe_core.presets import get_preset

    p = get_preset(preset)
    cfg = p.config
    family = f"wna16-int4-g{p.int4_group_size}"
    key = ConfigKey(family, cfg.num_experts, cfg.intermediate_size, cfg.hidden_size, cfg.top_k, "bfloat16", tag)
    device = DeviceInfo(Platform.CUDA, 0, gpu, (9, 0))
    assert TritonWna16Experts(cfg, int4_w4a16(p.int4_group_size), device).config_key == key
    for m in (1, 8, 32, 128, 512, 2048, 8192):
        hit = configs.lookup_exact(key, m)
        assert (hit.source, hit.detail) == ("tuned", f"{key.file_name()} at M={m}")
        assert isinstance(hit.config, QuantKernelConfig)


def _shipped_int4_shapes() -> list[tuple[str, int, QuantKernelConfig, str]]:
    """(preset, M, config, device tag of the first file holding it) for each distinct launch shape of a
    preset in the int4 files found (shipped, and those in $MOE_TRITON_CONFIG_DIR: a tuning run's output
    can be checked before it ships)."""
    found, seen = [], set()
    for key, (_, table) in sorted(configs._load().items(), key=lambda kv: kv[0].file_name()):
        if not key.kernel.startswith("wna16-int4-"):
            continue
        preset = next(p for p in PRESETS.values() if p.name != "tiny" and (
            p.config.num_experts, p.config.intermediate_size, p.config.hidden_size, p.config.top_k)
            == (key.num_experts, key.intermediate, key.hidden, key.top_k))
        for m in sorted(table):
            if (preset.name, table[m]) not in seen:
                seen.add((preset.name, table[m]))
                found.append((preset.name, m, table[m], key.device))
    return found


@pytest.mark.device("cuda")
@pytest.mark.parametrize(("preset", "M", "tuned"),
                         [pytest.param(p, m, c, id=f"{p}-{dev}-M{m}") for p, m, c, dev in _shipped_int4_shapes()])
def test_shipped_int4_shapes_on_gpu(preset, M, tuned):
    """Every launch shape the tuned files ship, at the preset's N, K, group, activation and bias,
    against the reference. Fewer experts (16, or the preset's 8) keep the fp32 reference in
    memory; at most 2048 tokens still give each expert more rows than the widest block."""
    p = get_preset(preset)
    E = min(p.config.num_experts, 16)
    quant = int4_w4a16(p.int4_group_size)
    cfg = dataclasses.replace(p.config, num_experts=E, dtype=torch.bfloat16)
    weights = ExpertWeights.random(cfg, quant, seed=M, device=DEV)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    experts.load_weights(weights)
    experts.config_override = tuned
    M = min(M, 2048)
    gen = torch.Generator().manual_seed(M + 1)
    x = torch.randn(M, cfg.hidden_size, generator=gen).to(torch.bfloat16).to(DEV)
    bias = torch.randn(E, generator=gen).to(DEV) * 0.1 if cfg.routing.has_correction_bias else None
    tw, ids = route_torch(torch.randn(M, E, generator=gen).to(DEV), cfg.routing, cfg.top_k, bias)
    ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert rel_l2(experts.apply(x, tw, ids), ref) < 1e-2
