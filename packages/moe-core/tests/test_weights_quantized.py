"""GPTQ, AWQ, block FP8 and gpt-oss MXFP4 checkpoints read through `load_layer`.

AWQ is checked against a fixture packed by AutoAWQ's own `WQLinear_GEMM.from_linear` and the
values its own `dequantize_gemm` recovers (scripts/make_awq_fixtures.py). GPTQ tensors are built
from the format's documented packing (`moe_core.weights.writers.gptq_tensors`, AutoGPTQ's pack loop)
because no GPTQ packer installs cheaply here: auto-gptq needs transformers < 5 and gptqmodel a CUDA
torch stack. MXFP4 is cross-checked against transformers' own `convert_moe_packed_tensors`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from moe_core import MoEConfig, fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16
from moe_core.config import Activation
from moe_core.weights import CheckpointError, ExpertWeights, load_layer
from moe_core.weights.writers import (
    awq_tensors,
    block_fp8_tensors,
    gpt_oss_mxfp4_tensors,
    gptq_tensors,
    write_model_dir,
)

E, K, N = 4, 64, 32
MLP = "model.layers.0.mlp"
PREFIX = f"{MLP}.experts"
FIXTURES = Path(__file__).parent / "fixtures"


def _config(quantization_config: dict | None, model_type: str = "qwen3_moe") -> dict:
    cfg = {"model_type": model_type, "hidden_size": K, "moe_intermediate_size": N, "num_experts": E,
           "num_experts_per_tok": 2}
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    return cfg


def _moe(has_bias: bool = False, activation: Activation | None = None) -> MoEConfig:
    return MoEConfig(num_experts=E, top_k=2, hidden_size=K, intermediate_size=N, dtype=torch.float16,
                     has_bias=has_bias, activation=activation or Activation.silu())


def _write(tmp_path: Path, tensors: dict, qc: dict | None, model_type: str = "qwen3_moe", shards: int = 1) -> Path:
    tensors = dict(tensors)
    tensors[f"{MLP}.gate.weight"] = torch.randn(E, K).half()
    return write_model_dir(tmp_path / "model", tensors, _config(qc, model_type), shards)


def _assert_same(got: ExpertWeights, ref: ExpertWeights) -> None:
    assert got.key == ref.key
    for name, t in ref.tensors().items():
        assert torch.equal(getattr(got, name), t), name
    assert set(got.tensors()) == set(ref.tensors())


# ---- GPTQ ---------------------------------------------------------------------------------


def _gptq_qc(bits=4, group_size=32, sym=True, desc_act=False, fmt="gptq") -> dict:
    return {"quant_method": "gptq", "bits": bits, "group_size": group_size, "sym": sym, "desc_act": desc_act,
            "checkpoint_format": fmt}


@pytest.mark.parametrize(("bits", "group_size", "sym", "desc_act", "fmt"), [
    (4, 32, True, False, "gptq"),
    (4, 32, False, False, "gptq"),
    (4, 32, False, False, "gptq_v2"),
    (4, 32, True, True, "gptq"),
    (4, -1, False, False, "gptq"),
    (8, 32, True, False, "gptq"),
    (8, 16, False, True, "gptq"),
])
def test_gptq_round_trip(tmp_path, bits, group_size, sym, desc_act, fmt):
    factory = int4_w4a16 if bits == 4 else int8_w8a16
    quant = factory(group_size, zero_point=not sym, act_order=desc_act, scale_dtype="fp16")
    ref = ExpertWeights.random(_moe(), quant, seed=bits + group_size)
    d = _write(tmp_path, gptq_tensors(ref, PREFIX, v1_zeros=fmt == "gptq"),
               _gptq_qc(bits, group_size, sym, desc_act, fmt))
    loaded = load_layer(d, 0)
    assert loaded.format == "gptq" and loaded.quant == quant
    _assert_same(loaded.weights, ref)


def test_gptq_known_bits():
    """Documented packing: input k = 8r + i sits at bits 4i of qweight word r (lowest k lowest)."""
    from moe_core.weights._intquant import unpack_int32

    word = torch.tensor([[0x87654321 - (1 << 32)]], dtype=torch.int32)
    assert unpack_int32(word, 4, dim=0).flatten().tolist() == [1, 2, 3, 4, 5, 6, 7, 8]


def test_gptq_v1_zero_zero_wraps(tmp_path):
    """v1 stores zero - 1 masked to the field: a zero of 0 is stored as 15 and must read back as 0."""
    quant = int4_w4a16(32, zero_point=True, scale_dtype="fp16")
    ref = ExpertWeights.random(_moe(), quant, seed=3)
    zero = ref.w13_zero.clone()
    zero[0, 0, 0] = 0
    ref = ExpertWeights(ref.key, ref.w13, ref.w2, ref.w13_scale, ref.w2_scale, zero, ref.w2_zero)
    loaded = load_layer(_write(tmp_path, gptq_tensors(ref, PREFIX), _gptq_qc(sym=False)), 0)
    assert int(loaded.weights.w13_zero[0, 0, 0]) == 0
    _assert_same(loaded.weights, ref)


def test_gptq_permuted_g_idx_without_desc_act_is_refused(tmp_path):
    ref = ExpertWeights.random(_moe(), int4_w4a16(32, act_order=True, scale_dtype="fp16"), seed=4)
    d = _write(tmp_path, gptq_tensors(ref, PREFIX), _gptq_qc(desc_act=False))
    with pytest.raises(CheckpointError, match=r"permuted.*does not enable act-order"):
        load_layer(d, 0)


def test_gptq_errors(tmp_path):
    ref = ExpertWeights.random(_moe(), int4_w4a16(32, zero_point=True, scale_dtype="fp16"), seed=5)
    tensors = gptq_tensors(ref, PREFIX)
    missing = dict(tensors)
    del missing[f"{PREFIX}.1.up_proj.qzeros"]
    with pytest.raises(CheckpointError, match=r"experts\.1\.up_proj\.qzeros' is missing \(expected shape \[2, 4\]\)"):
        load_layer(_write(tmp_path / "a", missing, _gptq_qc(sym=False)), 0)
    shaped = dict(tensors)
    shaped[f"{PREFIX}.0.down_proj.scales"] = torch.randn(2, K + 8).half()
    with pytest.raises(CheckpointError, match=r"down_proj\.scales' has shape \[2, 72\], expected \[1, 64\]"):
        load_layer(_write(tmp_path / "b", shaped, _gptq_qc(sym=False)), 0)
    typed = dict(tensors)
    typed[f"{PREFIX}.0.gate_proj.qweight"] = typed[f"{PREFIX}.0.gate_proj.qweight"].to(torch.int64)
    with pytest.raises(CheckpointError, match=r"gate_proj\.qweight' has dtype int64, expected int32"):
        load_layer(_write(tmp_path / "c", typed, _gptq_qc(sym=False)), 0)
    for qc, msg in ((_gptq_qc(bits=3), "bits=3 is not supported"),
                    (_gptq_qc(fmt="marlin"), "checkpoint_format='marlin' is not supported"),
                    ({**_gptq_qc(), "dynamic": {"re:.*": {"bits": 8}}}, "dynamic"),
                    ({"quant_method": "gptq", "bits": 4}, "no 'group_size'")):
        with pytest.raises(ValueError, match=msg):
            load_layer(_write(tmp_path / "d", tensors, qc), 0)


def _act_order_per_half(quant, seed: int, differing_experts=range(E)) -> ExpertWeights:
    """Weights whose gate and up rows were calibrated apart: each half its own act-order permutation
    (the same one for experts outside `differing_experts`)."""
    gen = torch.Generator().manual_seed(seed)
    g = quant.weight.group_size

    def grouping(k: int) -> torch.Tensor:
        return (torch.randperm(k, generator=gen) // g).int()

    gate = torch.stack([grouping(K) for _ in range(E)])
    up = torch.stack([grouping(K) if e in differing_experts else gate[e] for e in range(E)])
    w2_g_idx = torch.stack([grouping(N) for _ in range(E)])
    w13 = torch.randn(E, 2 * N, K, generator=gen) * K ** -0.5
    w2 = torch.randn(E, K, N, generator=gen) * N ** -0.5
    return ExpertWeights.from_float(w13, w2, quant, g_idx=(torch.stack([gate, up], 1), w2_g_idx))


@pytest.mark.parametrize(("bits", "sym"), [(4, True), (4, False), (8, True)])
def test_gptq_gate_and_up_with_different_g_idx(tmp_path, bits, sym):
    """Producers calibrate each Linear apart: gate_proj and up_proj keep their own g_idx, read into
    the per-half form [E, 2, K] (here only expert 2's halves differ: the whole layer takes the form)."""
    factory = int4_w4a16 if bits == 4 else int8_w8a16
    quant = factory(32, zero_point=not sym, act_order=True, scale_dtype="fp16")
    ref = _act_order_per_half(quant, seed=6 + bits, differing_experts=(2,))
    ref.validate(_moe(), quant)
    tensors = gptq_tensors(ref, PREFIX)
    assert not torch.equal(tensors[f"{PREFIX}.2.gate_proj.g_idx"], tensors[f"{PREFIX}.2.up_proj.g_idx"])
    assert torch.equal(tensors[f"{PREFIX}.1.gate_proj.g_idx"], tensors[f"{PREFIX}.1.up_proj.g_idx"])
    loaded = load_layer(_write(tmp_path, tensors, _gptq_qc(bits, 32, sym, desc_act=True)), 0)
    assert loaded.weights.w13_g_idx.shape == (E, 2, K)
    _assert_same(loaded.weights, ref)
    # An expert-parallel shard whose experts' halves agree reads as one grouping.
    shard = load_layer(_write(tmp_path / "shard", tensors, _gptq_qc(bits, 32, sym, desc_act=True)), 0, experts=[0, 1])
    assert torch.equal(shard.weights.w13_g_idx, ref.w13_g_idx[:2, 0])


def test_gptq_halves_that_agree_read_as_one_g_idx(tmp_path):
    quant = int4_w4a16(32, act_order=True, scale_dtype="fp16")
    ref = _act_order_per_half(quant, seed=9, differing_experts=())
    loaded = load_layer(_write(tmp_path, gptq_tensors(ref, PREFIX), _gptq_qc(desc_act=True)), 0)
    assert loaded.weights.w13_g_idx.shape == (E, K)
    assert torch.equal(loaded.weights.w13_g_idx, ref.w13_g_idx[:, 0])
    for (a, b) in zip(loaded.weights.dequantize(), ref.dequantize()):
        assert torch.equal(a, b)


# ---- AWQ ----------------------------------------------------------------------------------


def test_awq_fixture_from_autoawq_matches_its_dequantization():
    """tests/fixtures/awq/model was packed by AutoAWQ 0.2.9's WQLinear_GEMM.from_linear; reference.safetensors
    holds what AutoAWQ's own dequantize_gemm recovers (computed in fp16, hence the tolerance)."""
    d = FIXTURES / "awq"
    loaded = load_layer(d / "model", 0)
    assert loaded.format == "awq" and loaded.quant == int4_w4a16(32, zero_point=True, scale_dtype="fp16")
    ref = load_file(d / "reference.safetensors")
    w13, w2 = loaded.weights.dequantize()
    for e in range(2):
        r13 = torch.cat([ref[f"{PREFIX}.{e}.gate_proj.weight"], ref[f"{PREFIX}.{e}.up_proj.weight"]]).float()
        torch.testing.assert_close(w13[e], r13, rtol=1e-3, atol=2e-4)
        torch.testing.assert_close(w2[e], ref[f"{PREFIX}.{e}.down_proj.weight"].float(), rtol=1e-3, atol=2e-4)
    assert loaded.router_weight.shape == (2, 64) and loaded.top_k == 1


def test_awq_writer_round_trip_and_known_bits(tmp_path):
    from moe_core.weights._intquant import unpack_int32
    from moe_core.weights.awq import AWQ_PACK_ORDER

    # Field i holds column [0,2,4,6,1,3,5,7][i]: columns 0..7 = 0..7 pack to 0x75316420.
    word = torch.tensor([[0x75316420]], dtype=torch.int32)
    assert unpack_int32(word, 4, dim=1, order=AWQ_PACK_ORDER).flatten().tolist() == list(range(8))
    quant = int4_w4a16(32, zero_point=True, scale_dtype="fp16")
    ref = ExpertWeights.random(_moe(), quant, seed=7)
    qc = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
    _assert_same(load_layer(_write(tmp_path, awq_tensors(ref, PREFIX), qc), 0).weights, ref)


def test_awq_refusals_and_errors(tmp_path):
    ref = ExpertWeights.random(_moe(), int4_w4a16(32, zero_point=True, scale_dtype="fp16"), seed=8)
    tensors = awq_tensors(ref, PREFIX)
    qc = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
    for bad, msg in (({"version": "gemv"}, "version='gemv' is not supported"),
                     ({"zero_point": False}, "zero_point=false"),
                     ({"bits": 8}, "bits=8 is not supported")):
        with pytest.raises(ValueError, match=msg):
            load_layer(_write(tmp_path / "a", tensors, {**qc, **bad}), 0)
    shaped = dict(tensors)
    shaped[f"{PREFIX}.3.gate_proj.qzeros"] = torch.zeros(1, 4, dtype=torch.int32) + 7
    with pytest.raises(CheckpointError, match=r"experts\.3\.gate_proj\.qzeros' has shape \[1, 4\], expected \[2, 4\]"):
        load_layer(_write(tmp_path / "b", shaped, qc), 0)
    typed = dict(tensors)
    typed[f"{PREFIX}.0.up_proj.scales"] = typed[f"{PREFIX}.0.up_proj.scales"].to(torch.int16)
    with pytest.raises(CheckpointError, match=r"up_proj\.scales' has dtype int16"):
        load_layer(_write(tmp_path / "c", typed, qc), 0)


# ---- block FP8 ----------------------------------------------------------------------------


def _fp8_qc(block=(32, 32), **extra) -> dict:
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block),
            **extra}


def test_block_fp8_round_trip(tmp_path):
    quant = fp8_w8a8("block", block=(32, 32))
    ref = ExpertWeights.random(_moe(), quant, seed=9)
    loaded = load_layer(_write(tmp_path, block_fp8_tensors(ref, PREFIX), _fp8_qc(), "deepseek_v3"), 0)
    assert loaded.format == "fp8" and loaded.quant == quant
    _assert_same(loaded.weights, ref)


def test_block_fp8_e8m0_scales_read_exactly(tmp_path):
    ref = ExpertWeights.random(_moe(), fp8_w8a8("block", block=(32, 32)), seed=10)
    tensors = block_fp8_tensors(ref, PREFIX)
    for k in [k for k in tensors if k.endswith("weight_scale_inv")]:
        tensors[k] = torch.exp2(torch.round(torch.log2(tensors[k]))).to(torch.float8_e8m0fnu)
    loaded = load_layer(_write(tmp_path, tensors, _fp8_qc()), 0)
    assert torch.equal(loaded.weights.w2_scale[1], tensors[f"{PREFIX}.1.down_proj.weight_scale_inv"].float())


def test_block_fp8_refusals_and_errors(tmp_path):
    ref = ExpertWeights.random(_moe(), fp8_w8a8("block", block=(32, 32)), seed=11)
    tensors = block_fp8_tensors(ref, PREFIX)
    for qc, msg in (({**_fp8_qc(), "activation_scheme": "static"}, "activation_scheme='static'"),
                    ({"quant_method": "fp8"}, "without weight_block_size"),
                    (_fp8_qc(block=(128, 128)), r"gate_proj\.weight_scale_inv' has shape \[1, 2\], expected \[1, 1\]"),
                    (_fp8_qc(block=(64, 32)), "has 32 rows, not a multiple of the block rows 64")):
        with pytest.raises(ValueError, match=msg):
            load_layer(_write(tmp_path / "a", tensors, qc), 0)
    typed = dict(tensors)
    typed[f"{PREFIX}.2.down_proj.weight"] = typed[f"{PREFIX}.2.down_proj.weight"].float()
    with pytest.raises(CheckpointError, match=r"down_proj\.weight' has dtype float32, expected float8_e4m3fn"):
        load_layer(_write(tmp_path / "b", typed, _fp8_qc()), 0)
    shaped = dict(tensors)
    shaped[f"{PREFIX}.0.up_proj.weight_scale_inv"] = torch.rand(2, 3)
    with pytest.raises(CheckpointError, match=r"up_proj\.weight_scale_inv' has shape \[2, 3\], expected \[1, 2\]"):
        load_layer(_write(tmp_path / "c", shaped, _fp8_qc()), 0)


# ---- gpt-oss MXFP4 ------------------------------------------------------------------------


def _gpt_oss_config() -> MoEConfig:
    return MoEConfig(num_experts=E, top_k=2, hidden_size=K, intermediate_size=N, dtype=torch.bfloat16,
                     has_bias=True, activation=Activation.swiglu_oai(1.702, 7.0))


def test_mxfp4_round_trip_and_transformers_dequantization(tmp_path):
    ref = ExpertWeights.random(_gpt_oss_config(), mxfp4_w4a16(), seed=12)
    tensors = gpt_oss_mxfp4_tensors(ref, PREFIX)
    loaded = load_layer(_write(tmp_path, tensors, {"quant_method": "mxfp4"}, "gpt_oss"), 0)
    assert loaded.format == "mxfp4" and loaded.quant == mxfp4_w4a16()
    _assert_same(loaded.weights, ref)
    # transformers' own dequantization gives GptOssExperts' [E, in, out] tensors with gate/up interleaved
    # along the last dim; de-interleaved and transposed they must equal our canonical dequantization.
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    gu = mxfp4.convert_moe_packed_tensors(tensors[f"{PREFIX}.gate_up_proj_blocks"],
                                          tensors[f"{PREFIX}.gate_up_proj_scales"], dtype=torch.float32)
    down = mxfp4.convert_moe_packed_tensors(tensors[f"{PREFIX}.down_proj_blocks"],
                                            tensors[f"{PREFIX}.down_proj_scales"], dtype=torch.float32)
    w13, w2 = loaded.weights.dequantize()
    assert torch.equal(torch.cat([gu[..., ::2], gu[..., 1::2]], -1).transpose(1, 2), w13)
    assert torch.equal(down.transpose(1, 2), w2)


def test_mxfp4_errors(tmp_path):
    ref = ExpertWeights.random(_gpt_oss_config(), mxfp4_w4a16(), seed=13)
    tensors = gpt_oss_mxfp4_tensors(ref, PREFIX)
    for key, value, msg in (
        ("down_proj_scales", None, r"down_proj_scales' is missing \(expected shape \[4, 64, 1\]\)"),
        ("gate_up_proj_blocks", torch.zeros(E, 2 * N, 2, 8, dtype=torch.uint8), r"expected \[4, \*, \*, 16\]"),
        ("gate_up_proj_scales", torch.zeros(E, 2 * N, 2, dtype=torch.int8), "dtype int8, expected uint8"),
        ("gate_up_proj_bias", torch.zeros(E, 2 * N, dtype=torch.int32), "gate_up_proj_bias' has dtype int32"),
    ):
        bad = dict(tensors)
        if value is None:
            del bad[f"{PREFIX}.{key}"]
        else:
            bad[f"{PREFIX}.{key}"] = value
        with pytest.raises(CheckpointError, match=msg):
            load_layer(_write(tmp_path / key, bad, {"quant_method": "mxfp4"}, "gpt_oss"), 0)
    no_blocks = {k.replace("_blocks", ""): v for k, v in tensors.items() if "scales" not in k}
    with pytest.raises(CheckpointError, match=r"quant_method mxfp4 but tensor .*gate_up_proj_blocks' is missing"):
        load_layer(_write(tmp_path / "nob", no_blocks, {"quant_method": "mxfp4"}, "gpt_oss"), 0)


@pytest.mark.parametrize("dim", [0, 1])
def test_int4_words_taken_as_packed_bytes_equal_unpacking_and_packing(dim):
    # Every bit pattern a word can hold, along either packing dimension (GPTQ packs along rows,
    # compressed-tensors along columns): the bytes as they are must equal unpack + pack_int4.
    from moe_core.weights._intquant import int4_words_as_packed, unpack_int32
    from moe_core.weights.packing import pack_int4

    gen = torch.Generator().manual_seed(7)
    words = torch.randint(-2**31, 2**31, (6, 10), dtype=torch.int64, generator=gen).to(torch.int32)
    codes = unpack_int32(words, 4, dim=dim)
    rows_first = codes.t() if dim == 0 else codes  # [out, in]
    size = rows_first.shape[1]
    assert torch.equal(int4_words_as_packed(words, dim, size), pack_int4(rows_first))
    # A size that ends inside the last word (compressed-tensors pads in_features up to whole words).
    assert torch.equal(int4_words_as_packed(words, dim, size - 6), pack_int4(rows_first[:, :size - 6]))
    assert int4_words_as_packed(words, dim, size - 1) is None  # odd: no whole bytes
