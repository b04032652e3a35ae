"""The one-launch decode kernel (`moe_triton.fused_decode`) against its torch twin, the layer's own
two-GEMM path and moe-core's fp32 reference, on fresh random weights and tokens."""

import dataclasses

import pytest
import torch
from _quant_support import DEV, RUN_ON, rel_l2

from moe_core.config import Activation, MoEConfig, Routing, Scoring
from moe_core.quant import int4_w4a16, int8_w8a16, mxfp4_w4a16
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton._common.offline_compile import run_compiler_script
from moe_triton.configs import FusedDecodeConfig, GemmConfig, QuantKernelConfig
from moe_triton.fused_decode import MAX_TOKENS, FusedDecode, fused_decode_torch, unsupported_reason
from moe_triton.quantized import TritonMxfp4Experts, TritonWna16Experts
from moe_triton.routing import route
from moe_triton.tune import FUSED_OPTIONS


def _layer(quant, dtype=torch.float16, K=256, N=256, E=4, topk=2, seed=0, cls=TritonWna16Experts, **cfg_extra):
    cfg = MoEConfig(num_experts=E, top_k=topk, hidden_size=K, intermediate_size=N, dtype=dtype, **cfg_extra)
    weights = ExpertWeights.random(cfg, quant, seed=seed, device=DEV)
    experts = cls(cfg, quant, RUN_ON)
    experts.load_weights(weights)
    return cfg, weights, experts


def _tokens(cfg, M, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, cfg.hidden_size, generator=gen).to(cfg.dtype).to(DEV)
    tw, ids = route_torch(torch.randn(M, cfg.num_experts, generator=gen).to(DEV), cfg.routing, cfg.top_k)
    return x, tw, ids


@pytest.mark.parametrize(("quant", "dtype", "M"), [
    (int4_w4a16(128), torch.float16, 1),
    (int4_w4a16(64), torch.bfloat16, 1),
    (int4_w4a16(32), torch.float16, 3),
    (int4_w4a16(-1), torch.float16, 1),
    (int8_w8a16(), torch.bfloat16, 2),
    (int8_w8a16(128), torch.float16, 1),
    (mxfp4_w4a16(), torch.bfloat16, 1),
    (mxfp4_w4a16(), torch.bfloat16, 4),
])
def test_fused_decode_matches_its_twin_the_layer_and_the_reference(quant, dtype, M):
    cls = TritonMxfp4Experts if quant.weight.dtype.value == "fp4e2m1" else TritonWna16Experts
    cfg, weights, experts = _layer(quant, dtype=dtype, seed=M, cls=cls)
    x, tw, ids = _tokens(cfg, M, seed=10 + M)
    fused = FusedDecode(experts)
    out = fused(x, tw, ids)
    assert out.shape == (M, cfg.hidden_size) and out.dtype == dtype
    # The CPU interpreter truncates fp32 -> bf16 casts (the kernel's activation and output) where the
    # twin rounds to nearest: bf16 agrees to that rounding, fp16 bit for bit.
    twin_tol = 1e-2 if dtype == torch.bfloat16 and DEV.type == "cpu" else 2e-3
    assert rel_l2(out, fused_decode_torch(experts, x, tw, ids)) < twin_tol
    assert rel_l2(out, experts.apply(x, tw, ids)) < 1e-2
    ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert rel_l2(out, ref) < 1e-2
    # The scratch is left zeroed: a second call on other tokens is as exact as the first.
    x2, tw2, ids2 = _tokens(cfg, M, seed=20 + M)
    assert rel_l2(fused(x2, tw2, ids2), fused_decode_torch(experts, x2, tw2, ids2)) < twin_tol


@pytest.mark.parametrize(("quant", "dtype"), [(int4_w4a16(64), torch.float16), (int8_w8a16(), torch.float16),
                                             (mxfp4_w4a16(), torch.bfloat16)])
def test_slices_of_64_channels_give_the_same_output(quant, dtype):
    """Programs of 64 intermediate channels (twice as many, each reading its whole w2 tile and
    multiplying the other half by zeros) compute what programs of 128 do."""
    cls = TritonMxfp4Experts if quant.weight.dtype.value == "fp4e2m1" else TritonWna16Experts
    cfg, _, experts = _layer(quant, dtype=dtype, seed=7, cls=cls)
    x, tw, ids = _tokens(cfg, 2, seed=8)
    narrow = FusedDecode(experts, channels=64, num_warps=8, block_h=64)(x, tw, ids)
    twin_tol = 1e-2 if dtype == torch.bfloat16 and DEV.type == "cpu" else 2e-3
    assert rel_l2(narrow, fused_decode_torch(experts, x, tw, ids)) < twin_tol
    assert rel_l2(narrow, FusedDecode(experts)(x, tw, ids)) < twin_tol


@pytest.mark.parametrize(("quant", "dtype", "k_split", "channels"), [
    (int4_w4a16(128), torch.float16, 2, 128),
    (int4_w4a16(64), torch.float16, 4, 64),
    (int8_w8a16(), torch.float16, 8, 128),
    (mxfp4_w4a16(), torch.bfloat16, 4, 128),
])
def test_programs_sharing_a_slice_s_k_tiles_give_the_same_output(quant, dtype, k_split, channels):
    """GEMM1 split over k_split programs a slice (K = 384: three K tiles, so with 4 or 8 some programs
    get none), their partial sums met at L2 and finished by the last to arrive: the twin's output,
    routed by the caller and in the launch, and again on other tokens (the scratch left zeroed)."""
    cls = TritonMxfp4Experts if quant.weight.dtype.value == "fp4e2m1" else TritonWna16Experts
    cfg, _, experts = _layer(quant, dtype=dtype, K=384, E=8, topk=4, seed=9, cls=cls)
    fused = FusedDecode(experts, channels=channels, k_split=k_split)
    twin_tol = 1e-2 if dtype == torch.bfloat16 and DEV.type == "cpu" else 2e-3
    for seed in (31, 32):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(3, cfg.hidden_size, generator=gen).to(dtype).to(DEV)
        logits = torch.randn(3, cfg.num_experts, generator=gen).to(DEV)
        tw, ids = route(logits, cfg.routing, cfg.top_k)
        out = fused(x, tw, ids)
        assert rel_l2(out, fused_decode_torch(experts, x, tw, ids)) < twin_tol
        assert rel_l2(fused.from_logits(x, logits), out) < 1e-3  # the sums' order may differ: bf16/fp16 ulps


@pytest.mark.parametrize(("quant", "channels", "k_split"), [(mxfp4_w4a16(), 128, 1), (mxfp4_w4a16(), 64, 2),
                                                         (int4_w4a16(32), 128, 1), (int8_w8a16(), 128, 1),
                                                         (int8_w8a16(), 64, 2)])
def test_gpt_oss_layers_with_biases_and_a_half_slice(quant, channels, k_split):
    """gpt-oss's clamped SwiGLU with biases, K = 192 and N = 96 that 128 does not divide (K padded to
    whole tiles; with 128 channels a program the one slice is half empty), against the twin, the layer
    and the fp32 reference."""
    cls = TritonMxfp4Experts if quant.weight.dtype.value == "fp4e2m1" else TritonWna16Experts
    cfg, weights, experts = _layer(quant, dtype=torch.bfloat16, K=192, N=96, seed=11, cls=cls, has_bias=True,
                                   activation=Activation.swiglu_oai(alpha=1.702, limit=7.0))
    assert unsupported_reason(experts) is None
    x, tw, ids = _tokens(cfg, 2, seed=12)
    out = FusedDecode(experts, channels=channels, k_split=k_split)(x, tw, ids)
    twin_tol = 1e-2 if DEV.type == "cpu" else 2e-3  # bf16: the interpreter truncates its casts
    assert rel_l2(out, fused_decode_torch(experts, x, tw, ids)) < twin_tol
    assert rel_l2(out, experts.apply(x, tw, ids)) < 1e-2
    ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert rel_l2(out, ref) < 2e-2


def test_fused_decode_sums_every_choice_of_every_token():
    """Eight tokens, top-4 of 8 experts (K = 384: three K tiles), against the layer."""
    cfg, _, experts = _layer(int4_w4a16(128), K=384, N=128, E=8, topk=4, seed=3)
    x, tw, ids = _tokens(cfg, MAX_TOKENS, seed=4)
    out = FusedDecode(experts)(x, tw, ids)
    assert rel_l2(out, experts.apply(x, tw, ids)) < 1e-2


@pytest.mark.parametrize("routing", [
    Routing.softmax_topk(renormalize=True),
    Routing.softmax_topk(renormalize=False),
    Routing(scoring=Scoring.SIGMOID, renormalize=True, renormalize_eps=1e-20, num_expert_groups=4, topk_groups=2,
            has_correction_bias=True, routed_scaling_factor=2.5),
])
def test_routing_in_the_launch_is_the_router_s(routing):
    """from_logits routes each token in the kernel with the router's own code: the same output, bit
    for bit, as the router's weights and ids handed to the kernel (DeepSeek-V3's grouped sigmoid with
    its correction bias and scaling among them)."""
    cfg, _, experts = _layer(int4_w4a16(64), E=8, topk=2, seed=5, routing=routing)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(3, cfg.hidden_size, generator=gen).to(cfg.dtype).to(DEV)
    logits = torch.randn(3, cfg.num_experts, generator=gen).to(DEV)
    bias = torch.randn(cfg.num_experts, generator=gen).to(DEV) * 0.1 if routing.has_correction_bias else None
    fused = FusedDecode(experts)
    tw, ids = route(logits, routing, cfg.top_k, bias)
    assert torch.equal(fused.from_logits(x, logits, bias), fused(x, tw, ids))
    ref_w, ref_ids = route_torch(logits, routing, cfg.top_k, bias)
    assert torch.equal(ids.long(), ref_ids.long())
    assert rel_l2(fused.from_logits(x, logits, bias), experts.apply(x, ref_w, ref_ids)) < 1e-2


def test_unsupported_layers_are_refused_with_the_reason():
    _, _, experts = _layer(int4_w4a16(-1), N=192)  # per channel, K of w2 not a multiple of 128: halves
    assert "quads layout" in unsupported_reason(experts)
    with pytest.raises(ValueError, match="quads layout"):
        FusedDecode(experts)
    _, _, experts = _layer(int4_w4a16(64))
    with pytest.raises(ValueError, match="channels must be 64 or 128"):
        FusedDecode(experts, channels=32)
    with pytest.raises(ValueError, match="block_h must be a power of two"):
        FusedDecode(experts, block_h=96)
    _, _, experts = _layer(int4_w4a16(128, zero_point=True))
    assert "symmetric" in unsupported_reason(experts)
    _, _, experts = _layer(int4_w4a16(128), activation=Activation.gelu())
    assert "SiLU" in unsupported_reason(experts)
    _, _, experts = _layer(int8_w8a16(96), K=192, N=192)  # quarters straddle groups of the padded K: canonical
    assert "quads" in unsupported_reason(experts)
    _, _, experts = _layer(mxfp4_w4a16(), cls=TritonMxfp4Experts)  # fp16
    assert "bf16 layers" in unsupported_reason(experts)


def test_calls_outside_the_kernel_s_range_are_refused():
    cfg, _, experts = _layer(int4_w4a16(128))
    fused = FusedDecode(experts)
    x, tw, ids = _tokens(cfg, MAX_TOKENS + 1, seed=1)
    with pytest.raises(ValueError, match=f"1 to {MAX_TOKENS} tokens"):
        fused(x, tw, ids)
    with pytest.raises(ValueError, match="hidden_states must be"):
        fused(x[:1].float(), tw[:1], ids[:1])
    with pytest.raises(ValueError, match="topk_ids and topk_weights"):
        fused(x[:2], tw[:1], ids[:1])
    with pytest.raises(ValueError, match=r"router_logits must be \[2, 4\]"):
        fused.from_logits(x[:2], torch.randn(1, cfg.num_experts, device=DEV))
    with pytest.raises(ValueError, match=r"router_logits must be \[2, 4\]"):
        fused.from_logits(x[:2], torch.randn(2, cfg.num_experts + 4, device=DEV))
    if DEV.type == "cpu":  # the range check costs no device sync here
        with pytest.raises(ValueError, match=r"\[0, 4\)"):
            fused(x[:1], tw[:1], torch.full_like(ids[:1], 4))


_COMPILE_FUSED = """
from moe_triton._common.offline_compile import compile_kernel
from moe_triton.fused_decode_details._kernel import _fused_decode_kernel
from moe_triton.routing_details._kernel import route_constexprs
ptrs = {"x_ptr": "*bf16", "ids_ptr": "*i32", "wts_ptr": "*fp32", "logits_ptr": "*fp32", "bias_ptr": "*fp32",
        "s13_ptr": "*bf16", "s2_ptr": "*bf16", "acc_ptr": "*fp32", "out_ptr": "*bf16", "count_ptr": "*i32",
        "b13_ptr": "*fp32", "b2_ptr": "*fp32", "part_ptr": "*fp32", "group_count_ptr": "*i32",
        "renormalize_eps": "fp32", "scaling": "fp32", "alpha": "fp32", "limit": "fp32"}
# qwen3-30b-a3b's shapes: int4 g128 (int16 words) routed by the caller; int8 per channel (int32 words)
# routed in the kernel as DeepSeek-V3 routes (grouped sigmoid, correction bias, scaling), GEMM1 split
# over 4 programs; MXFP4 as gpt-oss (SwiGLU, biases; w13's exponent words folded, w2's not) routed in the
# kernel by softmax, 64 channels a program
cases = ((0, "*i16", 128, 128, 128, 8, False, dict(softmax=True, has_bias=False, groups=1, topk_groups=1,
                                                      renormalize=True, scaling=1.0)),
         (1, "*i32", 2048, 768, 128, 8, True, dict(softmax=False, has_bias=True, groups=8, topk_groups=4,
                                                     renormalize=True, scaling=2.5)),
         (3, "*i16", 32, 32, 64, 4, True, dict(softmax=True, has_bias=False, groups=1, topk_groups=1,
                                                 renormalize=True, scaling=1.0)))
for (wtype, words, group1, group2, channels, warps, route, kind), k_split in zip(cases, (1, 4, 2)):
    scales = {"s13_ptr": "*i32", "s2_ptr": "*i32"} if wtype == 3 else {}  # MXFP4: e8m0 exponent words
    gpt_oss = wtype == 3  # MXFP4 as gpt-oss: its SwiGLU and biases
    built = compile_kernel(_fused_decode_kernel, dict(GROUP1=group1, GROUP2=group2, WTYPE=wtype,
                                                      CODE_OFFSET={0: 8, 1: 128, 3: 0}[wtype], FOLDED1=gpt_oss,
                                                      FOLDED2=False, SWIGLU=gpt_oss,
                                                      EXPERT_BIAS=gpt_oss, CHANNELS=channels, BLOCK_H=128,
                                                      K_SPLIT=k_split, UPCAST=False, PTX=True, ROUTE=route,
                                                      **route_constexprs(128, 8, **kind)),
                           dict(ptrs, w13_ptr=words, w2_ptr=words, **scales), num_warps=warps)
    print(built.metadata.shared <= 232448)
# an fp16 layer's int4 (the other weight types' unpacks, bf16-only with PTX, must not be built)
fp16 = dict(ptrs, x_ptr="*fp16", s13_ptr="*fp16", s2_ptr="*fp16", out_ptr="*fp16", w13_ptr="*i16", w2_ptr="*i16")
built = compile_kernel(_fused_decode_kernel, dict(GROUP1=128, GROUP2=128, WTYPE=0, CODE_OFFSET=8, FOLDED1=False,
                                                  FOLDED2=False, SWIGLU=False,
                                                  EXPERT_BIAS=False, CHANNELS=128, BLOCK_H=128, K_SPLIT=1, UPCAST=False,
                                                  PTX=True, ROUTE=False, **route_constexprs(128, 8, **cases[0][7])),
                       fp16, num_warps=8)
print(built.metadata.shared <= 232448)
"""


def test_kernel_compiles_for_hopper():
    """Triton's compiler on the kernel for sm_90 (the interpreter runs none of its checks), in a
    child process, since this module interprets the kernel."""
    assert run_compiler_script(_COMPILE_FUSED).split() == ["True", "True", "True", "True"]


def test_a_launch_configuration_naming_it_runs_the_layer_in_one_launch():
    """A configuration with `fused` set (a tuned file's choice) serves calls of up to MAX_TOKENS tokens
    through `FusedDecode`, from the router logits (`apply_monolithic`, as FusedMoE calls it) and from
    routed ids (`apply`); larger calls keep its GEMMs."""
    cfg, _, experts = _layer(int4_w4a16(64), seed=13)
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(MAX_TOKENS + 1, cfg.hidden_size, generator=gen).to(cfg.dtype).to(DEV)
    logits = torch.randn(MAX_TOKENS + 1, cfg.num_experts, generator=gen).to(DEV)
    base = experts.config_for(2).config
    options = FusedDecodeConfig(64, 8, 64)
    fused_cfg = dataclasses.replace(base, fused=options)
    direct = FusedDecode(experts, channels=64, num_warps=8, block_h=64)
    tw, ids = route(logits, cfg.routing, cfg.top_k)
    experts.config_override = fused_cfg
    assert torch.equal(experts.apply_monolithic(x[:2], logits[:2], None), direct.from_logits(x[:2], logits[:2]))
    assert torch.equal(experts.apply(x[:2], tw[:2], ids[:2]), direct(x[:2], tw[:2], ids[:2]))
    large = experts.apply(x, tw, ids)
    experts.config_override = dataclasses.replace(fused_cfg, fused=None)
    assert torch.equal(large, experts.apply(x, tw, ids))  # the GEMMs past MAX_TOKENS
    assert rel_l2(direct(x[:2], tw[:2], ids[:2]), experts.apply(x[:2], tw[:2], ids[:2])) < 2e-3
    experts.config_override = None


def test_fused_launch_options_round_trip_through_a_config_file_entry():
    base = QuantKernelConfig(GemmConfig(16, 128, 2, 4, 3, swap_ab=True), GemmConfig(16, 128, 1, 4, 3, swap_ab=True))
    fused = dataclasses.replace(base, fused=FusedDecodeConfig(128, 4, 128))
    assert QuantKernelConfig.from_dict(fused.to_dict()) == fused and "k_split" not in fused.to_dict()["fused"]
    split = dataclasses.replace(base, fused=FusedDecodeConfig(64, 8, 128, k_split=4))
    assert QuantKernelConfig.from_dict(split.to_dict()) == split
    assert QuantKernelConfig.from_dict(base.to_dict()) == base and "fused" not in base.to_dict()
    assert str(fused).endswith("| fused c128 w4 h128 k1")
    with pytest.raises(ValueError, match="channels must be 64 or 128"):
        FusedDecodeConfig(32, 4, 128)
    with pytest.raises(ValueError, match="k_split must be 1, 2, 4 or 8"):
        FusedDecodeConfig(128, 4, 128, k_split=3)


def test_the_tuner_times_the_one_launch_path_at_decode_sizes_and_keeps_it_where_fastest():
    """At up to MAX_TOKENS tokens the tuner times `tune.fused_decode_candidates` beside the GEMMs (the
    layer as FusedMoE calls it) and keeps the fastest; above, none."""
    from moe_triton.tune import _tune_quant_layer

    _, _, experts = _layer(int4_w4a16(64), seed=15)
    timed = []

    def timer(layer, rep_ms):
        cand = experts.config_override
        timed.append(cand)
        if cand.fused is not None and len([c for c in timed if c.fused is not None]) == 1:
            assert torch.isfinite(layer()).all()  # the fused path itself runs, once
        return 1.0 if cand.fused == FusedDecodeConfig(*FUSED_OPTIONS[2]) else 2.0

    table, measured = _tune_quant_layer(experts, [1, MAX_TOKENS + 1], 5, lambda s: None, timer=timer)
    assert table[1].fused == FusedDecodeConfig(*FUSED_OPTIONS[2])
    assert measured["1"]["best"] == "fused:c{},w{},h{},k{}".format(*FUSED_OPTIONS[2])
    assert table[MAX_TOKENS + 1].fused is None
    assert not any(k.startswith("fused:") for k in measured[str(MAX_TOKENS + 1)]["layer_us"])


@pytest.mark.device("cuda")
@pytest.mark.parametrize("option", [*FUSED_OPTIONS, (64, 8, 128, 2)])
def test_every_tuner_option_on_gpu_stays_exact_over_many_calls(option):
    """qwen3-30b-a3b's int4 layer shape at one token with each of the tuner's launch options, and 64
    channels on 8 warps split in two (more threads than a slice's rows: threads holding the same
    rows must all read the sums before any zeroes them): against the twin on the first call, and
    twenty calls later (each call must leave the scratch zeroed, or the sums drift call by call)."""
    cfg, _, experts = _layer(int4_w4a16(128), dtype=torch.bfloat16, K=2048, N=768, E=128, topk=8, seed=40)
    gen = torch.Generator().manual_seed(41)
    x = torch.randn(1, cfg.hidden_size, generator=gen).to(torch.bfloat16).to(DEV)
    logits = torch.randn(1, cfg.num_experts, generator=gen).to(DEV)
    tw, ids = route(logits, cfg.routing, cfg.top_k)
    fused = FusedDecode(experts, **dataclasses.asdict(FusedDecodeConfig(*option)))
    first = fused.from_logits(x, logits)
    assert rel_l2(first, fused_decode_torch(experts, x, tw, ids)) < 5e-3
    for _ in range(20):
        later = fused.from_logits(x, logits)
    assert rel_l2(later, first) < 1e-3


@pytest.mark.device("cuda")
@pytest.mark.parametrize("quant", [int4_w4a16(128), int8_w8a16(), mxfp4_w4a16()])
@pytest.mark.parametrize("M", [1, MAX_TOKENS])
def test_fused_decode_on_gpu_eager_and_graph_replayed(quant, M):
    """qwen3-30b-a3b's layer shape (128 experts, top-8, K = 2048, N = 768), bf16, on the GPU: against
    the twin and the layer's GEMMs, routed in the kernel as by the router, and replayed from a CUDA
    graph (the scratch the last programs re-zero must leave every replay as exact as the first)."""
    cls = TritonMxfp4Experts if quant.weight.dtype.value == "fp4e2m1" else TritonWna16Experts
    cfg, _, experts = _layer(quant, dtype=torch.bfloat16, K=2048, N=768, E=128, topk=8, seed=M, cls=cls)
    gen = torch.Generator().manual_seed(30 + M)
    x = torch.randn(M, cfg.hidden_size, generator=gen).to(torch.bfloat16).to(DEV)
    logits = torch.randn(M, cfg.num_experts, generator=gen).to(DEV)
    tw, ids = route(logits, cfg.routing, cfg.top_k)
    for channels, k_split in ((128, 1), (64, 1), (128, 4)):
        fused = FusedDecode(experts, channels=channels, k_split=k_split)
        out = fused.from_logits(x, logits)
        assert rel_l2(out, fused(x, tw, ids)) < 1e-3  # the fp32 sums' order varies: bf16 ulps of a few outputs
        assert rel_l2(out, fused_decode_torch(experts, x, tw, ids)) < 5e-3
        assert rel_l2(out, experts.apply(x, tw, ids)) < 1e-2
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = fused.from_logits(x, logits)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert rel_l2(replayed, out) < 1e-3
