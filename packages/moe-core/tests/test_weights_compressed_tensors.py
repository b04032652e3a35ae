"""compressed-tensors pack-quantized and float-quantized (fp8) checkpoints, produced by its own code.

Scales and zero points come from its `calculate_qparams`, codes are quantized and packed by its
`PackedQuantizationCompressor.compress`, config.json's `quantization_config` is its
`QuantizationConfig.model_dump`, and the expected weights are its own `decompress`. Activation
order "group" (g_idx) was removed from compressed-tensors 0.20, so that case packs with its
`pack_to_int32` but takes the grouping from the documented `weight_g_idx` semantics. fp8 checkpoints
start from its presets (FP8_DYNAMIC, FP8_BLOCK, FP8), are compressed by its `FloatQuantizationCompressor`
and compared with its `decompress` and with the float weights they came from.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

ct = pytest.importorskip("compressed_tensors")

from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

from moe_core import int4_w4a16  # noqa: E402
from moe_core.quant import fp8_w8a8  # noqa: E402
from moe_core.weights import CheckpointError, ExpertWeights, load_layer  # noqa: E402
from moe_core.weights.writers import write_model_dir  # noqa: E402

E, K, N = 3, 64, 32
MLP = "model.layers.2.mlp"
PREFIX = f"{MLP}.experts"
PROJ_SHAPES = {"gate_proj": (N, K), "up_proj": (N, K), "down_proj": (K, N)}


def _scheme(bits: int, symmetric: bool, group_size: int | None) -> QuantizationScheme:
    strategy = "channel" if group_size is None else "group"
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy=strategy, group_size=group_size)
    return QuantizationScheme(targets=["Linear"], weights=args)


def _compress(w: torch.Tensor, scheme: QuantizationScheme) -> dict[str, torch.Tensor]:
    args = scheme.weights
    g = w.shape[1] if args.group_size is None else args.group_size
    blocks = w.view(w.shape[0], -1, g)
    scale, zero = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args)
    state = {"weight": w, "weight_scale": scale.to(w.dtype), "weight_zero_point": zero}
    return PackedQuantizationCompressor.compress(state, scheme)


def _quantization_config(scheme: QuantizationScheme, ignore: list[str]) -> dict:
    cfg = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized", ignore=ignore,
                             quantization_status="compressed")
    return json.loads(json.dumps(cfg.model_dump(exclude_none=True), default=str))


def _checkpoint(tmp_path, scheme, ignore=("lm_head", "re:.*mlp.gate$"), seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    tensors, expected = {}, {}
    for e in range(E):
        for proj, shape in PROJ_SHAPES.items():
            w = (torch.randn(*shape, generator=gen) * shape[1] ** -0.5).to(dtype)
            name = f"{PREFIX}.{e}.{proj}"
            packed = _compress(w, scheme)
            tensors.update({f"{name}.{k}": v for k, v in packed.items()})
            expected[name] = PackedQuantizationCompressor.decompress(packed, scheme)["weight"].float()
    tensors[f"{MLP}.gate.weight"] = torch.randn(E, K, generator=gen)
    config = {"model_type": "qwen3_moe", "hidden_size": K, "moe_intermediate_size": N, "num_experts": E,
              "num_experts_per_tok": 2, "quantization_config": _quantization_config(scheme, list(ignore))}
    return write_model_dir(tmp_path / "model", tensors, config), tensors, expected, config


@pytest.mark.parametrize(("bits", "symmetric", "group_size"), [
    (4, True, 32), (4, False, 32), (4, False, None), (8, True, None), (8, False, 16),
])
def test_round_trip_matches_compressed_tensors_decompress(tmp_path, bits, symmetric, group_size):
    d, _, expected, _ = _checkpoint(tmp_path, _scheme(bits, symmetric, group_size), seed=bits)
    loaded = load_layer(d, 2)
    assert loaded.format == "compressed-tensors"
    key = loaded.weights.key
    assert key.bits == bits and key.group_size == group_size and (key.zero_point.value == "none") == symmetric
    w13, w2 = loaded.weights.dequantize()
    for e in range(E):
        gate_up = torch.cat([expected[f"{PREFIX}.{e}.gate_proj"], expected[f"{PREFIX}.{e}.up_proj"]])
        torch.testing.assert_close(w13[e], gate_up)
        torch.testing.assert_close(w2[e], expected[f"{PREFIX}.{e}.down_proj"])


def test_bf16_scales_keep_their_dtype(tmp_path):
    d, _, expected, _ = _checkpoint(tmp_path, _scheme(4, True, 32), dtype=torch.bfloat16)
    weights = load_layer(d, 2).weights
    assert weights.key.scale.dtype == "bf16" and weights.w13_scale.dtype == torch.bfloat16
    torch.testing.assert_close(weights.dequantize()[1][0], expected[f"{PREFIX}.0.down_proj"], rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("per_half", [False, True], ids=["shared", "gate-up-apart"])
def test_actorder_group_g_idx(tmp_path, per_half):
    """weight_g_idx [K]: the documented act-order grouping; codes packed by compressed-tensors. Each
    Linear is calibrated on its own, so gate_proj and up_proj may carry different groupings."""
    quant = int4_w4a16(32, act_order=True, scale_dtype="fp32")
    gen = torch.Generator().manual_seed(5)
    w13, w2 = torch.randn(E, 2 * N, K, generator=gen), torch.randn(E, K, N, generator=gen)
    g13 = torch.stack([torch.randperm(K, generator=gen) // 32 for _ in range(2 * E if per_half else E)]).int()
    if per_half:
        g13 = g13.view(E, 2, K)
    g2 = torch.stack([torch.randperm(N, generator=gen) // 32 for _ in range(E)]).int()
    ref = ExpertWeights.from_float(w13, w2, quant, g_idx=(g13, g2))
    from moe_core.weights.packing import unpack_int4

    tensors = {}
    for e in range(E):
        for half, (proj, field, rows) in enumerate((("gate_proj", "w13", slice(0, N)),
                                                    ("up_proj", "w13", slice(N, None)), ("down_proj", "w2", slice(None)))):
            codes = unpack_int4(getattr(ref, field)[e, rows])
            name = f"{PREFIX}.{e}.{proj}"
            tensors[f"{name}.weight_packed"] = pack_to_int32((codes.int() - 8).to(torch.int8), 4)
            tensors[f"{name}.weight_scale"] = getattr(ref, f"{field}_scale")[e, rows].clone()
            tensors[f"{name}.weight_shape"] = torch.tensor(codes.shape)
            g_idx = getattr(ref, f"{field}_g_idx")[e]
            tensors[f"{name}.weight_g_idx"] = (g_idx[half] if g_idx.dim() == 2 else g_idx).clone()
    scheme = _quantization_config(_scheme(4, True, 32), ["lm_head"])
    scheme["config_groups"]["group_0"]["weights"]["actorder"] = "group"  # as releases before 0.20 wrote it
    config = {"model_type": "qwen3_moe", "num_experts": E, "quantization_config": scheme}
    loaded = load_layer(write_model_dir(tmp_path / "m", tensors, config), 2)
    assert loaded.quant == quant
    for name, t in ref.tensors().items():
        assert torch.equal(getattr(loaded.weights, name), t), name


def test_ignored_experts_load_unquantized(tmp_path):
    gen = torch.Generator().manual_seed(6)
    tensors = {f"{PREFIX}.{e}.{p}.weight": torch.randn(*s, generator=gen) for e in range(E)
               for p, s in PROJ_SHAPES.items()}
    config = {"model_type": "qwen3_moe", "num_experts": E,
              "quantization_config": _quantization_config(_scheme(4, True, 32), ["re:.*experts.*"])}
    loaded = load_layer(write_model_dir(tmp_path / "m", tensors, config), 2)
    assert loaded.format == "unquantized" and not loaded.weights.key.quantized
    assert torch.equal(loaded.weights.w2[1], tensors[f"{PREFIX}.1.down_proj.weight"])


def test_partly_ignored_layer_is_refused(tmp_path):
    d, tensors, _, config = _checkpoint(tmp_path, _scheme(4, True, 32))
    config["quantization_config"]["ignore"] = [f"{PREFIX}.0.gate_proj"]
    write_model_dir(d, tensors, config)
    with pytest.raises(CheckpointError, match=r"resolve to different schemes \(.*experts\.0\.gate_proj -> unquantized"):
        load_layer(d, 2)


@pytest.mark.parametrize(("change", "message"), [
    ({"format": "nvfp4-pack-quantized"}, "format='nvfp4-pack-quantized'.*expected 'pack-quantized'"),
    ({"format": "float-quantized"}, r"format 'float-quantized'.*weights \(type='int', num_bits=4\) is not served"),
    ({"weights": {"strategy": "tensor"}}, "strategy='tensor' is not supported"),
    ({"weights": {"num_bits": 2}}, "num_bits=2 is not supported"),
    ({"weights": {"type": "float"}}, "type='float' is not supported"),
    ({"input_activations": {"num_bits": 8, "type": "float"}}, "quantizes activations"),
])
def test_unsupported_variants(tmp_path, change, message):
    d, tensors, _, config = _checkpoint(tmp_path, _scheme(4, True, 32))
    group = config["quantization_config"]["config_groups"]["group_0"]
    for k, v in change.items():
        if isinstance(v, dict) and k in group:
            group[k].update(v)
        else:
            group[k] = v
    write_model_dir(d, tensors, config)
    with pytest.raises(ValueError, match=message):
        load_layer(d, 2)


def _load_with(d, tensors: dict, config: dict, key: str, value: torch.Tensor | None):
    """load_layer of the checkpoint in `d` rewritten with expert tensor `key` replaced (None: removed)."""
    if value is None:
        del tensors[f"{PREFIX}.{key}"]
    else:
        tensors[f"{PREFIX}.{key}"] = value
    (d / "model.safetensors").unlink()
    write_model_dir(d, tensors, config)
    return load_layer(d, 2)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("1.up_proj.weight_shape", None, r"experts\.1\.up_proj\.weight_shape' is missing"),
    ("0.down_proj.weight_packed", torch.zeros(64, 3, dtype=torch.int32),
     r"down_proj\.weight_packed' has shape \[64, 3\], expected \[64, 4\]"),
    ("0.gate_proj.weight_packed", torch.zeros(32, 8, dtype=torch.int64), r"weight_packed' has dtype int64, expected int32"),
    ("2.gate_proj.weight_zero_point", None, r"experts\.2\.gate_proj\.weight_zero_point' is missing"),
    ("2.gate_proj.weight_scale", torch.rand(32, 3), r"weight_scale' has shape \[32, 3\], expected \[32, 2\]"),
])
def test_bad_tensors_are_named(tmp_path, key, value, message):
    d, tensors, _, config = _checkpoint(tmp_path, _scheme(4, False, 32))
    with pytest.raises(CheckpointError, match=message):
        _load_with(d, tensors, config, key, value)


# ---- float-quantized fp8 W8A8 ------------------------------------------------------------------------

FP8_K, FP8_N = 256, 128  # 128 x 128 blocks: gate and up rows each a whole number of block rows
FP8_SHAPES = {"gate_proj": (FP8_N, FP8_K), "up_proj": (FP8_N, FP8_K), "down_proj": (FP8_K, FP8_N)}
# (weights strategy, activations strategy) -> the scheme the layer loads as: per-tensor weight scales load
# per channel (gate and up each carry their own), exactly
FP8_CASES = {
    ("channel", "token"): fp8_w8a8("channel"),
    ("tensor", "token"): fp8_w8a8("channel"),
    ("tensor", "tensor"): fp8_w8a8("channel", activation_scales="tensor"),
    ("channel", "tensor"): fp8_w8a8("channel", activation_scales="tensor"),
    ("block", "group"): fp8_w8a8("block"),
}


def _fp8_scheme(weights: str, activations: str) -> QuantizationScheme:
    """compressed-tensors' own preset for the pair (FP8_DYNAMIC, FP8_BLOCK), its strategies replaced."""
    scheme = preset_name_to_scheme("FP8_BLOCK" if weights == "block" else "FP8_DYNAMIC", ["Linear"])
    if weights == "tensor":
        scheme.weights = QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True)
    if activations == "tensor":
        scheme.input_activations = QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True,
                                                     dynamic=True)
    return scheme


def _fp8_compress(w: torch.Tensor, scheme: QuantizationScheme) -> dict[str, torch.Tensor]:
    """Scales from compressed-tensors' calculate_qparams over each scale's region, codes from its compressor."""
    args, (rows, cols) = scheme.weights, w.shape
    if args.strategy == "tensor":
        regions = w.reshape(1, -1)
    elif args.strategy == "channel":
        regions = w
    else:  # zero-padded to whole blocks, as compressed-tensors pads (zero is in every scale's range anyway)
        br, bc = args.block_structure
        nr, nc = -(-rows // br), -(-cols // bc)
        padded = torch.nn.functional.pad(w, (0, nc * bc - cols, 0, nr * br - rows))
        regions = padded.view(nr, br, nc, bc).transpose(1, 2).reshape(nr, nc, -1)
    scale, _ = calculate_qparams(regions.amin(-1).float(), regions.amax(-1).float(), args)
    if args.strategy == "channel":
        scale = scale.view(rows, 1)
    state = {"weight": w, "weight_scale": scale.view(1) if args.strategy == "tensor" else scale}
    return FloatQuantizationCompressor.compress({k: v.to(w.dtype) if k != "weight" else v for k, v in state.items()},
                                                scheme)


def _fp8_checkpoint(tmp_path, scheme: QuantizationScheme, seed: int = 0, shards: int = 1):
    """(model dir, source float weights, compressed-tensors' own decompress in fp32) per projection."""
    gen = torch.Generator().manual_seed(seed)
    tensors, source, decompressed = {}, {}, {}
    for e in range(E):
        for proj, shape in FP8_SHAPES.items():
            w = (torch.randn(*shape, generator=gen) * shape[1] ** -0.5).bfloat16()
            name = f"{PREFIX}.{e}.{proj}"
            packed = _fp8_compress(w, scheme)
            tensors.update({f"{name}.{k}": v for k, v in packed.items()})
            source[name] = w.float()
            decompressed[name] = FloatQuantizationCompressor.decompress(
                {**packed, "weight_scale": packed["weight_scale"].float()}, scheme)["weight"]
    tensors[f"{MLP}.gate.weight"] = torch.randn(E, FP8_K, generator=gen)
    cfg = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized",
                             ignore=["lm_head", "re:.*mlp.gate$"], quantization_status="compressed")
    config = {"model_type": "qwen3_moe", "hidden_size": FP8_K, "moe_intermediate_size": FP8_N, "num_experts": E,
              "num_experts_per_tok": 2,
              "quantization_config": json.loads(json.dumps(cfg.model_dump(exclude_none=True), default=str))}
    return write_model_dir(tmp_path / "model", tensors, config, shards=shards), tensors, source, decompressed, config


def _rows(weights: dict, e: int, *projs: str) -> torch.Tensor:
    return torch.cat([weights[f"{PREFIX}.{e}.{p}"] for p in projs])


@pytest.mark.parametrize(("strategies", "shards"), [(s, 1 + i % 2) for i, s in enumerate(FP8_CASES)],
                         ids=lambda v: "-".join(v) if isinstance(v, tuple) else f"{v}files")
def test_fp8_matches_compressed_tensors_and_the_source_weights(tmp_path, strategies, shards):
    d, _, source, decompressed, _ = _fp8_checkpoint(tmp_path, _fp8_scheme(*strategies), seed=len(strategies[0]),
                                                    shards=shards)
    loaded = load_layer(d, 2)
    assert loaded.format == "compressed-tensors" and loaded.quant == FP8_CASES[strategies]
    assert loaded.weights.w13.dtype == torch.float8_e4m3fn
    w13, w2 = loaded.weights.dequantize()
    for e in range(E):
        for got, projs in ((w13[e], ("gate_proj", "up_proj")), (w2[e], ("down_proj",))):
            # compressed-tensors' decompress with fp32 scales is the same product: equal to rounding
            torch.testing.assert_close(got, _rows(decompressed, e, *projs), rtol=1e-6, atol=0)
            # against the float weights: e4m3 rounds to nearest, 3 mantissa bits (half a step: 2^-4 relative)
            # or, below the normal range, half the subnormal step of 2^-9 times the scale
            w = _rows(source, e, *projs)
            scale = w.abs().max() / 448
            assert bool(((got - w).abs() <= 2**-4 * w.abs() + 2**-10 * scale).all()), (e, projs)
            assert (got - w).abs().max() > 0  # the weights really went through fp8


def test_fp8_tensor_scales_of_gate_and_up_stay_apart(tmp_path):
    """Per-tensor scales: gate_proj and up_proj of one expert differ, and each row keeps its own."""
    d, tensors, _, _, _ = _fp8_checkpoint(tmp_path, _fp8_scheme("tensor", "token"), seed=7)
    weights = load_layer(d, 2).weights
    for e in range(E):
        gate, up = (tensors[f"{PREFIX}.{e}.{p}.weight_scale"].float() for p in ("gate_proj", "up_proj"))
        assert not torch.equal(gate, up)
        assert torch.equal(weights.w13_scale[e], torch.cat([gate.expand(FP8_N), up.expand(FP8_N)]))
        assert torch.equal(weights.w2_scale[e], tensors[f"{PREFIX}.{e}.down_proj.weight_scale"].float().expand(FP8_K))
        assert torch.equal(weights.w13[e].view(torch.uint8),
                           torch.cat([tensors[f"{PREFIX}.{e}.{p}.weight"] for p in ("gate_proj", "up_proj")]
                                     ).view(torch.uint8))


def test_fp8_reads_a_subset_of_experts(tmp_path):
    d, _, _, decompressed, _ = _fp8_checkpoint(tmp_path, _fp8_scheme("block", "group"), seed=8)
    weights = load_layer(d, 2, experts=[2, 0]).weights
    assert weights.num_experts == 2
    torch.testing.assert_close(weights.dequantize()[1][0], decompressed[f"{PREFIX}.2.down_proj"], rtol=1e-6, atol=0)


def _change(config: dict, role: str, **fields) -> None:
    group = config["quantization_config"]["config_groups"]["group_0"]
    if fields.pop("drop", False):
        del group[role]
    else:
        group[role].update(fields)


@pytest.mark.parametrize(("role", "fields", "message"), [
    ("input_activations", {"dynamic": False, "strategy": "tensor"},
     r"config_groups\.group_0\.input_activations\.dynamic=False is not served: .* no scheme applies a static "
     r"\(calibrated\) input_scale; expected true"),
    ("input_activations", {"dynamic": "local"}, r"input_activations\.dynamic='local' is not served"),
    ("weights", {"symmetric": False}, r"group_0\.weights\.symmetric=false is not served: fp8 codes have no zero "
                                      r"point .* expected symmetric true"),
    ("weights", {"strategy": "group", "group_size": 128},
     r"weights\.strategy='group' is not served with fp8 weights: expected 'tensor', 'channel' or 'block'"),
    ("input_activations", {"strategy": "group", "group_size": 128},
     r"input_activations\.strategy='group' is not served with 'channel' weights: expected 'token' or 'tensor'"),
    ("weights", {"num_bits": 4}, r"group_0\.weights \(type='float', num_bits=4\) is not served: expected type "
                                 r"'float' with num_bits 8"),
    ("input_activations", {"type": "int"}, r"input_activations \(type='int', num_bits=8\) is not served"),
    ("input_activations", {"drop": True}, r"input_activations=None: fp8 weights with 16-bit activations are not "
                                          r"read; expected fp8 W8A8"),
])
def test_fp8_refusals_name_the_file_group_field_and_what_is_read(tmp_path, role, fields, message):
    d, _, _, _, config = _fp8_checkpoint(tmp_path, _fp8_scheme("channel", "token"))
    _change(config, role, **fields)
    (d / "config.json").write_text(json.dumps(config))
    where = re.escape(f"{d / 'config.json'}: compressed-tensors format 'float-quantized': quantization_config.")
    with pytest.raises(CheckpointError, match=rf"^{where}.*{message}"):
        load_layer(d, 2)


@pytest.mark.parametrize(("fields", "message"), [
    ({"strategy": "token"}, r"\(strategy='token', group_size=128\) is not served with block \[128, 128\] weights: "
                            r"expected strategy 'group' with group_size 128"),
    ({"group_size": 64}, r"\(strategy='group', group_size=64\) is not served with block \[128, 128\] weights"),
])
def test_fp8_block_weights_need_activation_groups_of_the_block_columns(tmp_path, fields, message):
    d, _, _, _, config = _fp8_checkpoint(tmp_path, _fp8_scheme("block", "group"))
    _change(config, "input_activations", **fields)
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        load_layer(d, 2)


def test_fp8_static_input_scales_from_the_fp8_preset_are_refused(tmp_path):
    """The FP8 preset calibrates a static per-tensor input_scale: refused by the config, before any tensor."""
    d, tensors, _, _, config = _fp8_checkpoint(tmp_path, _fp8_scheme("tensor", "token"))
    preset = preset_name_to_scheme("FP8", ["Linear"])
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = json.loads(
        preset.input_activations.model_dump_json(exclude_none=True))
    for e in range(E):
        for p in FP8_SHAPES:
            tensors[f"{PREFIX}.{e}.{p}.input_scale"] = torch.rand(1, dtype=torch.bfloat16) + 0.1
    (d / "model.safetensors").unlink()
    write_model_dir(d, tensors, config)
    with pytest.raises(CheckpointError, match=r"input_activations\.dynamic=False is not served"):
        load_layer(d, 2)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("0.up_proj.weight", torch.randn(FP8_N, FP8_K).bfloat16(),
     r"experts\.0\.up_proj\.weight' has dtype bfloat16, expected float8_e4m3fn"),
    ("1.down_proj.weight_scale", torch.rand(FP8_K), r"down_proj\.weight_scale' has shape \[256\], expected \[256, 1\]"),
    ("2.gate_proj.weight_scale", None, r"experts\.2\.gate_proj\.weight_scale' is missing"),
    ("1.gate_proj.weight_zero_point", torch.zeros(FP8_N, 1), r"not part of the compressed-tensors expert format "
                                                             r"and would be ignored: .*gate_proj\.weight_zero_point"),
])
def test_fp8_bad_tensors_are_named(tmp_path, key, value, message):
    d, tensors, _, _, config = _fp8_checkpoint(tmp_path, _fp8_scheme("channel", "token"))
    with pytest.raises(CheckpointError, match=message):
        _load_with(d, tensors, config, key, value)


def test_fp8_block_rows_must_not_straddle_gate_and_up(tmp_path):
    scheme = _fp8_scheme("block", "group")
    scheme.weights.block_structure = [96, 128]  # 128 gate rows: the second block row would take up rows too
    d, *_ = _fp8_checkpoint(tmp_path, scheme)
    with pytest.raises(CheckpointError, match=r"experts\.0\.up_proj\.weight has 128 rows, not a multiple of the "
                                              r"block rows 96: gate and up cannot share one block grid"):
        load_layer(d, 2)
