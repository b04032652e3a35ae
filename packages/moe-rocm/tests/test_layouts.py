"""AITER's weight layouts on the CPU: the shuffle against its definition, fp8 per architecture, the processor."""

from __future__ import annotations

import pytest
import torch

from moe_core import Activation, ExpertWeights, MoEConfig, fp8_w8a8, int4_w4a16, unquantized
from moe_rocm.aiter_api import GFX942, GFX950
from moe_rocm.layouts import LAYOUT, AiterProcessor, shuffle_weight, to_aiter_fp8, unshuffle_weight

CPU = torch.device("cpu")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


# ---- the shuffle ----------------------------------------------------------------------------


def test_shuffle_matches_the_definition_on_a_hand_checked_tile():
    # One 16 x 32 tile of 2-byte values w[r, c] = 32 r + c: 16-byte chunks are 8 values, and the tile is
    # stored chunk column by chunk column, each holding that chunk of rows 0..15 in turn.
    w = torch.arange(16 * 32, dtype=torch.int16).reshape(1, 16, 32)
    s = shuffle_weight(w)
    assert s.shape == w.shape and s.dtype == w.dtype
    assert s[0, 0, :8].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # row 0, columns 0-7
    assert s[0, 0, 8:16].tolist() == [32, 33, 34, 35, 36, 37, 38, 39]  # row 1, columns 0-7
    assert s[0, 0, 24:32].tolist() == [96, 97, 98, 99, 100, 101, 102, 103]  # row 3, columns 0-7
    assert s[0, 3, 24:32].tolist() == [480, 481, 482, 483, 484, 485, 486, 487]  # row 15, columns 0-7
    assert s[0, 4, :8].tolist() == [8, 9, 10, 11, 12, 13, 14, 15]  # chunk column 1 starts: row 0, columns 8-15
    assert s[0, 15, 24:32].tolist() == [504, 505, 506, 507, 508, 509, 510, 511]  # row 15, columns 24-31


def test_shuffle_of_one_byte_values_uses_16_value_chunks_and_row_major_tiles():
    w = torch.arange(32 * 64, dtype=torch.int32).reshape(1, 32, 64)
    w8 = (w % 251).to(torch.uint8)  # 251 is prime: the values below are distinct
    s = shuffle_weight(w8)
    assert s[0, 0, :16].tolist() == w8[0, 0, :16].tolist()  # row 0, columns 0-15
    assert s[0, 0, 16:32].tolist() == w8[0, 1, :16].tolist()  # row 1, columns 0-15
    assert s[0, 4, :16].tolist() == w8[0, 0, 16:32].tolist()  # flat 256: tile (0, 0)'s second chunk column
    assert s[0, 8, :16].tolist() == w8[0, 0, 32:48].tolist()  # flat 512: tile (0, 1), the next 32 columns
    assert s[0, 16, :16].tolist() == w8[0, 16, :16].tolist()  # flat 1024: tile (1, 0), rows 16-31
    assert s[0, 31, 48:64].tolist() == w8[0, 31, 48:64].tolist()  # the last chunk stays last


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_unshuffle_inverts_shuffle(dtype):
    w = (torch.randn(3, 64, 96, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    s = shuffle_weight(w)
    assert not torch.equal(_bits(s), _bits(w))
    assert torch.equal(_bits(unshuffle_weight(s)), _bits(w))
    assert torch.equal(_bits(shuffle_weight(unshuffle_weight(w))), _bits(w))


def test_shuffle_refuses_shapes_the_tiles_do_not_cover():
    with pytest.raises(ValueError, match=r"rows must be a multiple of 16 and columns a multiple of 32"):
        shuffle_weight(torch.zeros(2, 24, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"columns a multiple of 32"):
        shuffle_weight(torch.zeros(2, 32, 48, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"expected an expert-stacked weight \[E, rows, cols\]"):
        shuffle_weight(torch.zeros(32, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"1-, 2- or 4-byte"):
        shuffle_weight(torch.zeros(1, 16, 32, dtype=torch.float64))


# ---- fp8 per architecture -------------------------------------------------------------------


def _all_finite_e4m3fn() -> torch.Tensor:
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    return bits[(bits & 0x7F) != 0x7F].view(torch.float8_e4m3fn)


def test_gfx950_keeps_e4m3fn_codes_and_scales():
    codes, scale = _all_finite_e4m3fn(), torch.tensor([0.37])
    out, out_scale = to_aiter_fp8(codes, scale, GFX950)
    assert out.dtype == torch.float8_e4m3fn and torch.equal(_bits(out), _bits(codes)) and torch.equal(out_scale, scale)


def test_gfx942_fnuz_codes_times_doubled_scales_equal_the_e4m3fn_values_exactly():
    codes, scale = _all_finite_e4m3fn(), torch.tensor([0.37])
    out, out_scale = to_aiter_fp8(codes, scale, GFX942)
    assert out.dtype == torch.float8_e4m3fnuz
    assert torch.equal(out_scale, scale * 2)
    # Every finite code, subnormals and the largest (448 -> 224 in e4m3fnuz) included.
    assert torch.equal(out.float() * out_scale, codes.float() * scale)
    assert not out.float().isnan().any()  # -0 (0x80) became +0, not e4m3fnuz's NaN
    assert _bits(out)[_bits(codes) == 0x80].eq(0).all()
    assert torch.finfo(out.dtype).max == 240.0


def test_nan_fp8_codes_are_refused():
    codes = torch.tensor([0x7F, 0x01], dtype=torch.uint8).view(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="NaN codes"):
        to_aiter_fp8(codes, torch.ones(1), GFX950)


# ---- the processor --------------------------------------------------------------------------


def _config(dtype=torch.bfloat16, activation=None) -> MoEConfig:
    return MoEConfig(4, 2, 256, 128, activation=activation or Activation.silu(), dtype=dtype)


def _dequantized_from_layout(packed, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    out = []
    for name in ("w13", "w2"):
        w = unshuffle_weight(packed[name]).float()
        s = packed.get(f"{name}_scale")
        if s is not None:
            s = s.float() if granularity == "channel" else s.repeat_interleave(128, 1).repeat_interleave(128, 2)
            w = w * s
        out.append(w)
    return out[0], out[1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_unquantized_weights_are_shuffled_in_the_layer_dtype(dtype):
    cfg = _config(dtype)
    weights = ExpertWeights.random(cfg, unquantized(), seed=1)
    packed = AiterProcessor()(weights, cfg, CPU)
    assert packed.layout == LAYOUT and set(packed.tensors) == {"w13", "w2"}
    for name in ("w13", "w2"):
        t = packed[name]
        assert t.dtype == dtype and t.shape == getattr(weights, name).shape and t.is_shuffled
        assert torch.equal(unshuffle_weight(t), getattr(weights, name))


@pytest.mark.parametrize("arch", [GFX942, GFX950], ids=lambda a: a.name)
@pytest.mark.parametrize("granularity", ["channel", "block"])
def test_fp8_layout_dequantizes_to_the_canonical_values_exactly(arch, granularity):
    cfg = _config()
    weights = ExpertWeights.random(cfg, fp8_w8a8(granularity), seed=2)
    packed = AiterProcessor(arch=arch)(weights, cfg, CPU)
    E, R, K, N = 4, 256, 256, 128
    assert packed["w13"].dtype == arch.fp8_dtype and packed["w2"].dtype == arch.fp8_dtype
    want = {"channel": ((E, R, 1), (E, K, 1)), "block": ((E, R // 128, K // 128), (E, K // 128, N // 128))}
    assert (tuple(packed["w13_scale"].shape), tuple(packed["w2_scale"].shape)) == want[granularity]
    assert packed["w13_scale"].dtype == torch.float32
    w13, w2 = _dequantized_from_layout(packed, granularity)
    ref13, ref2 = weights.dequantize()
    assert torch.equal(w13, ref13) and torch.equal(w2, ref2)


def test_processing_is_pure_and_repeatable():
    cfg = _config()
    weights = ExpertWeights.random(cfg, fp8_w8a8("block"), seed=3)
    before = {k: v.clone() for k, v in weights.tensors().items()}
    first = AiterProcessor(arch=GFX942)(weights, cfg, CPU)
    second = AiterProcessor(arch=GFX942)(weights, cfg, CPU)
    for name, t in weights.tensors().items():
        assert torch.equal(_bits(t), _bits(before[name])), f"processing mutated canonical {name}"
    for name in first.tensors:
        assert torch.equal(_bits(first[name]), _bits(second[name]))


def test_processor_refusals_name_what_is_wrong():
    cfg = _config()
    with pytest.raises(ValueError, match=r"depend on the GPU architecture .* not a ROCm device"):
        AiterProcessor()(ExpertWeights.random(cfg, fp8_w8a8("channel"), seed=4), cfg, CPU)
    with pytest.raises(ValueError, match=r"no AITER layout for int4.*accepted: unquantized, fp8"):
        AiterProcessor()(ExpertWeights.random(cfg, int4_w4a16(128), seed=4), cfg, CPU)
    fp16_weights = ExpertWeights.random(_config(torch.float16), unquantized(), seed=4)
    with pytest.raises(ValueError, match=r"w13 is torch.float16 but the layer dtype is torch.bfloat16"):
        AiterProcessor()(fp16_weights, cfg, CPU)
    small = MoEConfig(4, 2, 256, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"whole 128x128 blocks"):
        AiterProcessor(arch=GFX950)(ExpertWeights.random(small, fp8_w8a8("block"), seed=4), small, CPU)
