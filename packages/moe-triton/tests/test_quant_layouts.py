"""The quantized GEMM's weight layouts (`quant_gemm_details._layouts`): each a round trip, the
processors' packing, K padding of the quads layout, and the kernel reading codes in any memory order.
"""

import dataclasses

import pytest
import torch
from _quant_support import DEV, RUN_ON, gemm1_error, gemm1_operand, rel_l2, run_layer

from moe_core.config import Activation, MoEConfig
from moe_core.quant import int4_w4a16, mxfp4_w4a16
from moe_core.weights.canonical import ExpertWeights
from moe_triton.configs import GemmConfig
from moe_triton.quant_gemm_details._dequant import dequantize_operand, dequantize_padded
from moe_triton.quant_gemm_details._layouts import (
    GateUpInterleave,
    HalvesLayout,
    QuadsLayout,
    stored_k_major,
    stored_tile_major,
)
from moe_triton.quantized import TritonWna16Experts


@pytest.mark.parametrize("zero_point", [False, True])
def test_int4_pads_k_to_whole_quads_tiles(zero_point):
    """Grouped int4 whose K 128 does not divide (gpt-oss's 2880; 192 here): the quads layout padded to
    whole tiles, the padding dequantizing to exactly 0, and the layer (M = 1 and many) as the reference."""
    quant = int4_w4a16(64, zero_point=zero_point)
    w = gemm1_operand(quant, 192, seed=4)
    assert w.quads and w.k == 192 and w.k_tiles == 2 and w.codes.shape[2] == 2
    assert w.scale.shape[1] == 256 // 64 and (w.zero is None or w.zero.shape[1] == 4)
    full = dequantize_padded(w)
    assert full.shape[2] == 256 and bool((full[:, :, 192:] == 0).all()) and bool((full[:, :, :192] != 0).any())
    for M in (1, 9):
        out, ref = run_layer(TritonWna16Experts, quant, Activation.swiglu_oai(), torch.bfloat16, K=192, N=192, bias=True,
                        M=M)
        assert rel_l2(out, ref) < 1e-2


def test_processor_interleaves_gated_w13_rows():
    """Gated w13 rows (codes, scales, zero points, bias) are packed in chunks of GATE_UP_CHUNK:
    gate chunk c, then up chunk c; w2 and non-gated w13 keep the canonical order."""
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


def test_int4_tile_packing_roundtrip():
    codes = torch.randint(0, 256, (2, 3, 64), dtype=torch.uint8)
    packed = HalvesLayout(64).swizzle(codes)
    assert packed.shape == (2, 3, 2, 32)
    assert packed.stride() == (192, 1, 96, 3)  # K-major: one K tile's byte rows, N contiguous
    unpacked = HalvesLayout(64).unswizzle(packed)
    assert torch.equal(unpacked[..., 0::2] | (unpacked[..., 1::2] << 4), codes)
    # Tile 1 of row 0: its first byte holds k=64 (low) and k=96 (high).
    assert int(packed[0, 0, 1, 0]) == int(unpacked[0, 0, 64]) | (int(unpacked[0, 0, 96]) << 4)


def test_int4_quad_packing_roundtrip():
    codes = torch.randint(0, 256, (2, 3, 128), dtype=torch.uint8)
    words = QuadsLayout(128).swizzle(codes)
    assert words.shape == (2, 3, 2, 32) and words.dtype == torch.int16
    assert words.stride() == (192, 32, 96, 1)  # tile-major: one K tile's rows are contiguous
    unpacked = QuadsLayout(128).unswizzle(words)
    assert torch.equal(unpacked[..., 0::2] | (unpacked[..., 1::2] << 4), codes)
    # Tile 1 of row 2, word 5: nibble j holds k = 128 + 32 j + 5.
    word = int(words[1, 2, 1, 5]) & 0xFFFF
    assert [(word >> (4 * j)) & 0xF for j in range(4)] == [int(unpacked[1, 2, 128 + 32 * j + 5]) for j in range(4)]


def test_gate_up_interleave_roundtrip():
    layout = GateUpInterleave(32)
    h = torch.randn(3, 2 * 96)
    swizzled = h[:, layout.row_order(96)]
    assert torch.equal(swizzled[:, :32], h[:, :32]) and torch.equal(swizzled[:, 32:64], h[:, 96:128])
    assert torch.equal(layout.unswizzle(swizzled), h)
    with pytest.raises(ValueError, match="do not divide"):
        layout.row_order(80)


@pytest.mark.parametrize(("quant", "K"), [(int4_w4a16(128, zero_point=True), 256), (int4_w4a16(64), 192),
                                          (mxfp4_w4a16(), 256)])
def test_gemm_reads_4bit_codes_in_any_memory_order(quant, K):
    """The kernel takes the [E, N, K tile, word] codes through their strides: the same values stored
    tile-major, row-major or K-major give the same result (benchmarks/gpu/layout_ab.py times them)."""
    w = gemm1_operand(quant, K, seed=5)
    c = w.codes
    orders = {"tile-major": stored_tile_major(c), "row-major": c.contiguous(), "K-major": stored_k_major(c)}
    for name, codes in orders.items():
        assert gemm1_error(dataclasses.replace(w, codes=codes), GemmConfig(16, 64, 2, 4, 2, True)) < 1e-3, name
