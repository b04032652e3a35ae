"""Loader and config.json errors: transformers 5.x field names, which safetensors files are read,
duplicate keys, index paths outside the model directory, expert counts and router shapes."""

from __future__ import annotations

import json

import pytest
import torch

from moe_core.hf_config import ConfigFileError, load_hf_config, moe_config_from_hf
from moe_core.quant import unquantized
from moe_core.weights import CheckpointError, ExpertWeights, load_layer
from moe_core.weights.writers import unquantized_tensors, write_model_dir

E, K, N = 4, 64, 32
PREFIX = "model.layers.0.mlp.experts"


def _weights(seed: int, experts: int = E) -> ExpertWeights:
    gen = torch.Generator().manual_seed(seed)
    return ExpertWeights.from_float(torch.randn(experts, 2 * N, K, generator=gen),
                                    torch.randn(experts, K, N, generator=gen), unquantized(), dtype=torch.bfloat16)


def _config(num_experts: int = E) -> dict:
    return {"model_type": "qwen3_moe", "num_experts": num_experts, "num_experts_per_tok": 2, "hidden_size": K}


def _layer_tensors(seed: int = 0, experts: int = E, router_shape=(E, K)) -> dict[str, torch.Tensor]:
    tensors = unquantized_tensors(_weights(seed, experts), PREFIX, "proj")
    tensors["model.layers.0.mlp.gate.weight"] = torch.randn(*router_shape).bfloat16()
    return tensors


def test_qwen3_moe_config_written_by_transformers_5():
    transformers = pytest.importorskip("transformers")
    written = transformers.Qwen3MoeConfig(hidden_size=K, moe_intermediate_size=N, num_experts=E,
                                          num_experts_per_tok=2, norm_topk_prob=True).to_dict()
    assert "num_experts" not in written  # transformers 5 stores it as num_local_experts
    config = moe_config_from_hf(json.loads(json.dumps(written)))
    assert (config.num_experts, config.top_k, config.intermediate_size) == (E, 2, N)
    assert config.routing.renormalize


def test_expert_count_under_either_name_without_transformers(monkeypatch):
    import moe_core.hf_config as hf_config

    monkeypatch.setattr(hf_config, "_config_class", lambda model_type: None)
    cfg = {"model_type": "qwen3_moe", "num_local_experts": E, "num_experts_per_tok": 2, "hidden_size": K,
           "moe_intermediate_size": N, "norm_topk_prob": True, "hidden_act": "silu"}
    assert moe_config_from_hf(cfg).num_experts == E
    # Without the config class, a value config.json omits has no default to fall back on: refused.
    with pytest.raises(ValueError, match=r"the expert count is read from num_local_experts, but config.json sets "
                                         r"none of num_local_experts, num_experts, n_routed_experts"):
        moe_config_from_hf({k: v for k, v in cfg.items() if k != "num_local_experts"})
    with pytest.raises(ValueError, match=r"routing.renormalize is read from norm_topk_prob"):
        moe_config_from_hf({k: v for k, v in cfg.items() if k != "norm_topk_prob"})


@pytest.mark.parametrize(("text", "error", "match"), [
    ("{not json", json.JSONDecodeError, r"Expecting property name enclosed in double quotes in .*config\.json"),
    ("[1, 2]", ConfigFileError, r"config\.json holds a JSON list, not an object"),
    ("3", ConfigFileError, r"config\.json holds a JSON int, not an object"),
    ('{"text_config": 3}', ConfigFileError, r"config\.json: text_config is a JSON int, not an object"),
])
def test_load_hf_config_names_the_file(tmp_path, text, error, match):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(error, match=match) as raised:
        load_hf_config(tmp_path)
    assert isinstance(raised.value, ValueError)


def test_without_index_only_model_safetensors_is_read(tmp_path):
    from safetensors.torch import save_file

    d = write_model_dir(tmp_path / "m", _layer_tensors(0), _config())
    # A producer's reference file holding the same keys with other values must neither block nor win.
    save_file({k: v.contiguous() for k, v in _layer_tensors(1).items()}, d / "reference.safetensors")
    save_file({"adapter.weight": torch.zeros(2)}, d / "adapter_model.safetensors")
    loaded = load_layer(d, 0)
    expected = _weights(0)
    assert torch.equal(loaded.weights.w13, expected.w13)

    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no model.safetensors.index.json and no model.safetensors "
                                               r"\(found adapter_model.safetensors, reference.safetensors"):
        load_layer(d, 0)


def test_key_in_two_shards_names_both_files(tmp_path):
    from safetensors.torch import save_file

    d = write_model_dir(tmp_path / "m", _layer_tensors(0), _config(), shards=2)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    key, first = next(iter(index["weight_map"].items()))
    other = next(f for f in set(index["weight_map"].values()) if f != first)
    from safetensors import safe_open

    with safe_open(d / other, framework="pt") as f:
        kept = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safetensors handles are not iterable
    save_file({**kept, key: torch.zeros(3)}, d / other)
    with pytest.raises(CheckpointError, match=rf"tensor '{key}' is stored in both .*-of-00002.safetensors and "
                                              r".*-of-00002.safetensors"):
        load_layer(d, 0)


@pytest.mark.parametrize("bad", ["../x.safetensors", "/etc/x.safetensors", "sub/../../x.safetensors"])
def test_index_entries_outside_the_model_directory(tmp_path, bad):
    d = write_model_dir(tmp_path / "m", _layer_tensors(0), _config(), shards=2)
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    key = next(iter(index["weight_map"]))
    index["weight_map"][key] = bad
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"weight_map\['{key}'\] = '{bad}' points outside the model directory"):
        load_layer(d, 0)


def test_more_experts_in_tensors_than_config_declares(tmp_path):
    d = write_model_dir(tmp_path / "m", _layer_tensors(0, experts=E + 2, router_shape=(E + 2, K)), _config(E))
    with pytest.raises(CheckpointError, match=rf"config.json declares {E} experts but the checkpoint holds experts "
                                              rf"up to {PREFIX}.{E + 1} \(2 beyond"):
        load_layer(d, 0)


@pytest.mark.parametrize("shape", [(E + 1, K), (E, K + 1), (E * K,)])
def test_router_weight_of_the_wrong_shape(tmp_path, shape):
    d = write_model_dir(tmp_path / "m", _layer_tensors(0, router_shape=shape), _config())
    with pytest.raises(CheckpointError, match=rf"router weight under 'model.layers.0.mlp' has shape "
                                              rf"\[{', '.join(map(str, shape))}\], expected \[{E}, {K}\]"):
        load_layer(d, 0)
