"""Broken checkpoints end in a CheckpointError that names the file and what is wrong, never a raw
parser error (issue 43's loader cases)."""

from __future__ import annotations

import json

import pytest
import torch

from moe_core import ExpertWeights, MoEConfig
from moe_core.quant import int4_w4a16, unquantized
from moe_core.weights import CheckpointError, load_layer
from moe_core.weights.writers import gptq_tensors, unquantized_tensors, write_model_dir

CFG = MoEConfig(4, 2, 64, 32)
PREFIX = "model.layers.0.mlp.experts"


def _model_dir(tmp_path, quant=None, config_extra=None):
    quant = quant or unquantized()
    weights = ExpertWeights.random(CFG, quant, seed=1)
    tensors = (gptq_tensors(weights, PREFIX) if quant.weight.quantized
               else unquantized_tensors(weights, PREFIX, "mixtral"))
    tensors["model.layers.0.mlp.gate.weight"] = torch.randn(4, 64)
    config = {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, "hidden_size": 64,
              "intermediate_size": 32, **(config_extra or {})}
    write_model_dir(tmp_path, tensors, config)
    return tmp_path


@pytest.mark.parametrize("text, what", [
    ("{not json", "not readable JSON"),
    ("[1, 2]", "expected a JSON object, got a list"),
    ('"a string"', "expected a JSON object, got a str"),
])
def test_a_broken_config_json_names_the_file(tmp_path, text, what):
    model = _model_dir(tmp_path)
    (model / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=f"config.json: {what}"):
        load_layer(model, 0)


def test_quantization_config_must_be_an_object(tmp_path):
    model = _model_dir(tmp_path, config_extra={"quantization_config": ["gptq"]})
    with pytest.raises(CheckpointError, match=r"config.json: quantization_config must be a JSON object, got \['gptq'\]"):
        load_layer(model, 0)


def test_gptq_bits_that_are_not_an_integer(tmp_path):
    qc = {"quant_method": "gptq", "bits": "four", "group_size": 32, "desc_act": False, "sym": True}
    model = _model_dir(tmp_path, int4_w4a16(32), {"quantization_config": qc})
    with pytest.raises(CheckpointError, match=r"config.json: GPTQ quantization_config.bits='four': expected an integer"):
        load_layer(model, 0)


@pytest.mark.parametrize("damage", ["truncated", "empty", "random bytes"])
def test_a_broken_safetensors_file_names_the_file(tmp_path, damage):
    model = _model_dir(tmp_path)
    shard = model / "model.safetensors"
    data = shard.read_bytes()
    shard.write_bytes({"truncated": data[: len(data) // 2], "empty": b"",
                       "random bytes": torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes()}[damage])
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a readable safetensors file"):
        load_layer(model, 0)


def test_a_broken_index_names_the_file(tmp_path):
    model = _model_dir(tmp_path)
    (model / "model.safetensors.index.json").write_text(json.dumps([1]))
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: expected a JSON object, got a list"):
        load_layer(model, 0)
