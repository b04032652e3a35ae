"""The canonical form: packing, quantize/dequantize error bounds, validation errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_core import ExpertWeights, MoEConfig
from moe_core.config import Activation
from moe_core.quant import MoEQuantConfig, fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16, unquantized
from moe_core.weights.canonical import quantize_expert_tensor
from moe_core.weights.packing import (
    E2M1_VALUES,
    decode_e2m1,
    decode_e8m0,
    encode_e2m1,
    pack_int4,
    unpack_int4,
)

CFG = MoEConfig(4, 2, 256, 128)


@given(st.integers(1, 4), st.integers(1, 16), st.integers(0, 2**31 - 1))
@settings(max_examples=30, deadline=None)
def test_int4_pack_round_trip(rows, half_cols, seed):
    codes = torch.randint(0, 16, (rows, 2 * half_cols), generator=torch.Generator().manual_seed(seed),
                          dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (rows, half_cols)
    assert torch.equal(unpack_int4(packed), codes)
    assert int(packed[0, 0]) == int(codes[0, 0]) | (int(codes[0, 1]) << 4)  # even k in the low nibble


def test_e2m1_codes_and_e8m0():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(decode_e2m1(pack_int4(codes)), E2M1_VALUES)
    values = torch.tensor([0.2, 0.25, 0.75, 1.25, 2.5, 3.5, 5.0, 7.0, -0.3, -5.5])
    # ties go to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    assert E2M1_VALUES[encode_e2m1(values).long()].tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 4.0, 4.0, 6.0, -0.5, -6.0]
    assert decode_e8m0(torch.tensor([127, 128, 120], dtype=torch.uint8)).tolist() == [1.0, 2.0, 2.0 ** -7]
    with pytest.raises(ValueError, match="exponent 255 encodes NaN"):
        decode_e8m0(torch.tensor([255], dtype=torch.uint8))


# Expected relative RMS error of round-to-nearest on Gaussian weights, with margin.
@pytest.mark.parametrize("quant, bound", [
    (int4_w4a16(32), 0.12), (int4_w4a16(128, zero_point=True), 0.14), (int4_w4a16(-1), 0.2),
    (int4_w4a16(64, act_order=True), 0.13), (int8_w8a16(-1), 0.012), (int8_w8a16(128, zero_point=True), 0.01),
    (fp8_w8a8("tensor"), 0.04), (fp8_w8a8("channel"), 0.04), (fp8_w8a8("block"), 0.04), (mxfp4_w4a16(), 0.16),
])
def test_quantization_error_is_bounded_and_nonzero(quant, bound):
    gen = torch.Generator().manual_seed(0)
    w13 = torch.randn(4, 256, 256, generator=gen)
    w2 = torch.randn(4, 256, 128, generator=gen)
    gidx = None
    if quant.weight.act_order:
        gidx = tuple((torch.stack([torch.randperm(k, generator=gen) for _ in range(4)]) // 64).int() for k in (256, 128))
    ew = ExpertWeights.from_float(w13, w2, quant, g_idx=gidx)
    ew.validate(CFG, quant)
    d13, d2 = ew.dequantize()
    for got, want in ((d13, w13), (d2, w2)):
        err = float((got - want).norm() / want.norm())
        assert 1e-4 < err < bound, err


def test_act_order_scales_follow_g_idx():
    """A channel's scale is the one of its group, wherever the channel sits."""
    gen = torch.Generator().manual_seed(3)
    w13 = torch.randn(1, 2, 128, generator=gen)
    w2 = torch.randn(1, 128, 64, generator=gen)
    g13 = (torch.randperm(128, generator=gen) // 64).int().unsqueeze(0)
    g2 = (torch.randperm(64, generator=gen) // 64).int().unsqueeze(0)
    w13[0, :, g13[0] == 1] *= 100  # group 1 is large: with wrong group mapping, group 0 would lose all precision
    ew = ExpertWeights.from_float(w13, w2, int4_w4a16(64, act_order=True), g_idx=(g13, g2))
    d13, _ = ew.dequantize()
    small = g13[0] == 0
    assert float((d13[0, :, small] - w13[0, :, small]).norm() / w13[0, :, small].norm()) < 0.15


def test_random_weights_have_the_real_shape():
    cfg = MoEConfig(6, 2, 128, 64, activation=Activation.swiglu_oai(), has_bias=True)
    calls = []
    w = ExpertWeights.random(cfg, mxfp4_w4a16(), seed=1, progress=lambda d, t: calls.append((d, t)))
    w.validate(cfg, mxfp4_w4a16())
    assert calls[-1] == (6, 6) and len(calls) == 6
    assert w.w13.shape == (6, 128, 64) and w.w13_scale.shape == (6, 128, 4) and w.w13_bias.shape == (6, 128)
    assert torch.equal(ExpertWeights.random(cfg, mxfp4_w4a16(), seed=1).w13, w.w13)


def _tensors(w: ExpertWeights) -> dict[str, torch.Tensor]:
    return {f.name: getattr(w, f.name) for f in dataclasses.fields(w) if isinstance(getattr(w, f.name), torch.Tensor)}


@pytest.mark.parametrize("quant", [int4_w4a16(32, act_order=True), fp8_w8a8("block"), unquantized()],
                         ids=["int4-act-order", "fp8-block", "bf16"])
def test_random_weights_on_a_named_device(quant):
    cfg = MoEConfig(3, 2, 256, 128, has_bias=True)
    default = ExpertWeights.random(cfg, quant, seed=2)
    named = ExpertWeights.random(cfg, quant, seed=2, device=torch.device("cpu"))
    assert {k: torch.equal(t, _tensors(named)[k]) for k, t in _tensors(default).items()} == dict.fromkeys(
        _tensors(default), True)


@pytest.mark.device("cuda")
@pytest.mark.parametrize("quant", [int4_w4a16(32, act_order=True), mxfp4_w4a16(), fp8_w8a8("block")],
                         ids=["int4-act-order", "mxfp4", "fp8-block"])
def test_random_weights_drawn_on_the_gpu(quant):
    """Drawn and quantized on the GPU: every tensor lives there, and dequantizes close to its draw's scale."""
    cfg = MoEConfig(3, 2, 256, 128, activation=Activation.swiglu_oai(), has_bias=True)
    w = ExpertWeights.random(cfg, quant, seed=2, device="cuda")
    w.validate(cfg, quant)
    assert {t.device.type for t in _tensors(w).values()} == {"cuda"}
    d13, _ = w.dequantize()
    assert 0.5 < float(d13.float().std() * 256**0.5) < 1.5  # drawn N(0, 1 / fan_in)


@pytest.mark.parametrize("mutate, quant, match", [
    (lambda w: dataclasses.replace(w, w13=w.w13[:, :-1]), int4_w4a16(64), r"w13 has shape \[4, 255, 128\], expected \[4, 256, 128\]"),
    (lambda w: dataclasses.replace(w, w2=w.w2.to(torch.int32)), int4_w4a16(64), r"w2 has dtype torch.int32, expected torch.uint8"),
    (lambda w: dataclasses.replace(w, w13_scale=None), int4_w4a16(64), r"w13_scale is missing: expected a tensor of shape \[4, 256, 4\]"),
    (lambda w: dataclasses.replace(w, w2_zero=torch.zeros(4, 256, 2, dtype=torch.uint8)), int4_w4a16(64), "has no zero points"),
    (lambda w: dataclasses.replace(w, w13_scale=w.w13_scale.int()), int4_w4a16(64), "expected a floating-point dtype"),
    (lambda w: w, int4_w4a16(128), r"ExpertWeights hold int4\[static-group64-bf16\] weights but the layer was built for"),
    (lambda w: dataclasses.replace(w, w13_bias=torch.zeros(4, 256)), int4_w4a16(64), "config.has_bias=False but w13_bias is set"),
])
def test_validation_errors(mutate, quant, match):
    w = ExpertWeights.random(CFG, int4_w4a16(64), seed=0)
    with pytest.raises(ValueError, match=match):
        mutate(w).validate(CFG, quant)


def test_group_size_must_divide():
    cfg = MoEConfig(2, 1, 96, 64)
    with pytest.raises(ValueError, match="group size 64 does not divide the input dimension 96"):
        ExpertWeights.random(cfg, int4_w4a16(64))


def test_stack_and_unquantized():
    w = ExpertWeights.random(CFG, unquantized(), seed=2)
    assert w.w13.dtype == torch.bfloat16 and w.w13_scale is None
    parts = [w.narrow(i, 1) for i in range(4)]
    assert torch.equal(ExpertWeights.stack(parts).w2, w.w2)
    with pytest.raises(ValueError, match="different quantization keys"):
        ExpertWeights.stack([w, ExpertWeights.random(CFG, int8_w8a16(), seed=2)])
    assert isinstance(w.key, type(MoEQuantConfig(w.key).weight))


def _per_half_act_order(E: int = 3, N: int = 64, K: int = 128, group: int = 32, seed: int = 4):
    """int4 act-order weights whose gate and up halves have different permutations, gate rows made
    large in up's group 1 and up rows in gate's group 0: a half read with the other's grouping would
    lose most of its precision."""
    gen = torch.Generator().manual_seed(seed)
    g13 = (torch.stack([torch.randperm(K, generator=gen) for _ in range(2 * E)]) // group).int().view(E, 2, K)
    g2 = (torch.stack([torch.randperm(N, generator=gen) for _ in range(E)]) // group).int()
    w13 = torch.randn(E, 2 * N, K, generator=gen) * K ** -0.5
    w2 = torch.randn(E, K, N, generator=gen) * N ** -0.5
    for e in range(E):
        w13[e, :N, g13[e, 1] == 1] *= 50
        w13[e, N:, g13[e, 0] == 0] *= 50
    quant = int4_w4a16(group, act_order=True)
    return ExpertWeights.from_float(w13, w2, quant, g_idx=(g13, g2)), w13, w2, quant


def test_per_half_g_idx_scales_each_half_by_its_own_grouping():
    ew, w13, _, quant = _per_half_act_order()
    E, R, K = w13.shape
    N = R // 2
    ew.validate(MoEConfig(E, 2, K, N), quant)
    assert ew.w13_g_idx.shape == (E, 2, K)
    codes = unpack_int4(ew.w13).float()
    want = torch.empty_like(w13)
    for e in range(E):
        for half, rows in enumerate((slice(0, N), slice(N, R))):
            # each channel's scale is its group's in this half, wherever the channel sits
            scale = ew.w13_scale[e, rows].float()[:, ew.w13_g_idx[e, half].long()]
            want[e, rows] = (codes[e, rows] - 8) * scale
    d13, _ = ew.dequantize()
    assert torch.equal(d13, want)
    assert float((d13 - w13).norm() / w13.norm()) < 0.12


def test_reference_applies_each_halfs_g_idx():
    """reference_moe on per-half act-order weights against the fp32 MLP of their dequantized halves."""
    from moe_core.reference import reference_moe

    ew, _, _, quant = _per_half_act_order(E=3, N=64, K=128)
    cfg = MoEConfig(3, 2, 128, 64, dtype=torch.float32)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(5, 128, generator=gen)
    tw = torch.rand(5, 2, generator=gen)
    ids = torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2], [1, 0]])
    d13, d2 = ew.dequantize()
    want = torch.zeros(5, 128)
    for t in range(5):
        for s in range(2):
            e = int(ids[t, s])
            gate, up = (x[t] @ d13[e].T).chunk(2)
            want[t] += tw[t, s] * (torch.nn.functional.silu(gate) * up) @ d2[e].T
    got = reference_moe(x, ew, cfg, tw, ids, quant)
    assert float((got - want).norm() / want.norm()) < 1e-6


def test_per_half_g_idx_validation_and_stack():
    ew, *_, quant = _per_half_act_order(E=2, N=64, K=128)
    gated = MoEConfig(2, 2, 128, 64)
    with pytest.raises(ValueError, match=r"w13_g_idx has shape \[2, 2, 128\], expected \[2, 128\]"):
        ew.validate(MoEConfig(2, 2, 128, 128, activation=Activation.relu2()), quant)  # non-gated: one grouping
    with pytest.raises(ValueError, match=r"w13_g_idx has shape \[2, 3, 128\], expected \[2, 2, 128\]"):
        dataclasses.replace(ew, w13_g_idx=torch.zeros(2, 3, 128, dtype=torch.int32)).validate(gated, quant)
    with pytest.raises(ValueError, match=r"w13_g_idx: values must lie in \[0, 4\)"):
        dataclasses.replace(ew, w13_g_idx=ew.w13_g_idx + 1).validate(gated, quant)
    # a shard with one grouping stacks with a per-half one: both take the per-half form
    shared = dataclasses.replace(ew.narrow(0, 1), w13_g_idx=ew.w13_g_idx[:1, 0].contiguous())
    stacked = ExpertWeights.stack([shared, ew.narrow(1, 1)])
    assert torch.equal(stacked.w13_g_idx[0], ew.w13_g_idx[0, :1].expand(2, -1))
    assert torch.equal(stacked.w13_g_idx[1], ew.w13_g_idx[1])
    stacked.validate(gated, quant)


@pytest.mark.parametrize("quant", [int4_w4a16(32), int4_w4a16(32, zero_point=True), int8_w8a16(), mxfp4_w4a16(),
                                   fp8_w8a8("block"), fp8_w8a8("tensor")], ids=lambda q: q.name)
def test_from_float_quantizes_expert_by_expert_as_the_whole_tensor_would(quant):
    """from_float quantizes one expert at a time (bounded temporaries): the same codes and scales as
    quantizing the whole tensor."""
    gen = torch.Generator().manual_seed(0)
    w13, w2 = torch.randn(5, 128, 256, generator=gen), torch.randn(5, 256, 64, generator=gen)
    got = ExpertWeights.from_float(w13, w2, quant)
    for name, w in (("w13", w13), ("w2", w2)):
        for part, want in zip(("", "_scale", "_zero"), quantize_expert_tensor(w, quant.weight)):
            have = getattr(got, f"{name}{part}")
            if want is None:
                assert have is None
            else:
                assert have.dtype == want.dtype, name + part
                assert torch.equal(_bits(have), _bits(want)), name + part


def _bits(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors compare by their bytes (torch.equal has no fp8 kernel on every build)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
