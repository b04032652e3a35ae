"""The XPU weight layouts on CPU: the torch twin of XpuFusedMoe, fed the processed tensors, must
equal moe-core's fp32 reference on the canonical weights for every scheme, group size and
activation the classes claim; a deliberately broken layout must not."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.quant import (
    FP8_BLOCK128_WEIGHT,
    FP8_TENSOR_WEIGHT,
    MoEQuantConfig,
    fp8_w8a8,
    int4_w4a16,
    mxfp4_w4a16,
    unquantized,
)
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights import ExpertWeights, PackedWeights
from moe_core.weights.writers import gptq_tensors
from moe_xpu.experts import XpuExperts, XpuFp8Experts, XpuInt4Experts, XpuMxfp4Experts
from moe_xpu.layouts import INT4_GROUP_SIZES, Recipe, expected_recipe, kernel_recipe
from moe_xpu.twin import interface_int4_reencode, twin_moe

CPU = torch.device("cpu")
ACTIVATIONS = {
    "silu": Activation.silu(),
    "gelu": Activation.gelu(),
    "gelu_tanh": Activation.gelu_tanh(),
    "swiglu_oai": Activation.swiglu_oai(),
    "relu2": Activation.relu2(),
}
FP8_TENSOR_W8A16 = MoEQuantConfig(FP8_TENSOR_WEIGHT)
FP8_BLOCK_W8A16 = MoEQuantConfig(FP8_BLOCK128_WEIGHT)


def _config(activation: str = "silu", dtype=torch.bfloat16, *, hidden=256, inter=128, top_k=2, bias=False,
            routing=None, parallel=None) -> MoEConfig:
    return MoEConfig(4, top_k, hidden, inter, activation=ACTIVATIONS[activation], dtype=dtype, has_bias=bias,
                     routing=routing or Routing.softmax_topk(True), parallel=parallel or ParallelConfig())


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out - ref).norm() / ref.norm())


def _twin_and_reference(cls, config: MoEConfig, quant: MoEQuantConfig, *, tokens=19, seed=0,
                        packed: PackedWeights | None = None, weights: ExpertWeights | None = None):
    weights = weights or ExpertWeights.random(config, quant, seed=seed)
    packed = packed or cls.weight_processor(weights, config, CPU)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, config.hidden_size, generator=gen).to(config.dtype)
    logits = torch.randn(tokens, config.num_experts, generator=gen)
    bias = torch.randn(config.num_experts, generator=gen) * 0.2 if config.routing.has_correction_bias else None
    topk_weights, topk_ids = route_torch(logits, config.routing, config.top_k, bias)
    emap = config.expert_map(CPU)
    twin = twin_moe(packed, config, quant, x, topk_weights, topk_ids, emap)
    ref = reference_moe(x, weights, config, topk_weights, topk_ids, quant, emap)
    return twin, ref


def _claimed(cls, config: MoEConfig, quant: MoEQuantConfig) -> None:
    """Every case below must be one the class claims, or the test proves nothing about a claim."""
    assert cls._supports_scheme(config, quant), cls._supports_scheme(config, quant).reason
    assert any(s.check(quant) for s in cls.capability.schemes)
    assert config.activation.kind in cls.capability.activations and config.dtype in cls.capability.dtypes


# Tight: the twin and the reference differ only in the order of fp32 sums.
TIGHT = 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_dense_layout_matches_reference(activation: str, dtype: torch.dtype) -> None:
    config = _config(activation, dtype, bias=activation == "swiglu_oai")
    _claimed(XpuExperts, config, unquantized())
    twin, ref = _twin_and_reference(XpuExperts, config, unquantized())
    assert _rel_err(twin, ref) < TIGHT


@pytest.mark.parametrize("group", sorted(INT4_GROUP_SIZES))
def test_int4_layout_matches_reference_for_every_group(group: int) -> None:
    config = _config(inter=256, bias=True)
    quant = int4_w4a16(group)
    _claimed(XpuInt4Experts, config, quant)
    twin, ref = _twin_and_reference(XpuInt4Experts, config, quant)
    assert _rel_err(twin, ref) < TIGHT


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_int4_layout_matches_reference_for_every_activation(activation: str) -> None:
    config = _config(activation, torch.float16)
    quant = int4_w4a16(64, scale_dtype="fp16")  # scales in the layer dtype: the kernel reads them so
    _claimed(XpuInt4Experts, config, quant)
    twin, ref = _twin_and_reference(XpuInt4Experts, config, quant)
    assert _rel_err(twin, ref) < TIGHT


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_fp8_per_tensor_layout_matches_reference(activation: str) -> None:
    config = _config(activation)
    _claimed(XpuFp8Experts, config, FP8_TENSOR_W8A16)
    twin, ref = _twin_and_reference(XpuFp8Experts, config, FP8_TENSOR_W8A16)
    assert _rel_err(twin, ref) < TIGHT


@pytest.mark.parametrize("activation", [a for a in ACTIVATIONS if a != "swiglu_oai"])
def test_fp8_block_layout_matches_reference(activation: str) -> None:
    config = _config(activation, bias=True)
    _claimed(XpuFp8Experts, config, FP8_BLOCK_W8A16)
    twin, ref = _twin_and_reference(XpuFp8Experts, config, FP8_BLOCK_W8A16)
    assert _rel_err(twin, ref) < TIGHT


@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_fp8_block_w8a8_matches_reference(activation: str) -> None:
    config = _config(activation)
    quant = fp8_w8a8("block")
    _claimed(XpuFp8Experts, config, quant)
    twin, ref = _twin_and_reference(XpuFp8Experts, config, quant)
    # Both quantize both GEMM inputs to fp8 by one formula; a GEMM1 output that differs in its last
    # fp32 bit can still round to a neighbouring fp8 value, hence more room than TIGHT.
    assert _rel_err(twin, ref) < 1e-3


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_mxfp4_layout_matches_reference(activation: str) -> None:
    config = _config(activation, bias=True)
    _claimed(XpuMxfp4Experts, config, mxfp4_w4a16())
    twin, ref = _twin_and_reference(XpuMxfp4Experts, config, mxfp4_w4a16())
    assert _rel_err(twin, ref) < TIGHT


@pytest.mark.parametrize(("cls", "quant"), [(XpuExperts, unquantized()), (XpuInt4Experts, int4_w4a16(128)),
                                            (XpuFp8Experts, FP8_TENSOR_W8A16), (XpuMxfp4Experts, mxfp4_w4a16())],
                         ids=["dense", "int4", "fp8", "mxfp4"])
def test_expert_parallel_and_llama4_routing_match_reference(cls, quant: MoEQuantConfig) -> None:
    ep = _config(parallel=ParallelConfig(ep_size=3, ep_rank=1))
    twin, ref = _twin_and_reference(cls, ep, quant)
    assert _rel_err(twin, ref) < TIGHT
    llama4 = _config(routing=Routing.llama4(), top_k=1)
    assert cls.supports_extra(llama4, quant, None)
    twin, ref = _twin_and_reference(cls, llama4, quant)
    # The input scaled by its routing weight reaches the kernel rounded to bf16 (one rounding, 2**-9).
    assert _rel_err(twin, ref) < 5e-3


# ---- the processed tensors themselves -------------------------------------------------------


def test_int4_bytes_are_gptq_qweight_transposed() -> None:
    """vLLM's XPU WNA16 path feeds GPTQ's int32 [E, K/8, 2N] transposed and viewed as uint8; ours
    must be those bytes."""
    config = _config()
    weights = ExpertWeights.random(config, int4_w4a16(128), seed=3)
    packed = XpuInt4Experts.weight_processor(weights, config, CPU)
    t = gptq_tensors(weights, "experts")
    qweight = torch.stack([torch.cat((t[f"experts.{e}.gate_proj.qweight"], t[f"experts.{e}.up_proj.qweight"]), 1)
                           for e in range(config.num_experts)])
    assert torch.equal(qweight.transpose(1, 2).contiguous().view(torch.uint8), packed["w13"])
    down = torch.stack([t[f"experts.{e}.down_proj.qweight"] for e in range(config.num_experts)])
    assert torch.equal(down.transpose(1, 2).contiguous().view(torch.uint8), packed["w2"])


def test_interface_int4_reencoding_is_twos_complement_of_code_minus_8() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    byte = codes | (codes.flip(0) << 4)
    s4 = interface_int4_reencode(byte)
    low = (s4 & 0xF).long()
    assert torch.equal(low - 16 * (low >= 8), codes.long() - 8)
    high = (s4 >> 4).long()
    assert torch.equal(high - 16 * (high >= 8), codes.flip(0).long() - 8)


@pytest.mark.parametrize(("cls", "quant", "recipe"), [
    (XpuExperts, unquantized(), Recipe.BF16),
    (XpuInt4Experts, int4_w4a16(32), Recipe.INT4),
    (XpuFp8Experts, FP8_TENSOR_W8A16, Recipe.FP8),
    (XpuFp8Experts, fp8_w8a8("block"), Recipe.FP8_BLOCK),
    (XpuMxfp4Experts, mxfp4_w4a16(), Recipe.MXFP4),
], ids=["dense", "int4", "fp8", "fp8block", "mxfp4"])
def test_processed_dtypes_give_the_schemes_recipe(cls, quant: MoEQuantConfig, recipe: Recipe) -> None:
    config = _config()
    packed = cls.weight_processor(ExpertWeights.random(config, quant, seed=1), config, CPU)
    assert expected_recipe(quant) is recipe
    assert kernel_recipe(packed["w13"], packed.get("w13_scale"), env={}) is recipe
    assert kernel_recipe(packed["w2"], packed.get("w2_scale"), env={}) is recipe


def test_mxfp4_fp8_switch_changes_the_inferred_recipe() -> None:
    config = _config()
    packed = XpuMxfp4Experts.weight_processor(ExpertWeights.random(config, mxfp4_w4a16(), seed=1), config, CPU)
    env = {"VLLM_XPU_FUSED_MOE_USE_MXFP4_FP8": "1"}
    assert kernel_recipe(packed["w13"], packed["w13_scale"], env=env) is Recipe.MXFP4_FP8


@pytest.mark.parametrize(("cls", "quant"), [(XpuExperts, unquantized()), (XpuInt4Experts, int4_w4a16(64)),
                                            (XpuFp8Experts, FP8_BLOCK_W8A16), (XpuMxfp4Experts, mxfp4_w4a16())],
                         ids=["dense", "int4", "fp8", "mxfp4"])
def test_processors_are_pure_and_share_no_storage(cls, quant: MoEQuantConfig) -> None:
    """The interface re-encodes int4 weights in place: no processed tensor may alias a canonical one."""
    config = _config(bias=True)
    weights = ExpertWeights.random(config, quant, seed=4)
    before = {k: v.clone() for k, v in weights.tensors().items()}
    first = cls.weight_processor(weights, config, CPU)
    second = cls.weight_processor(weights, config, CPU)
    assert first.layout == cls.weight_processor.layout
    canonical_ptrs = {t.untyped_storage().data_ptr() for t in weights.tensors().values()}
    for name, t in first.tensors.items():
        assert t.is_contiguous(), name
        assert t.untyped_storage().data_ptr() not in canonical_ptrs, f"{name} aliases a canonical tensor"
        assert torch.equal(t.view(torch.uint8) if t.element_size() == 1 else t,
                           second[name].view(torch.uint8) if t.element_size() == 1 else second[name]), name
    for name, t in weights.tensors().items():
        assert torch.equal(t.view(torch.uint8) if t.element_size() == 1 else t,
                           before[name].view(torch.uint8) if t.element_size() == 1 else before[name]), name


def test_processed_shapes_and_dtypes() -> None:
    config = _config("swiglu_oai", bias=True)  # E=4, K=256, N=128
    int4 = XpuInt4Experts.weight_processor(ExpertWeights.random(config, int4_w4a16(32), seed=1), config, CPU)
    assert (int4["w13"].dtype, tuple(int4["w13"].shape)) == (torch.uint8, (4, 256, 128))
    assert (int4["w13_scale"].dtype, tuple(int4["w13_scale"].shape)) == (torch.bfloat16, (4, 256, 8))
    assert tuple(int4["w2"].shape) == (4, 256, 64) and tuple(int4["w2_scale"].shape) == (4, 256, 4)
    mx = XpuMxfp4Experts.weight_processor(ExpertWeights.random(config, mxfp4_w4a16(), seed=1), config, CPU)
    assert (mx["w13"].dtype, tuple(mx["w13"].shape)) == (torch.float4_e2m1fn_x2, (4, 256, 128))
    assert (mx["w13_scale"].dtype, tuple(mx["w13_scale"].shape)) == (torch.uint8, (4, 256, 8))
    dense = XpuExperts.weight_processor(ExpertWeights.random(config, unquantized(), seed=1), config, CPU)
    assert tuple(dense["w13"].shape) == (4, 256, 256) and tuple(dense["w2"].shape) == (4, 128, 256)
    assert dense["w13_bias"].dtype == torch.bfloat16
    block_cfg = _config()
    fp8 = XpuFp8Experts.weight_processor(ExpertWeights.random(block_cfg, FP8_BLOCK_W8A16, seed=1), block_cfg, CPU)
    assert (fp8["w2_scale"].dtype, tuple(fp8["w2_scale"].shape)) == (torch.float32, (4, 1, 2))  # [E, N/128, K/128]


# ---- layouts broken on purpose: the comparison above must be able to fail -------------------


def _swap_nibbles(t: torch.Tensor) -> torch.Tensor:
    raw = t.view(torch.uint8)
    return ((raw << 4) | (raw >> 4)).view(t.dtype)


def _broken(packed: PackedWeights, **replace: torch.Tensor) -> PackedWeights:
    return dataclasses.replace(packed, tensors={**packed.tensors, **replace})


def _assert_broken_fails(cls, config: MoEConfig, quant: MoEQuantConfig, breaker) -> None:
    weights = ExpertWeights.random(config, quant, seed=7)
    packed = cls.weight_processor(weights, config, CPU)
    twin, ref = _twin_and_reference(cls, config, quant, packed=packed, weights=weights, seed=7)
    assert _rel_err(twin, ref) < 1e-3
    twin, ref = _twin_and_reference(cls, config, quant, packed=breaker(packed), weights=weights, seed=7)
    assert _rel_err(twin, ref) > 0.05


def test_swapped_int4_nibbles_fail() -> None:
    _assert_broken_fails(XpuInt4Experts, _config(), int4_w4a16(128),
                         lambda p: _broken(p, w13=_swap_nibbles(p["w13"])))


def test_swapped_mxfp4_nibbles_fail() -> None:
    _assert_broken_fails(XpuMxfp4Experts, _config(), mxfp4_w4a16(),
                         lambda p: _broken(p, w2=_swap_nibbles(p["w2"])))


def test_untransposed_dense_weights_fail() -> None:
    config = _config()  # K = 256 = 2N: the canonical [E, 2N, K] has the kernel's shape, not its order
    _assert_broken_fails(XpuExperts, config, unquantized(),
                         lambda p: _broken(p, w13=p["w13"].transpose(1, 2).contiguous()))


def test_untransposed_block_scales_fail() -> None:
    config = _config()  # R = 2N = K: square w13 scale grids, so only their order can be wrong
    _assert_broken_fails(XpuFp8Experts, config, FP8_BLOCK_W8A16,
                         lambda p: _broken(p, w13_scale=p["w13_scale"].transpose(1, 2).contiguous()))


def test_gate_up_not_interleaved_for_swiglu_oai_fails() -> None:
    config = _config("swiglu_oai")
    canonical_order = _config("silu")
    weights = ExpertWeights.random(config, mxfp4_w4a16(), seed=7)
    unleaved = XpuMxfp4Experts.weight_processor(weights, canonical_order, CPU)
    _assert_broken_fails(XpuMxfp4Experts, config, mxfp4_w4a16(),
                         lambda p: _broken(p, w13=unleaved["w13"], w13_scale=unleaved["w13_scale"]))
