"""`load_layer` over model directories: layer discovery, sharded indexes, router tensors, reading
only the requested layer, loading into `FusedMoE`, and the errors for bad directories."""

from __future__ import annotations

import json

import pytest
import torch

from moe_core import (
    Activation,
    FusedMoE,
    MoEConfig,
    Routing,
    int4_w4a16,
    reference_moe,
    route_torch,
    unquantized,
)
from moe_core.weights import CheckpointError, ExpertWeights, load_layer
from moe_core.weights.checkpoint import SafetensorsDirectory
from moe_core.weights.writers import awq_tensors, gptq_tensors, unquantized_tensors, write_model_dir

E, K, N = 4, 64, 32


def _float_weights(seed: int, bias: bool = False) -> ExpertWeights:
    gen = torch.Generator().manual_seed(seed)
    w13, w2 = torch.randn(E, 2 * N, K, generator=gen) * 0.2, torch.randn(E, K, N, generator=gen) * 0.2
    b13 = torch.randn(E, 2 * N, generator=gen).bfloat16() if bias else None
    b2 = torch.randn(E, K, generator=gen).bfloat16() if bias else None
    return ExpertWeights.from_float(w13, w2, unquantized(), b13, b2, dtype=torch.bfloat16)


def _deepseek_dir(tmp_path, shards: int = 1):
    """Layer 0 dense, layers 1 and 2 MoE with shared experts and a correction bias (DeepSeek-V3 names)."""
    tensors = {"model.layers.0.mlp.down_proj.weight": torch.randn(K, N).bfloat16()}
    layers = {}
    for layer in (1, 2):
        w = _float_weights(layer)
        layers[layer] = w
        tensors.update(unquantized_tensors(w, f"model.layers.{layer}.mlp.experts", "proj"))
        tensors[f"model.layers.{layer}.mlp.gate.weight"] = torch.randn(E, K).bfloat16()
        tensors[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = torch.randn(E)
        tensors[f"model.layers.{layer}.mlp.shared_experts.down_proj.weight"] = torch.randn(K, N).bfloat16()
    config = {"model_type": "deepseek_v3", "n_routed_experts": E, "num_experts_per_tok": 2, "hidden_size": K}
    return write_model_dir(tmp_path / "ds", tensors, config, shards=shards), layers, tensors


@pytest.mark.parametrize("shards", [1, 3])
def test_deepseek_layout_with_router_and_correction_bias(tmp_path, shards):
    d, layers, tensors = _deepseek_dir(tmp_path, shards)
    loaded = load_layer(d, 2)
    assert loaded.format == "unquantized" and loaded.experts_prefix == "model.layers.2.mlp.experts"
    assert loaded.num_experts == E and loaded.top_k == 2 and loaded.model_config["model_type"] == "deepseek_v3"
    assert torch.equal(loaded.weights.w13, layers[2].w13) and torch.equal(loaded.weights.w2, layers[2].w2)
    assert torch.equal(loaded.router_weight, tensors["model.layers.2.mlp.gate.weight"])
    assert torch.equal(loaded.correction_bias, tensors["model.layers.2.mlp.gate.e_score_correction_bias"])
    assert loaded.router_bias is None


def test_reads_only_the_requested_layer(tmp_path, monkeypatch):
    d, _, _ = _deepseek_dir(tmp_path, shards=2)
    read = []
    original = SafetensorsDirectory.__getitem__

    def recording(self, key):
        read.append(key)
        return original(self, key)

    monkeypatch.setattr(SafetensorsDirectory, "__getitem__", recording)
    load_layer(d, 1)
    assert read and all(k.startswith("model.layers.1.mlp.") for k in read)
    assert not any("shared_experts" in k for k in read)


def test_mixtral_block_sparse_moe_names_and_expert_subset(tmp_path):
    w = _float_weights(3)
    tensors = unquantized_tensors(w, "model.layers.0.block_sparse_moe.experts", "mixtral")
    tensors["model.layers.0.block_sparse_moe.gate.weight"] = torch.randn(E, K).bfloat16()
    d = write_model_dir(tmp_path / "mx", tensors, {"model_type": "mixtral", "num_local_experts": E})
    loaded = load_layer(d, 0, experts=[2, 3], dtype=torch.float32)
    assert loaded.weights.w13.dtype == torch.float32 and loaded.router_weight.dtype == torch.float32
    assert torch.equal(loaded.weights.w13, w.w13[2:].float())


def test_gpt_oss_bf16_checkpoint_is_deinterleaved_from_model_type(tmp_path):
    w = _float_weights(4, bias=True)
    prefix = "model.layers.0.mlp.experts"
    tensors = unquantized_tensors(w, prefix, "gpt_oss")
    tensors["model.layers.0.mlp.router.weight"] = torch.randn(E, K).bfloat16()
    tensors["model.layers.0.mlp.router.bias"] = torch.randn(E).bfloat16()
    d = write_model_dir(tmp_path / "go", tensors, {"model_type": "gpt_oss", "num_local_experts": E,
                                                   "experts_per_token": 2})
    loaded = load_layer(d, 0)
    assert torch.equal(loaded.weights.w13, w.w13) and torch.equal(loaded.weights.w13_bias, w.w13_bias)
    assert loaded.router_bias.shape == (E,) and loaded.top_k == 2


@pytest.mark.parametrize("fmt", ["unquantized", "gptq", "awq"])
def test_loaded_layer_runs_in_fused_moe(tmp_path, fmt):
    """FusedMoE built from LoadedLayer.quant and fed LoadedLayer.weights matches the fp32 reference."""
    prefix = "model.layers.0.mlp.experts"
    config = MoEConfig(num_experts=E, top_k=2, hidden_size=K, intermediate_size=N, dtype=torch.bfloat16,
                       routing=Routing.softmax_topk(True), activation=Activation.silu())
    if fmt == "unquantized":
        ref, qc = _float_weights(5), None
        tensors = unquantized_tensors(ref, prefix, "fused")
    else:
        ref = ExpertWeights.random(config, int4_w4a16(32, zero_point=True, scale_dtype="fp16"), seed=5)
        qc = {"quant_method": fmt, "bits": 4, "group_size": 32, "sym": False, "zero_point": True}
        tensors = gptq_tensors(ref, prefix) if fmt == "gptq" else awq_tensors(ref, prefix)
    cfg = {"model_type": "qwen3_moe", "num_experts": E, **({"quantization_config": qc} if qc else {})}
    loaded = load_layer(write_model_dir(tmp_path / fmt, tensors, cfg), 0)
    layer = FusedMoE(config, loaded.quant, prefer="reference")
    layer.load_weights(loaded.weights)
    x = torch.randn(9, K).bfloat16()
    logits = torch.randn(9, E)
    topk_w, topk_ids = route_torch(logits, config.routing, config.top_k)
    expected = reference_moe(x, ref, config, topk_w, topk_ids)
    torch.testing.assert_close(layer(x, logits).float(), expected, rtol=2e-2, atol=2e-2)


# ---- errors ------------------------------------------------------------------------------


def test_dense_layer_and_wrong_index(tmp_path):
    d, _, _ = _deepseek_dir(tmp_path)
    for index in (0, 7):
        with pytest.raises(CheckpointError, match=f"layer {index} has no experts"):
            load_layer(d, index)


def test_missing_config_and_expert_count(tmp_path):
    d, _, _ = _deepseek_dir(tmp_path)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_layer(d, 1)
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="no expert count"):
        load_layer(d, 1)


def test_unsupported_quant_method(tmp_path):
    d, _, tensors = _deepseek_dir(tmp_path)
    write_model_dir(d, tensors, {"n_routed_experts": E, "quantization_config": {"quant_method": "bitsandbytes"}})
    with pytest.raises(ValueError, match="quant_method='bitsandbytes' is not supported"):
        load_layer(d, 1)


def test_no_safetensors_and_broken_index(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"num_experts": E}))
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors files"):
        load_layer(d, 0)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "missing.safetensors"}}))
    with pytest.raises(CheckpointError, match="names shards that do not exist"):
        load_layer(d, 0)


def test_mxfp4_tensors_without_quantization_config(tmp_path):
    prefix = "model.layers.0.mlp.experts"
    tensors = {f"{prefix}.gate_up_proj_blocks": torch.zeros(E, 2 * N, 2, 16, dtype=torch.uint8) + 3}
    d = write_model_dir(tmp_path / "m", tensors, {"model_type": "gpt_oss", "num_local_experts": E})
    with pytest.raises(CheckpointError, match=r"MXFP4 expert tensors but config\.json has no quantization_config"):
        load_layer(d, 0)


def test_tensors_no_reader_understands_are_refused(tmp_path):
    """A bias on a GPTQ projection or a static input scale would be silently dropped: refused instead."""
    prefix = "model.layers.0.mlp.experts"
    config = MoEConfig(num_experts=E, top_k=2, hidden_size=K, intermediate_size=N)
    ref = ExpertWeights.random(config, int4_w4a16(32, scale_dtype="fp16"), seed=12)
    tensors = gptq_tensors(ref, prefix)
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True}
    hf = {"num_experts": E, "quantization_config": qc}
    tensors[f"{prefix}.3.down_proj.bias"] = torch.randn(K).half()
    d = write_model_dir(tmp_path / "bias", tensors, hf)
    with pytest.raises(CheckpointError, match=r"not part of the gptq expert format .*experts\.3\.down_proj\.bias"):
        load_layer(d, 0)
    assert load_layer(d, 0, experts=[0, 1]).weights.num_experts == 2  # expert 3 is not read
    del tensors[f"{prefix}.3.down_proj.bias"]
    tensors[f"{prefix}.1.up_proj.qzeros"] = torch.zeros(3, 4, dtype=torch.int32)
    with pytest.raises(CheckpointError, match=r"up_proj\.qzeros' has shape \[3, 4\], expected \[2, 4\]"):
        load_layer(write_model_dir(tmp_path / "zeros", tensors, hf), 0)


def test_keys_under_equals_a_scan_of_every_key(tmp_path):
    # Layer 1's prefix is a string prefix of layer 10's and 11's keys: the dot keeps them apart.
    from safetensors.torch import save_file

    keys = [f"model.layers.{i}.mlp.experts.{e}.w{j}.weight" for i in (1, 10, 11, 2) for e in (0, 1, 12) for j in (1, 2)]
    keys += ["model.layers.1.mlp.gate.weight", "lm_head.weight", "model.layers.1"]
    half = len(keys) // 2
    save_file({k: torch.zeros(1) for k in keys[:half]}, tmp_path / "a.safetensors")
    save_file({k: torch.zeros(1) for k in keys[half:]}, tmp_path / "b.safetensors")
    index = {"weight_map": {k: ("a" if i < half else "b") + ".safetensors" for i, k in enumerate(keys)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    tensors = SafetensorsDirectory(tmp_path)
    for prefix in ("model.layers.1.", "model.layers.1.mlp.experts.1.", "model.layers.10.", "lm_head.", "x", ""):
        assert tensors.keys_under(prefix) == sorted(k for k in keys if k.startswith(prefix)), prefix
