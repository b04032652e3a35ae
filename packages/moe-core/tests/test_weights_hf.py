"""Unquantized Hugging Face expert layouts: every layout to canonical form, cross-checked against
transformers' own expert modules, and the errors bad state dicts get."""

from __future__ import annotations

import pytest
import torch

from moe_core import Activation, MoEConfig, reference_moe, unquantized
from moe_core.weights import CheckpointError, ExpertWeights, experts_from_state_dict
from moe_core.weights.writers import unquantized_tensors

E, K, N = 4, 32, 16
PREFIX = "model.layers.1.mlp.experts"


def _weights(seed: int, bias: bool = False) -> ExpertWeights:
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * N, K, generator=gen)
    w2 = torch.randn(E, K, N, generator=gen)
    b13 = torch.randn(E, 2 * N, generator=gen) if bias else None
    b2 = torch.randn(E, K, generator=gen) if bias else None
    return ExpertWeights.from_float(w13, w2, unquantized(), b13, b2, dtype=torch.float32)


@pytest.mark.parametrize("layout", ["mixtral", "proj", "fused"])
def test_layouts_give_canonical_weights(layout):
    ref = _weights(1)
    got = experts_from_state_dict(unquantized_tensors(ref, PREFIX, layout), PREFIX, E)
    assert torch.equal(got.w13, ref.w13) and torch.equal(got.w2, ref.w2)
    assert got.w13_bias is None and got.key == unquantized().weight


@pytest.mark.parametrize("experts", [None, list(range(E))])
def test_fused_layout_read_whole_is_views_of_the_checkpoint(experts):
    """fuse() reads a large model's experts this way: a copy would hold each block twice."""
    sd = unquantized_tensors(_weights(1), PREFIX, "fused")
    got = experts_from_state_dict(sd, PREFIX, E, experts=experts)
    for name, key in (("w13", "gate_up_proj"), ("w2", "down_proj")):
        assert getattr(got, name).data_ptr() == sd[f"{PREFIX}.{key}"].data_ptr(), name


def test_gpt_oss_transposed_interleaved_with_biases():
    ref = _weights(2, bias=True)
    sd = unquantized_tensors(ref, PREFIX + ".", "gpt_oss")
    got = experts_from_state_dict(sd, PREFIX + ".", E, interleaved_gate_up=True)
    for name in ("w13", "w2", "w13_bias", "w2_bias"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name


def test_expert_subset_and_dtype_cast():
    ref = _weights(3)
    got = experts_from_state_dict(unquantized_tensors(ref, PREFIX, "proj"), PREFIX, E, experts=[3, 1],
                                  dtype=torch.bfloat16)
    assert got.w13.dtype == torch.bfloat16
    assert torch.equal(got.w13, ref.w13[[3, 1]].bfloat16()) and torch.equal(got.w2, ref.w2[[3, 1]].bfloat16())


def test_non_gated_fused_needs_orientation():
    gen = torch.Generator().manual_seed(4)
    up, down = torch.randn(E, N, K, generator=gen), torch.randn(E, K, N, generator=gen)
    sd = {f"{PREFIX}.up_proj": up, f"{PREFIX}.down_proj": down}
    with pytest.raises(CheckpointError, match="pass transposed"):
        experts_from_state_dict(sd, PREFIX, E)
    got = experts_from_state_dict(sd, PREFIX, E, transposed=False)
    assert torch.equal(got.w13, up) and torch.equal(got.w2, down)


def _run_hf_experts(module, hidden, ids, weights):
    with torch.no_grad():
        return module(hidden, ids, weights)


@pytest.mark.parametrize("model", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_matches_transformers_expert_modules(model):
    """transformers' own experts forward equals our reference on the weights we read from its state_dict."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(5)
    if model == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

        cfg = transformers.Qwen3MoeConfig(hidden_size=K, moe_intermediate_size=N, num_experts=E)
        module, act, interleaved = Qwen3MoeExperts(cfg), Activation.silu(), False
    elif model == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts

        cfg = transformers.MixtralConfig(hidden_size=K, intermediate_size=N, num_local_experts=E)
        module, act, interleaved = MixtralExperts(cfg), Activation.silu(), False
    else:
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

        cfg = transformers.GptOssConfig(hidden_size=K, intermediate_size=N, num_local_experts=E)
        module, act, interleaved = GptOssExperts(cfg), Activation.swiglu_oai(cfg.swiglu_alpha, cfg.swiglu_limit), True
    for p in module.parameters():
        p.data = torch.randn_like(p) * 0.3
    sd = {f"{PREFIX}.{k}": v for k, v in module.state_dict().items()}
    ours = experts_from_state_dict(sd, PREFIX, E, interleaved_gate_up=interleaved)
    M, top_k = 7, 2
    hidden = torch.randn(M, K)
    ids = torch.stack([torch.randperm(E)[:top_k] for _ in range(M)])
    topk_w = torch.rand(M, top_k)
    expected = _run_hf_experts(module, hidden, ids, topk_w)
    config = MoEConfig(num_experts=E, top_k=top_k, hidden_size=K, intermediate_size=N, activation=act,
                       dtype=torch.float32, has_bias=ours.has_bias)
    got = reference_moe(hidden, ours, config, topk_w, ids)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


# ---- errors ------------------------------------------------------------------------------


def test_missing_expert_tensor_is_named():
    sd = unquantized_tensors(_weights(6), PREFIX, "mixtral")
    del sd[f"{PREFIX}.2.w3.weight"]
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.mlp\.experts\.2\.w3\.weight' is missing"):
        experts_from_state_dict(sd, PREFIX, E)


def test_no_experts_under_prefix():
    with pytest.raises(CheckpointError, match="no expert weights under"):
        experts_from_state_dict({"model.embed.weight": torch.randn(3, 3)}, PREFIX, E)


def test_wrong_shape_is_named_with_expectation():
    sd = unquantized_tensors(_weights(7), PREFIX, "proj")
    sd[f"{PREFIX}.1.up_proj.weight"] = torch.randn(N + 1, K)
    with pytest.raises(CheckpointError, match=r"up_proj\.weight' has shape \[17, 32\], expected \[16, 32\]"):
        experts_from_state_dict(sd, PREFIX, E)


def test_fused_shapes_that_do_not_pair_up():
    sd = {f"{PREFIX}.gate_up_proj": torch.randn(E, 2 * N, K), f"{PREFIX}.down_proj": torch.randn(E, K, N + 2)}
    with pytest.raises(CheckpointError, match="do not pair up"):
        experts_from_state_dict(sd, PREFIX, E)


def test_fused_wrong_expert_count():
    sd = {f"{PREFIX}.gate_up_proj": torch.randn(E - 1, 2 * N, K), f"{PREFIX}.down_proj": torch.randn(E - 1, K, N)}
    with pytest.raises(CheckpointError, match=r"expected \[4, \*, \*\]"):
        experts_from_state_dict(sd, PREFIX, E)


def test_wrong_dtype_is_named():
    sd = unquantized_tensors(_weights(8), PREFIX, "fused")
    sd[f"{PREFIX}.down_proj"] = sd[f"{PREFIX}.down_proj"].to(torch.int32)
    with pytest.raises(CheckpointError, match="down_proj' has dtype int32, expected bfloat16 or float16 or float32"):
        experts_from_state_dict(sd, PREFIX, E)


def test_mixed_dtypes_need_an_explicit_cast():
    sd = unquantized_tensors(_weights(9), PREFIX, "fused")
    sd[f"{PREFIX}.down_proj"] = sd[f"{PREFIX}.down_proj"].bfloat16()
    with pytest.raises(CheckpointError, match="mixed dtypes"):
        experts_from_state_dict(sd, PREFIX, E)
    assert experts_from_state_dict(sd, PREFIX, E, dtype=torch.float32).w2.dtype == torch.float32


def test_half_present_biases_are_refused():
    sd = unquantized_tensors(_weights(10, bias=True), PREFIX, "gpt_oss")
    del sd[f"{PREFIX}.down_proj_bias"]
    with pytest.raises(CheckpointError, match="down_proj_bias' is missing"):
        experts_from_state_dict(sd, PREFIX, E, interleaved_gate_up=True)


def test_bad_expert_ids_are_refused():
    sd = unquantized_tensors(_weights(11), PREFIX, "fused")
    with pytest.raises(ValueError, match=r"distinct ids in \[0, 4\)"):
        experts_from_state_dict(sd, PREFIX, E, experts=[1, 1])
