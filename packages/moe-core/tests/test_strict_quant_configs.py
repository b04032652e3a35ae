"""quantization_config fields are read with their JSON types checked (issue 58): booleans written as
strings parse as what they say, and a field of the wrong type or shape is a CheckpointError naming
config.json, the field, the value and what is accepted; never a silent coercion or a raw TypeError."""

from __future__ import annotations

import json

import pytest
import torch

from moe_core import ExpertWeights, MoEConfig
from moe_core.hf_config import ConfigFileError, UnsupportedModelError, load_hf_config, quant_from_hf
from moe_core.quant import int4_w4a16, unquantized
from moe_core.weights import CheckpointError, load_layer
from moe_core.weights.compressed_tensors import compressed_tensors_scheme_for
from moe_core.weights.writers import gptq_tensors, unquantized_tensors, write_model_dir

CFG = MoEConfig(4, 2, 64, 32)
PREFIX = "model.layers.0.mlp.experts"
MODULE = f"{PREFIX}.0.down_proj"


def _model_dir(tmp_path, weights, qc):
    tensors = gptq_tensors(weights, PREFIX) if weights.key.quantized else unquantized_tensors(weights, PREFIX, "proj")
    config = {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2}
    return write_model_dir(tmp_path, tensors, {**config, **({"quantization_config": qc} if qc else {})})


@pytest.mark.parametrize("sym", [False, "false", "False"])
def test_gptq_sym_false_as_a_string_keeps_the_zero_points(tmp_path, sym):
    """Before: bool("false") read as symmetric, the zero points were dropped (39% relative error)."""
    weights = ExpertWeights.random(CFG, int4_w4a16(32, zero_point=True, scale_dtype="fp16"), seed=torch.seed() % 2**31)
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": sym, "desc_act": "false"}
    loaded = load_layer(_model_dir(tmp_path, weights, qc), 0)
    assert loaded.weights.w13_zero is not None and loaded.quant.weight.zero_point.value == "integer"
    for got, want in zip(loaded.weights.dequantize(), weights.dequantize()):
        assert torch.equal(got, want)


@pytest.mark.parametrize(("field", "value"), [("sym", "no"), ("sym", 0), ("desc_act", "yes"), ("desc_act", None)])
def test_gptq_booleans_of_another_kind_are_refused(tmp_path, field, value):
    weights = ExpertWeights.random(CFG, int4_w4a16(32, zero_point=True, scale_dtype="fp16"), seed=1)
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, field: value}
    with pytest.raises(CheckpointError, match=rf"config.json: GPTQ quantization_config.{field}={value!r} is invalid: "
                                              "expected true or false"):
        load_layer(_model_dir(tmp_path, weights, qc), 0)


def _ct(weights=None, **group):
    weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True,
               **(weights or {})}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, **group}}}


@pytest.mark.parametrize(("value", "symmetric"), [("false", False), ("true", True), (False, False)])
def test_compressed_tensors_symmetric_as_a_string(value, symmetric):
    assert compressed_tensors_scheme_for(_ct({"symmetric": value}), [MODULE]).symmetric is symmetric


def test_compressed_tensors_actorder_true_means_group():
    """compressed-tensors' own validator reads actorder true as "group"; before, it was read as no act-order."""
    assert compressed_tensors_scheme_for(_ct({"actorder": True}), [MODULE]).act_order
    assert not compressed_tensors_scheme_for(_ct({"actorder": False}), [MODULE]).act_order


_BAD_CONFIGS = [
    pytest.param({"quant_method": "fp8", "weight_block_size": 128},
                 r"fp8 quantization_config.weight_block_size=128 is invalid: expected two positive ints", id="fp8-int"),
    pytest.param({"quant_method": "fp8", "weight_block_size": [None, 32]},
                 r"weight_block_size=\[None, 32\] is invalid: expected two positive ints", id="fp8-null"),
    pytest.param({"quant_method": "fp8", "weight_block_size": "128x128"},
                 "weight_block_size='128x128' is invalid", id="fp8-string"),
    pytest.param({"quant_method": "fp8", "weight_block_size": [128, 128, 128]},
                 r"weight_block_size=\[128, 128, 128\] is invalid", id="fp8-three"),
    pytest.param({"quant_method": "awq", "group_size": None},
                 "AWQ quantization_config.group_size=None is invalid: expected a positive int", id="awq-null"),
    pytest.param({"quant_method": "awq", "group_size": "128"},
                 "AWQ quantization_config.group_size='128' is invalid", id="awq-string"),
    pytest.param({"quant_method": "awq", "group_size": 128, "zero_point": "maybe"},
                 "AWQ quantization_config.zero_point='maybe' is invalid", id="awq-zero-point"),
    pytest.param({"quant_method": "awq", "group_size": 128, "modules_to_not_convert": "gate"},
                 "modules_to_not_convert='gate' is invalid: expected a list", id="awq-skip-string"),
    pytest.param(_ct({"group_size": None}),
                 r"config_groups.group_0.weights.group_size=None is invalid: expected a positive int with "
                 "strategy 'group'", id="ct-group-null"),
    pytest.param(_ct({"group_size": 0}), "group_size=0 is invalid", id="ct-group-zero"),
    pytest.param({**_ct(), "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "group"}}}},
                 "config_groups.group_0.weights.group_size=None is invalid: expected a positive int with strategy "
                 "'group'", id="ct-group-absent"),
    pytest.param({**_ct(), "config_groups": [{"targets": ["Linear"]}]},
                 r"config_groups=\[.*\] is invalid: expected an object of named groups", id="ct-groups-list"),
    pytest.param(_ct(targets=["re:model.layers.(0"]),
                 r"config_groups.group_0.targets pattern 're:model.layers.\(0' is not a valid regular expression",
                 id="ct-bad-regex"),
    pytest.param({**_ct(), "ignore": ["re:*lm_head"]}, "ignore pattern 're:\\*lm_head' is not a valid regular",
                 id="ct-bad-ignore-regex"),
    pytest.param(_ct(targets="Linear"), "targets='Linear' is invalid: expected a list", id="ct-targets-string"),
    pytest.param(_ct({"num_bits": "4"}), r"weights.num_bits='4' is invalid: expected 4 or 8", id="ct-bits-string"),
    pytest.param(_ct({"dynamic": "no"}), "weights.dynamic='no' is invalid", id="ct-dynamic-string"),
    pytest.param(_ct({"actorder": 1}), "weights.actorder=1 is invalid", id="ct-actorder-int"),
    pytest.param({**_ct(), "config_groups": {"group_0": {"targets": ["Linear"], "weights": [4]}}},
                 r"weights=\[4\] is invalid: expected an object", id="ct-weights-list"),
]


@pytest.mark.parametrize(("qc", "fragment"), _BAD_CONFIGS)
def test_a_malformed_quantization_config_names_file_field_and_value(tmp_path, qc, fragment):
    model = _model_dir(tmp_path, ExpertWeights.random(CFG, unquantized(), seed=1), qc)
    with pytest.raises(CheckpointError, match=rf"{model / 'config.json'}: .*{fragment}"):
        load_layer(model, 0)
    # moe explain --config reads the same parsers
    with pytest.raises(UnsupportedModelError, match=fragment):
        quant_from_hf({"quantization_config": qc})


def test_a_config_json_nested_100000_levels(tmp_path):
    """Before: RecursionError from json's decoder."""
    model = _model_dir(tmp_path, ExpertWeights.random(CFG, unquantized(), seed=1), None)
    config = model / "config.json"
    config.write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 4})[:-1]
                      + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CheckpointError, match=f"{config}: JSON nested too deeply to read"):
        load_layer(model, 0)
    with pytest.raises(ConfigFileError, match=f"{config}: JSON nested too deeply to read"):
        load_hf_config(config)


def test_norm_topk_prob_as_a_string_is_refused(monkeypatch):
    """Read raw (no transformers config class) and through transformers' strict config class alike."""
    from moe_core import hf_config

    cfg = {"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "hidden_size": 64,
           "moe_intermediate_size": 32, "hidden_act": "silu", "norm_topk_prob": "false"}
    if hf_config._config_class("qwen3_moe") is not None:
        # Before: huggingface_hub's StrictDataclassFieldValidationError (no ValueError) escaped.
        with pytest.raises(UnsupportedModelError, match=r"Qwen3MoeConfig rejects this config.*norm_topk_prob"):
            hf_config.moe_config_from_hf(cfg)
    monkeypatch.setattr(hf_config, "_config_class", lambda model_type: None)
    with pytest.raises(UnsupportedModelError, match=r"routing.renormalize='false'.* expected true or false"):
        hf_config.moe_config_from_hf(cfg)


@pytest.mark.parametrize("name", ["gate.weight", "gate.e_score_correction_bias"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_an_integer_router_tensor_is_refused(tmp_path, name, dtype):
    """Before: LoadedLayer.router_weight stayed int32."""
    tensors = unquantized_tensors(ExpertWeights.random(CFG, unquantized(), seed=1), PREFIX, "proj")
    shape = (4, 64) if name == "gate.weight" else (4,)
    tensors[f"model.layers.0.mlp.{name}"] = torch.randint(0, 2, shape).to(dtype)
    model = write_model_dir(tmp_path, tensors, {"model_type": "qwen3_moe", "num_experts": 4})
    with pytest.raises(CheckpointError, match=rf"tensor 'model.layers.0.mlp.{name}' has dtype "
                                              rf"{str(dtype)[6:]}, expected a floating-point dtype"):
        load_layer(model, 0)

