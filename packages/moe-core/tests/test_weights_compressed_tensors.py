"""compressed-tensors pack-quantized checkpoints, produced by compressed-tensors' own code.

Scales and zero points come from its `calculate_qparams`, codes are quantized and packed by its
`PackedQuantizationCompressor.compress`, config.json's `quantization_config` is its
`QuantizationConfig.model_dump`, and the expected weights are its own `decompress`. Activation
order "group" (g_idx) was removed from compressed-tensors 0.20, so that case packs with its
`pack_to_int32` but takes the grouping from the documented `weight_g_idx` semantics.
"""

from __future__ import annotations

import json

import pytest
import torch

ct = pytest.importorskip("compressed_tensors")

from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

from moe_core import int4_w4a16  # noqa: E402
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
    ({"format": "float-quantized"}, "format='float-quantized'"),
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
    if value is None:
        del tensors[f"{PREFIX}.{key}"]
    else:
        tensors[f"{PREFIX}.{key}"] = value
    (d / "model.safetensors").unlink()
    write_model_dir(d, tensors, config)
    with pytest.raises(CheckpointError, match=message):
        load_layer(d, 2)
