"""The quantized GEMM's weight layouts (`quant_gemm_details._layouts`): each a round trip, the
processors' packing, K padding of the quads layout, the kernel reading codes in any memory order,
and the e2m1 unpack of MXFP4 quads (`_dequant`) against the e2m1 values.
"""

import dataclasses
import re

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from _quant_support import DEV, RUN_ON, gemm1_error, gemm1_operand, rel_l2, run_layer

from moe_core.config import Activation, MoEConfig
from moe_core.quant import int4_w4a16, mxfp4_w4a16
from moe_core.weights.canonical import ExpertWeights
from moe_core.weights.packing import E2M1_VALUES
from moe_triton.configs import GemmConfig
from moe_triton.quant_gemm_details._dequant import (
    dequantize_operand,
    dequantize_padded,
    e2m1_quarter_ptx,
    e2m1_weights,
    quarter_e8m0_factors,
    unpack_e2m1_quads,
)
from moe_triton.quant_gemm_details._layouts import (
    E2M1_FIELDS,
    E8M0_FOLDED_BIAS,
    E8M0_WORD_BYTES,
    INT4_NIBBLES,
    ByteQuadsLayout,
    GateUpInterleave,
    HalvesLayout,
    QuadsLayout,
    pack_e8m0_tiles,
    stored_k_major,
    stored_tile_major,
    unpack_e8m0_tiles,
)
from moe_triton.quantized import TritonMxfp4Experts, TritonWna16Experts


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


def test_mxfp4_pads_k_to_whole_quads_tiles():
    """MXFP4 whose K 128 does not divide (gpt-oss's 2880; 192 here): the quads layout padded to whole
    tiles with code 0 and e8m0 exponent 0, the padding dequantizing to exactly 0; every scale of
    ExpertWeights.random is at most 2^1, so both GEMMs take the folded scale."""
    w = gemm1_operand(mxfp4_w4a16(), 192, seed=4)
    assert w.quads and w.codes.dtype == torch.int16 and w.k == 192 and w.k_tiles == 2 and w.codes.shape[2] == 2
    exps = unpack_e8m0_tiles(w.scale, w.folded_scale)
    assert w.scale.dtype == torch.int32 and w.scale.shape[1] == 2
    assert exps.shape[1] == 256 // 32 and bool((exps[:, 6:] == 0).all()) and w.folded_scale
    full = dequantize_padded(w)
    assert full.shape[2] == 256 and bool((full[:, :, 192:] == 0).all()) and bool((full[:, :, :192] != 0).any())
    for M in (1, 9):
        out, ref = run_layer(TritonMxfp4Experts, mxfp4_w4a16(), Activation.swiglu_oai(), torch.bfloat16, K=192, N=192,
                             bias=True, M=M)
        assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("folded", [False, True])
def test_e8m0_tile_words_round_trip(folded):
    """MXFP4 exponents [E, 4T, N] -> int32 words [E, T, N] whose byte E8M0_WORD_BYTES[j] (value bits
    8b..8b+7) is group 4t + j's exponent of row n (folded, every exponent at most 128: plus
    E8M0_FOLDED_BIAS), and back; one exponent above 128 leaves the tensor unfolded; groups not a multiple
    of 4 and other dtypes refused."""
    gen = torch.Generator().manual_seed(11)
    exps = torch.randint(0, 129 if folded else 256, (3, 8, 40), generator=gen, dtype=torch.uint8)
    if not folded:
        exps[0, 0, 0] = 129  # the least that does not fold
    words, packed_folded = pack_e8m0_tiles(exps)
    assert packed_folded == folded
    assert words.dtype == torch.int32 and words.shape == (3, 2, 40)
    as_int = words.long() & 0xFFFFFFFF
    bias = E8M0_FOLDED_BIAS if folded else 0
    for t in range(2):
        for j in range(4):
            byte = (as_int[:, t] >> (8 * E8M0_WORD_BYTES[j])) & 0xFF
            assert torch.equal(byte, exps[:, 4 * t + j].long() + bias)
    assert torch.equal(unpack_e8m0_tiles(words, folded), exps)
    assert torch.equal(unpack_e8m0_tiles(words.transpose(1, 2).contiguous().transpose(1, 2), folded), exps)
    with pytest.raises(ValueError, match="multiple of 4 groups"):
        pack_e8m0_tiles(exps[:, :6])
    with pytest.raises(ValueError, match="uint8"):
        pack_e8m0_tiles(exps.to(torch.int32))


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
        torch.testing.assert_close(bias.cpu(), want_bias.cpu(), rtol=0, atol=0)


def test_int4_tile_packing_roundtrip():
    codes = torch.randint(0, 256, (2, 3, 64), dtype=torch.uint8)
    packed = HalvesLayout(64).swizzle(codes)
    assert packed.shape == (2, 3, 2, 32)
    assert packed.stride() == (192, 1, 96, 3)  # K-major: one K tile's byte rows, N contiguous
    unpacked = HalvesLayout(64).unswizzle(packed)
    assert torch.equal(unpacked[..., 0::2] | (unpacked[..., 1::2] << 4), codes)
    # Tile 1 of row 0: its first byte holds k=64 (low) and k=96 (high).
    assert int(packed[0, 0, 1, 0]) == int(unpacked[0, 0, 64]) | (int(unpacked[0, 0, 96]) << 4)


@pytest.mark.parametrize("code_bits", [INT4_NIBBLES, E2M1_FIELDS])
def test_quad_packing_roundtrip(code_bits):
    """int4 nibbles and MXFP4's e2m1 fields: a round trip, tile-major, quarter j's code of k =
    t * 128 + 32 j + i in word i of tile t at the word bits code_bits[j] names."""
    codes = torch.randint(0, 256, (2, 3, 256), dtype=torch.uint8)
    layout = QuadsLayout(128, code_bits)
    words = layout.swizzle(codes)
    assert words.shape == (2, 3, 4, 32) and words.dtype == torch.int16
    assert words.stride() == (384, 32, 96, 1)  # tile-major: one K tile's rows are contiguous
    unpacked = layout.unswizzle(words)
    assert torch.equal(unpacked[..., 0::2] | (unpacked[..., 1::2] << 4), codes)
    # Tile 1 of row 2, word 5: quarter j holds k = 128 + 32 j + 5.
    word = int(words[1, 2, 1, 5]) & 0xFFFF
    held = [sum(((word >> at) & 1) << b for b, at in enumerate(code_bits[j])) for j in range(4)]
    assert held == [int(unpacked[1, 2, 128 + 32 * j + 5]) for j in range(4)]
    with pytest.raises(ValueError, match="16 bits of a word"):
        QuadsLayout(128, (*INT4_NIBBLES[:3], (12, 13, 14, 14)))


def test_byte_quad_packing_roundtrip():
    """int8: a round trip, tile-major, quarter j's code of k = t * 128 + 32 j + i in byte j (bits
    8j..8j+7) of int32 word i of tile t; refused for a K that 128 does not divide."""
    codes = torch.randint(0, 256, (2, 3, 256), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    layout = ByteQuadsLayout(128)
    words = layout.swizzle(codes)
    assert words.shape == (2, 3, 2, 32) and words.dtype == torch.int32
    assert words.stride() == (192, 32, 96, 1)  # tile-major: one K tile's rows are contiguous
    assert torch.equal(layout.unswizzle(words), codes)
    word = int(words[1, 2, 1, 5]) & 0xFFFFFFFF
    assert [(word >> (8 * j)) & 0xFF for j in range(4)] == [int(codes[1, 2, 128 + 32 * j + 5]) for j in range(4)]
    with pytest.raises(ValueError, match="multiple of block_k"):
        layout.swizzle(codes[..., :192])


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


@triton.jit
def _e2m1_weights_kernel(words_ptr, exp_words_ptr, out_ptr, DT: tl.constexpr, PTX: tl.constexpr,
                         FOLDED: tl.constexpr, R: tl.constexpr, Q: tl.constexpr):
    """Quads words [R, Q] of one K tile and its exponent word per row (`pack_e8m0_tiles`) -> fp32
    weights [R, 4 quarters, Q], unpacked in DT and scaled by `quarter_e8m0_factors`, as the kernels do."""
    rows = tl.arange(0, R)
    cols = tl.arange(0, Q)
    words = tl.load(words_ptr + rows[:, None] * Q + cols[None, :])
    exp_words = tl.load(exp_words_ptr + rows)
    values = unpack_e2m1_quads(words, DT, PTX)
    for j in tl.static_range(4):
        lo, hi = quarter_e8m0_factors(exp_words, j, DT, FOLDED)
        tl.store(out_ptr + (rows[:, None] * 4 + j) * Q + cols[None, :],
                 e2m1_weights(values[j], lo, hi, FOLDED, tl.float32))


# e8m0 exponents: the extremes (2^-127, 2^127), around the folded scale's limit (128: 2^1) and between.
_FOLDABLE = [0, 1, 2, 63, 100, 119, 126, 127, 128]
_ANY = [*_FOLDABLE, 129, 130, 191, 252, 253, 254]


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")  # the interpreter's infs
@pytest.mark.parametrize(("dt", "ptx"), [("fp32", False), ("bf16", False), ("bf16", True)])
@pytest.mark.parametrize(("folded", "exps"), [(True, _FOLDABLE), (False, _ANY)])
def test_e2m1_unpack_is_exact_for_every_code_and_scale(dt, ptx, folded, exps):
    """The unpack of MXFP4 quads and the factors of their exponent words give every e2m1 code times
    every e8m0 scale exactly, as the fp32 reference (inf where its weight overflows: 2 * 2^127 and
    up), in all four quarters, each with its own exponent: the folded words up to 2^1, the two-factor
    ones for all. The portable unpack in fp32 everywhere; in bf16 (portable, and the PTX on NVIDIA)
    compiled only: the CPU interpreter flushes bf16 subnormals, which the unpacked codes are."""
    if dt == "bf16" and DEV.type == "cpu":
        pytest.skip("the CPU interpreter flushes bf16 subnormals")
    if ptx and torch.version.hip is not None:
        pytest.skip("PTX: NVIDIA only")
    R, K = 16, 128  # tl.arange's power of two: the exponents repeat
    exps_t = torch.tensor([[exps[(r + 5 * j) % len(exps)] for j in range(4)] for r in range(R)], dtype=torch.uint8)
    codes = (torch.arange(R * K) % 16).view(1, R, K).to(torch.uint8)  # each quarter sees every code twice
    words = QuadsLayout(128, E2M1_FIELDS).swizzle(codes[..., 0::2] | (codes[..., 1::2] << 4))[0, :, 0].contiguous()
    exp_words, packed_folded = pack_e8m0_tiles(exps_t.T.unsqueeze(0))
    assert packed_folded == folded
    exp_words = exp_words[0, 0]
    out = torch.empty(R, 4, 32, dtype=torch.float32, device=DEV)
    dtype = {"fp32": tl.float32, "bf16": tl.bfloat16}[dt]
    _e2m1_weights_kernel[(1,)](words.to(DEV), exp_words.to(DEV), out, DT=dtype, PTX=ptx, FOLDED=folded, R=R, Q=32)
    values = E2M1_VALUES.double()[codes[0].long()].view(R, 4, 32)
    want = torch.ldexp(values, exps_t.double().view(R, 4, 1) - 127).float()
    assert bool(torch.isinf(want).any()) != folded  # the largest scales overflow some weights, as in fp32
    assert torch.equal(out.cpu(), want)


def _run_ptx(asm: str, src: np.ndarray) -> dict[str, np.ndarray]:
    """The and / shl / shr / lop3 (0xEA: (a & b) | c) instructions of `asm` on uint32 registers, $4 = src."""
    regs: dict[str, np.ndarray] = {"$4": src}
    for instr in re.findall(r"(and|shl|shr|lop3)\.b32 ([^;]+);", asm):
        op, args = instr[0], [a.strip() for a in instr[1].split(",")]

        def val(a):
            return np.uint32(int(a, 16)) if a.startswith("0x") else (np.uint32(int(a)) if a.isdigit() else regs[a])

        if op == "and":
            regs[args[0]] = val(args[1]) & val(args[2])
        elif op == "shl":
            regs[args[0]] = val(args[1]) << val(args[2])
        elif op == "shr":
            regs[args[0]] = val(args[1]) >> val(args[2])
        else:
            assert args[4] == "0xEA", args
            regs[args[0]] = (val(args[1]) & val(args[2])) | val(args[3])
    return regs


def test_e2m1_ptx_places_each_quarter_as_a_bf16():
    """The PTX unpack (NVIDIA only, not run here), evaluated instruction by instruction on every 16-bit
    word in both halves of a register: quarter j of each word becomes the bf16 whose bits 6-8 are its
    code's mantissa and exponent and bit 15 its sign, every other bit zero (the portable unpack's bits)."""
    low = np.arange(1 << 16, dtype=np.uint32)
    src = low | (low[::-1] << np.uint32(16))
    asm = "{" + " ".join(e2m1_quarter_ptx(j, f"${j}", "$4") for j in range(4)) + "}"
    regs = _run_ptx(asm, src)
    for j, bits in enumerate(E2M1_FIELDS):
        for half in (0, 16):
            word = (src >> np.uint32(half)) & np.uint32(0xFFFF)
            code = sum(((word >> np.uint32(at)) & np.uint32(1)) << np.uint32(b) for b, at in enumerate(bits))
            want = ((code & np.uint32(7)) << np.uint32(6)) | ((code & np.uint32(8)) << np.uint32(12))
            assert np.array_equal((regs[f"${j}"] >> np.uint32(half)) & np.uint32(0xFFFF), want), (j, half)
