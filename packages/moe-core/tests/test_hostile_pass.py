"""A hostile pass over the Python API, the checkpoint reader, fuse() and the CLI: each case is a misuse
or an odd input, and must end in a clear error (type and message fragment) or the correct result;
never a traceback from deep inside, and never a silently wrong, truncated or re-routed result."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch

from moe_core import ExpertWeights, FusedMoE, MoEConfig, Routing, route_torch
from moe_core.cli import main
from moe_core.config import ExpertPlacement, ParallelConfig
from moe_core.quant import Granularity, ScaleSpec, fp8_w8a8, int4_w4a16, mxfp4_w4a16, unquantized
from moe_core.weights import CheckpointError, load_layer
from moe_core.weights.writers import unquantized_tensors, write_model_dir

CFG = MoEConfig(8, 2, 64, 32, dtype=torch.float32)
DEEPSEEK = MoEConfig(8, 2, 64, 32, routing=Routing.deepseek_v3(4, 2), dtype=torch.float32)
HAS_CPU = importlib.util.find_spec("moe_cpu") is not None
BACKENDS = ["reference", pytest.param("cpu", marks=pytest.mark.skipif(not HAS_CPU, reason="moe-cpu is not installed"))]


def _layer(config=CFG, quant=None, backend="reference", bias=None):
    layer = FusedMoE(config, quant, "cpu", prefer=backend)
    layer.load_weights(ExpertWeights.random(config, layer.quant, seed=1), correction_bias=bias)
    return layer


def _with(weights: ExpertWeights, name: str, index: tuple, value: float) -> ExpertWeights:
    tensor = getattr(weights, name).clone()
    tensor[index] = value
    return dataclasses.replace(weights, **{name: tensor})


# ---- cases that must raise: (call, error type, message fragment) -------------------------------------


def _nan_expert_weight(tmp_path):
    weights = ExpertWeights.random(CFG, unquantized(), seed=1)
    FusedMoE(CFG, None, "cpu", prefer="reference").load_weights(_with(weights, "w13", (3, 0, 0), float("nan")))


def _inf_int4_scale(tmp_path):
    cfg = MoEConfig(8, 2, 64, 32)
    weights = ExpertWeights.random(cfg, int4_w4a16(32), seed=1)
    FusedMoE(cfg, int4_w4a16(32), "cpu", prefer="reference").load_weights(
        _with(weights, "w2_scale", (7, 0, 0), float("inf")))


def _nan_fp8_code(tmp_path):
    cfg = MoEConfig(8, 2, 128, 128)
    quant = fp8_w8a8("block")
    weights = ExpertWeights.random(cfg, quant, seed=1)
    codes = weights.w2.clone()
    codes.view(torch.uint8)[6, 0, 0] = 0x7F  # e4m3fn's NaN
    FusedMoE(cfg, quant, "cpu", prefer="reference").load_weights(dataclasses.replace(weights, w2=codes))


def _nan_e8m0_scale(tmp_path):
    cfg = MoEConfig(8, 2, 64, 32)
    weights = ExpertWeights.random(cfg, mxfp4_w4a16(), seed=1)
    FusedMoE(cfg, mxfp4_w4a16(), "cpu", prefer="reference").load_weights(_with(weights, "w13_scale", (5, 0, 0), 0xFF))


def _meta_weights(tmp_path):
    FusedMoE(CFG, None, "cpu", prefer="reference").load_weights(ExpertWeights.random(CFG, unquantized()).to("meta"))


def _weights_not_a_tensor(tmp_path):
    weights = ExpertWeights.random(CFG, unquantized())
    FusedMoE(CFG, None, "cpu", prefer="reference").load_weights(dataclasses.replace(weights, w13=[[1.0]]))


def _weights_a_dict(tmp_path):
    FusedMoE(CFG, None, "cpu", prefer="reference").load_weights({"w13": torch.zeros(1)})


def _nan_correction_bias(tmp_path):
    bias = torch.zeros(8)
    bias[2] = float("nan")
    _layer(DEEPSEEK, bias=bias)


def _correction_bias_a_list(tmp_path):
    _layer(DEEPSEEK, bias=[0.0] * 8)


def _all_experts_into_an_expert_parallel_layer(tmp_path):
    ep = dataclasses.replace(CFG, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    FusedMoE(ep, None, "cpu", prefer="reference", ep_group="partial").load_weights(ExpertWeights.random(CFG, unquantized()))


def _route_with_too_few_logit_columns(tmp_path):
    _layer().route(torch.randn(3, 7))


def _forward_numpy_input(tmp_path):
    _layer()(torch.randn(2, 64).numpy(), torch.randn(2, 8))


def _forward_list_logits(tmp_path):
    _layer()(torch.randn(2, 64), [[0.0] * 8] * 2)


def _prefer_not_a_string(tmp_path):
    FusedMoE(CFG, None, "cpu", prefer=3)


def _int4_group_size_bool(tmp_path):
    int4_w4a16(True)


def _scale_spec_group_size_bool(tmp_path):
    ScaleSpec(Granularity.GROUP, group_size=True)


def _fp8_block_shape_bool(tmp_path):
    fp8_w8a8("block", block=(True, 128))


def _placement_float_id(tmp_path):
    ExpertPlacement(4, ((0, 1.7), (2, 3)))


def _placement_string_id(tmp_path):
    ExpertPlacement(2, (("1",), (0,)))


def _huge_top_k(tmp_path):
    MoEConfig(8, 10**9, 64, 32)


def _route_torch_huge_top_k(tmp_path):
    route_torch(torch.randn(2, 8), Routing(), 10**6)


def _stack_mixed_dtypes(tmp_path):
    a = ExpertWeights.random(CFG, unquantized())
    b = ExpertWeights.random(dataclasses.replace(CFG, dtype=torch.bfloat16), unquantized())
    ExpertWeights.stack([a, b])


def _stack_mismatched_hidden_size(tmp_path):
    ExpertWeights.stack([ExpertWeights.random(CFG, unquantized()),
                         ExpertWeights.random(MoEConfig(8, 2, 128, 32, dtype=torch.float32), unquantized())])


def _random_on_meta(tmp_path):
    ExpertWeights.random(CFG, unquantized(), device="meta")


def _random_mxfp4_hidden_not_a_block_multiple(tmp_path):
    ExpertWeights.random(MoEConfig(8, 2, 48, 32), mxfp4_w4a16())


# A 4-expert checkpoint of one layer, written by moe_core's writers, and its config.json.
PREFIX = "model.layers.0.mlp.experts"
CHECKPOINT_CONFIG = {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2}


def _checkpoint(tmp_path, config=None, mutate=None):
    tensors = unquantized_tensors(ExpertWeights.random(MoEConfig(4, 2, 16, 8), unquantized()), PREFIX, "proj")
    if mutate is not None:
        mutate(tensors)
    return write_model_dir(tmp_path, tensors, {**CHECKPOINT_CONFIG, **(config or {})})


def _expert_count_a_string(tmp_path):
    load_layer(_checkpoint(tmp_path, {"num_experts": "4"}), 0)


def _expert_count_a_bool(tmp_path):
    load_layer(_checkpoint(tmp_path, {"num_experts": True}), 0)


def _expert_count_zero(tmp_path):
    load_layer(_checkpoint(tmp_path, {"num_experts": 0}), 0)


def _experts_per_token_zero(tmp_path):
    load_layer(_checkpoint(tmp_path, {"num_experts_per_tok": 0}), 0)


def _experts_per_token_above_the_expert_count(tmp_path):
    load_layer(_checkpoint(tmp_path, {"num_experts_per_tok": 9}), 0)


def _layer_index_a_float(tmp_path):
    load_layer(_checkpoint(tmp_path), 0.5)


def _layer_index_a_string(tmp_path):
    load_layer(_checkpoint(tmp_path), "0")


def _expert_ids_float(tmp_path):
    load_layer(_checkpoint(tmp_path), 0, experts=[1.5])


def _text_config_a_list(tmp_path):
    load_layer(_checkpoint(tmp_path, {"text_config": [1]}), 0)


def _quantization_config_without_method(tmp_path):
    load_layer(_checkpoint(tmp_path, {"quantization_config": {}}), 0)


def _model_dir_is_a_file(tmp_path):
    load_layer(_checkpoint(tmp_path) / "config.json", 0)


def _missing_expert_tensor(tmp_path):
    load_layer(_checkpoint(tmp_path, mutate=lambda t: t.pop(f"{PREFIX}.3.up_proj.weight")), 0)


def _nan_in_checkpoint_reaches_the_layer(tmp_path):
    def poison(tensors):
        tensors[f"{PREFIX}.1.down_proj.weight"][0, 0] = float("nan")

    loaded = load_layer(_checkpoint(tmp_path, mutate=poison), 0)
    cfg = MoEConfig(4, 2, 16, 8)
    FusedMoE(cfg, loaded.quant, "cpu", prefer="reference").load_weights(loaded.weights)


def _tiny_mixtral():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MixtralConfig(hidden_size=64, vocab_size=128, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16, intermediate_size=96, num_local_experts=4,
                                        num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config).eval()


def _fuse_prefer_not_a_string(tmp_path):
    from moe_core.integrations.transformers import fuse

    fuse(_tiny_mixtral(), prefer=3)


def _fuse_model_with_nan_experts(tmp_path):
    from moe_core.integrations.transformers import FusedMoEBlock, fuse

    model = _tiny_mixtral()
    with torch.no_grad():
        model.model.layers[1].mlp.experts.down_proj[2, 0, 0] = float("nan")
    try:
        fuse(model, prefer="reference")
    finally:
        assert not any(isinstance(m, FusedMoEBlock) for m in model.modules())  # untouched


RAISES = [
    # FusedMoE: inputs and weights
    pytest.param(_forward_numpy_input, TypeError, "hidden_states must be a torch.Tensor, got ndarray", id="forward-numpy"),
    pytest.param(_forward_list_logits, TypeError, "router_logits must be a torch.Tensor, got list", id="forward-list"),
    pytest.param(_nan_expert_weight, ValueError, "ExpertWeights.w13 holds NaN or Inf values in experts 3",
                 id="nan-expert-weight"),
    pytest.param(_inf_int4_scale, ValueError, "ExpertWeights.w2_scale holds NaN or Inf values in experts 7",
                 id="inf-int4-scale"),
    pytest.param(_nan_fp8_code, ValueError, "ExpertWeights.w2 holds NaN or Inf values in experts 6", id="nan-fp8-code"),
    pytest.param(_nan_e8m0_scale, ValueError, "ExpertWeights.w13_scale holds NaN or Inf values in experts 5",
                 id="nan-e8m0-scale"),
    pytest.param(_meta_weights, ValueError, "ExpertWeights.w13 is a meta tensor and holds no values", id="meta-weights"),
    pytest.param(_weights_not_a_tensor, ValueError, "w13: expected a torch.Tensor, got list", id="weights-list"),
    pytest.param(_weights_a_dict, TypeError, "load_weights takes moe_core.weights.ExpertWeights", id="weights-dict"),
    pytest.param(_nan_correction_bias, ValueError, "correction_bias holds NaN or Inf for experts 2",
                 id="nan-correction-bias"),
    pytest.param(_correction_bias_a_list, ValueError, r"pass correction_bias of shape \[8\], got list",
                 id="correction-bias-list"),
    pytest.param(_all_experts_into_an_expert_parallel_layer, ValueError,
                 r"holds 4 of the 8 experts .* load moe_core.parallel.local_weights", id="ep-layer-all-experts"),
    pytest.param(_route_with_too_few_logit_columns, ValueError, r"router_logits must be \[M, 8\].*got \[3, 7\]",
                 id="route-7-of-8-columns"),
    pytest.param(_prefer_not_a_string, TypeError, "prefer must be a backend name", id="prefer-int"),
    # descriptors and factories
    pytest.param(_int4_group_size_bool, ValueError, "group_size=True is invalid", id="int4-group-true"),
    pytest.param(_scale_spec_group_size_bool, ValueError, "ScaleSpec.group_size=True is invalid",
                 id="scalespec-group-true"),
    pytest.param(_fp8_block_shape_bool, ValueError, r"block_shape=\(True, 128\) is invalid", id="fp8-block-true"),
    pytest.param(_placement_float_id, ValueError, "integer global expert ids", id="placement-float-id"),
    pytest.param(_placement_string_id, ValueError, "integer global expert ids", id="placement-string-id"),
    pytest.param(_huge_top_k, ValueError, "top_k=1000000000 is invalid: expected <= num_experts=8", id="huge-top-k"),
    pytest.param(_route_torch_huge_top_k, ValueError, r"top_k=1000000 must be in \[1, num_experts=8\]",
                 id="route-huge-top-k"),
    # canonical weights
    pytest.param(_stack_mixed_dtypes, ValueError, "w13 of part 1 is torch.bfloat16", id="stack-mixed-dtypes"),
    pytest.param(_stack_mismatched_hidden_size, ValueError, "parts may differ in the expert dimension only",
                 id="stack-mismatched-k"),
    pytest.param(_random_on_meta, ValueError, "device='meta' holds no values", id="random-meta"),
    pytest.param(_random_mxfp4_hidden_not_a_block_multiple, ValueError, "group size 32 does not divide the input "
                 "dimension 48", id="random-mxfp4-k48"),
    # checkpoints
    pytest.param(_expert_count_a_string, CheckpointError, "num_experts='4' is not an int", id="ckpt-experts-string"),
    pytest.param(_expert_count_a_bool, CheckpointError, "num_experts=True is not an int", id="ckpt-experts-bool"),
    pytest.param(_expert_count_zero, CheckpointError, "an expert count of 0 is invalid", id="ckpt-experts-zero"),
    pytest.param(_experts_per_token_zero, CheckpointError, r"experts per token = 0 is invalid: expected an int in "
                 r"\[1, 4\]", id="ckpt-top-k-zero"),
    pytest.param(_experts_per_token_above_the_expert_count, CheckpointError, "experts per token = 9 is invalid",
                 id="ckpt-top-k-9-of-4"),
    pytest.param(_layer_index_a_float, ValueError, "layer_index=0.5 is invalid", id="ckpt-layer-float"),
    pytest.param(_layer_index_a_string, ValueError, "layer_index='0' is invalid", id="ckpt-layer-string"),
    pytest.param(_expert_ids_float, ValueError, r"experts=\[1.5\] is invalid", id="ckpt-expert-ids-float"),
    pytest.param(_text_config_a_list, CheckpointError, r"text_config must be a JSON object, got \[1\]",
                 id="ckpt-text-config-list"),
    pytest.param(_quantization_config_without_method, CheckpointError, "quantization_config has no quant_method",
                 id="ckpt-no-quant-method"),
    pytest.param(_model_dir_is_a_file, CheckpointError, "not a directory", id="ckpt-dir-is-file"),
    pytest.param(_missing_expert_tensor, CheckpointError, "'model.layers.0.mlp.experts.3.up_proj.weight' is missing",
                 id="ckpt-missing-expert"),
    pytest.param(_nan_in_checkpoint_reaches_the_layer, ValueError, "ExpertWeights.w2 holds NaN or Inf values in "
                 "experts 1", id="ckpt-nan-expert"),
    # fuse()
    pytest.param(_fuse_prefer_not_a_string, TypeError, "prefer must be a backend name", id="fuse-prefer-int"),
    pytest.param(_fuse_model_with_nan_experts, ValueError, "ExpertWeights.w2 holds NaN or Inf values in experts 2",
                 id="fuse-nan-experts"),
]


@pytest.mark.parametrize(("call", "error", "fragment"), RAISES)
def test_misuse_raises_a_clear_error(call, error, fragment, tmp_path):
    with pytest.raises(error, match=fragment):
        call(tmp_path)


# ---- cases with a correct result -----------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs_give_the_contiguous_result(backend):
    layer = _layer(backend=backend)
    logits = torch.randn(5, 16)[:, ::2]  # a column slice
    transposed = torch.randn(64, 5).t()
    expanded = torch.randn(1, 64).expand(5, 64)  # stride 0
    with torch.no_grad():
        for x in (transposed, expanded):
            assert torch.equal(layer(x, logits), layer(x.contiguous(), logits.contiguous()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_tokens_give_an_empty_output(backend):
    out = _layer(backend=backend)(torch.randn(0, 64), torch.randn(0, 8))
    assert out.shape == (0, 64) and out.dtype == torch.float32


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_token_spoils_only_itself(backend):
    x = torch.randn(4, 64)
    x[1, 3] = float("nan")
    out = _layer(backend=backend)(x, torch.randn(4, 8))
    assert torch.isfinite(out[[0, 2, 3]]).all() and not torch.isfinite(out[1]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_router_logits_of_any_float_dtype_route_as_their_fp32_values(dtype):
    layer = _layer()
    logits = torch.randn(6, 8).to(dtype)
    x = torch.randn(6, 64)
    assert torch.equal(layer(x, logits), layer(x, logits.float()))


def test_refused_weights_leave_the_layer_as_it_was():
    """Before: the new correction bias was kept though the weights beside it were refused."""
    bias = torch.linspace(-0.5, 0.5, 8)
    layer = _layer(DEEPSEEK, bias=bias)
    x, logits = torch.randn(4, 64), torch.randn(4, 8)
    before = layer(x, logits)
    bad = _with(ExpertWeights.random(DEEPSEEK, layer.quant), "w13", (0, 0, 0), float("nan"))
    with pytest.raises(ValueError, match="holds NaN or Inf"):
        layer.load_weights(bad, correction_bias=-bias)
    assert torch.equal(layer.correction_bias, bias) and torch.equal(layer(x, logits), before)


def test_int_correction_bias_is_used_as_its_float_values():
    layer = _layer(DEEPSEEK, bias=torch.arange(8))
    assert layer.correction_bias.dtype == torch.float32 and layer.correction_bias.tolist() == list(range(8))


# ---- the CLI ---------------------------------------------------------------------------------------------


_EXPLAIN = ["explain", "--preset", "tiny", "--device", "cpu", "--backend", "reference", "--ep-size", "2"]


def test_expert_loads_without_a_balanced_placement_is_not_ignored(tmp_path, capsys):
    """Before: the file was silently ignored and the contiguous placement printed."""
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps([1] * 8))
    assert main([*_EXPLAIN, "--expert-loads", str(loads)]) == 2
    assert "--expert-loads is read by --placement balanced only" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    ("[1, 2, 3, 4, 5, 6, 7, NaN]", "got NaN for expert 7"),
    ('[1, 2, 3, 4, 5, 6, 7, "8"]', 'got "8" for expert 7'),
    ("[1, 2, 3, 4, 5, 6, 7, null]", "got null for expert 7"),
    ("[1, 2, 3, 4, 5, 6, 7, true]", "got true for expert 7"),
    ("[1, 2, 3, 4, 5, 6, 7, -1]", "got -1 for expert 7"),
    ("[1, 2, 3, 4, 5, 6, 7, 1e400]", "got Infinity for expert 7"),
    ('{"loads": [1]}', "got a JSON dict"),
    ("[1, 2]", "got a list of 2"),
], ids=["empty", "nan", "string", "null", "bool", "negative", "overflow", "object", "short"])
def test_expert_loads_file_errors_name_the_file_and_what_is_wrong(tmp_path, capsys, text, fragment):
    loads = tmp_path / "loads.json"
    loads.write_text(text)
    assert main([*_EXPLAIN, "--placement", "balanced", "--expert-loads", str(loads)]) == 2
    err = capsys.readouterr().err
    assert f"--expert-loads {loads}: " in err and fragment in err
    assert "expected a JSON list of 8 finite numbers >= 0 (one load per expert)" in err


def test_expert_loads_file_that_is_not_utf8(tmp_path, capsys):
    loads = tmp_path / "loads.json"
    loads.write_bytes(b"\xff\xfe[1]")
    assert main([*_EXPLAIN, "--placement", "balanced", "--expert-loads", str(loads)]) == 2
    assert f"--expert-loads {loads}: not valid JSON ('utf-8' codec can't decode" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "fragment"), [
    (["explain", "--preset", "tiny", "--ep-size", "1000"], "MoEConfig.parallel.ep_size=1000 is invalid"),
    (["explain", "--preset", "tiny", "--ep-size", "3", "--ep-rank", "5"], "ep_rank=5 is invalid"),
    (["run", "--preset", "tiny", "--device", "meta"], "device 'meta' is not supported"),
], ids=["ep-size-above-experts", "ep-rank-out-of-range", "run-on-meta"])
def test_cli_parallel_and_device_errors(argv, fragment, capsys):
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err
