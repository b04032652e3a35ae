"""A second hostile pass (issue 58, docs/design/hostile-pass-2.md): misuse of the Python API, odd
checkpoints, the CLI and fuse() that neither issue 58's list nor the first pass names. Each case must
end in a clear error (type and message fragment) or the correct result; the docstring of a case that
failed before says how."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch

from moe_core import (
    ExpertWeights,
    FusedMoE,
    MoEConfig,
    Routing,
    fp8_w8a8,
    int4_w4a16,
    mxfp4_w4a16,
    route_torch,
    unquantized,
)
from moe_core.cli import main
from moe_core.hf_config import UnsupportedModelError
from moe_core.quant import parse_scheme
from moe_core.weights import CheckpointError, load_layer, quantize_expert_tensor
from moe_core.weights.compressed_tensors import compressed_tensors_scheme_for
from moe_core.weights.writers import gptq_tensors, unquantized_tensors, write_model_dir

CFG = MoEConfig(8, 2, 64, 32, dtype=torch.float32)
HAS_CPU = importlib.util.find_spec("moe_cpu") is not None
BACKENDS = ["reference", pytest.param("cpu", marks=pytest.mark.skipif(not HAS_CPU, reason="moe-cpu is not installed"))]
PREFIX = "model.layers.0.mlp.experts"
SMALL = MoEConfig(4, 2, 64, 32)


def _layer(backend="reference", config=CFG):
    layer = FusedMoE(config, None, "cpu", prefer=backend)
    layer.load_weights(ExpertWeights.random(config, layer.quant, seed=int(torch.randint(0, 2**31, ()))))
    return layer


def _checkpoint(tmp_path, config=None, weights=None, extra=None):
    weights = weights or ExpertWeights.random(SMALL, unquantized(), seed=1)
    tensors = gptq_tensors(weights, PREFIX) if weights.key.quantized else unquantized_tensors(weights, PREFIX, "proj")
    tensors.update(extra or {})
    return write_model_dir(tmp_path, tensors, {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
                                               **(config or {})})


def _ct(**weights):
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "strategy": "channel",
                                                                       **weights}}}}


# ---- cases that must raise: (call, error type, message fragment) -------------------------------------


def _fused_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    from moe_core.integrations.transformers import fuse

    torch.manual_seed(0)
    config = transformers.MixtralConfig(hidden_size=64, vocab_size=128, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16, intermediate_size=96,
                                        num_local_experts=4, num_experts_per_tok=2)
    model = transformers.MixtralForCausalLM(config).eval()
    fuse(model, prefer="reference")
    return model


def _fuse_twice(tmp_path):
    from moe_core.integrations.transformers import fuse

    fuse(_fused_model(tmp_path))


def _fused_model_in_training(tmp_path):
    model = _fused_model(tmp_path).train()
    model(torch.randint(0, 128, (1, 5)))


def _fuse_a_dense_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    from moe_core.integrations.transformers import fuse

    config = transformers.LlamaConfig(hidden_size=64, vocab_size=128, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=96)
    fuse(transformers.LlamaForCausalLM(config))


RAISES = [
    # ExpertWeights and quantization helpers
    pytest.param(lambda t: ExpertWeights.random(CFG, unquantized(), seed=2**70), ValueError,
                 r"ExpertWeights.random: seed=1180591620717411303424 is invalid: expected an int in \[-2\*\*63, "
                 r"2\*\*64\)", id="random-seed-2**70"),  # before: "Overflow when unpacking long long"
    pytest.param(lambda t: ExpertWeights.random(CFG, unquantized(), seed=1.5), ValueError, "seed=1.5 is invalid",
                 id="random-seed-float"),  # before: torch's RuntimeError "manual_seed expected a long"
    pytest.param(lambda t: ExpertWeights.random({"num_experts": 8}, unquantized()), TypeError,
                 "config must be a MoEConfig, got dict", id="random-config-dict"),  # before: AttributeError
    pytest.param(lambda t: ExpertWeights.random(CFG, None), TypeError, "quant must be a MoEQuantConfig .* got None",
                 id="random-quant-none"),  # before: AttributeError 'NoneType' object has no attribute 'name'
    pytest.param(lambda t: ExpertWeights.from_float(torch.randn(2, 64, 64), torch.randn(2, 64, 32),
                                                    int4_w4a16(32, act_order=True),
                                                    g_idx=(torch.zeros(64, dtype=torch.int32),) * 2),
                 ValueError, r"w13_g_idx must be an integer tensor of shape \[2, 64\] or \[2, 2, 64\] .* got "
                 r"torch.int32 \[64\]", id="from-float-g-idx-1d"),  # before: IndexError
    pytest.param(lambda t: ExpertWeights.from_float(torch.randn(2, 64, 64), torch.randn(2, 64, 32), unquantized(),
                                                    dtype=torch.int32),
                 ValueError, "from_float: dtype=torch.int32 is invalid", id="from-float-int-dtype"),
    # before: int32 "unquantized" weights, refused only at load
    pytest.param(lambda t: quantize_expert_tensor(torch.randn(64, 64), int4_w4a16(32).weight), ValueError,
                 r"quantize_expert_tensor: w must be \[experts, rows, cols\], got \[64, 64\]", id="quantize-2d"),
    pytest.param(lambda t: ExpertWeights.stack([1, 2]), TypeError, "stack takes a list of ExpertWeights, got int",
                 id="stack-ints"),  # before: AttributeError 'int' object has no attribute 'key'
    pytest.param(lambda t: parse_scheme(None), TypeError, "parse_scheme takes a scheme's name", id="parse-none"),
    pytest.param(lambda t: parse_scheme("INT4"), ValueError, "unknown quantization scheme 'INT4'", id="parse-upper"),
    pytest.param(lambda t: fp8_w8a8("tensor", block=(64, 64)), ValueError,
                 r"block=\(64, 64\) is read with granularity='block' only", id="fp8-block-with-tensor"),
    # before: block= silently ignored
    pytest.param(lambda t: fp8_w8a8("block", activation_scales="tensor"), ValueError,
                 "activation_scales='tensor' is not read with granularity='block'", id="fp8-block-tensor-scales"),
    # FusedMoE and descriptors: already clear, kept so
    pytest.param(lambda t: _layer()(torch.randn(2, 3, 64), torch.randn(2, 3, 8)), ValueError,
                 r"hidden_states must be \[M, 64\], got \[2, 3, 64\]", id="forward-3d"),
    pytest.param(lambda t: FusedMoE(CFG, "int4", "cpu"), TypeError, "quant must be a MoEQuantConfig", id="quant-str"),
    pytest.param(lambda t: MoEConfig(8, 2, 64, 32, activation="silu"), ValueError, "expected an Activation",
                 id="activation-str"),
    pytest.param(lambda t: MoEConfig(8, 2, 64, 32, dtype=torch.float64), ValueError,
                 "MoEConfig.dtype=torch.float64 is invalid", id="dtype-float64"),
    pytest.param(lambda t: route_torch(torch.randn(8), Routing(), 2), ValueError, r"router_logits must be \[M, E\]",
                 id="route-1d"),
    pytest.param(lambda t: FusedMoE(MoEConfig(8, 2, 64, 48), mxfp4_w4a16(), "cpu"), RuntimeError,
                 "no backend can serve", id="mxfp4-n48"),
    # checkpoints
    pytest.param(lambda t: load_layer(_checkpoint(t, {"quantization_config": {"quant_method": "GPTQ"}}), 0),
                 CheckpointError, r"config.json: quantization_config.quant_method='GPTQ' is not supported.*lower case",
                 id="ckpt-method-upper"),  # before: a ValueError naming no file
    pytest.param(lambda t: load_layer(_checkpoint(t, {"quantization_config": {"quant_method": 3}}), 0),
                 CheckpointError, "config.json: quantization_config.quant_method=3", id="ckpt-method-int"),
    pytest.param(lambda t: load_layer(_checkpoint(t, {"num_experts": 10**12}), 0), CheckpointError,
                 r"tensor 'model.layers.0.mlp.experts.4.gate_proj.weight' is missing", id="ckpt-10**12-experts"),
    # before: MemoryError with no message (a list of 10**12 expert ids)
    pytest.param(lambda t: load_layer(_checkpoint(t, {"quantization_config": {**_ct(), "config_groups": {
        "g": {"weights": {"num_bits": 4, "strategy": "channel"}}}}}), 0), CheckpointError,
                 "config_groups.g has no 'targets'", id="ckpt-ct-no-targets"),  # before: loaded as unquantized
    pytest.param(lambda t: load_layer(_checkpoint(t, extra={"model.layers.0.mlp.gate.weight": torch.full(
        (4, 64), float("nan"))}), 0), CheckpointError, "gate.weight' holds NaN or Inf values", id="ckpt-nan-router"),
    # before: LoadedLayer.router_weight all NaN
    pytest.param(lambda t: load_layer(_checkpoint(t, {"quantization_config": {
        "quant_method": "awq", "group_size": 32, "modules_to_not_convert": "gate"}}), 0), CheckpointError,
                 "modules_to_not_convert='gate' is invalid", id="ckpt-awq-skip-string"),
    # before: each character a module-name substring ('e' matched the experts): read as unquantized
    pytest.param(lambda t: compressed_tensors_scheme_for(_ct(num_bits="4"), [f"{PREFIX}.0.up_proj"]), ValueError,
                 "num_bits='4' is invalid", id="ct-bits-string"),  # before: int("4") taken
    pytest.param(lambda t: load_layer(_checkpoint(t, {"quantization_config": {
        "quant_method": "gptq", "bits": 3, "group_size": 32}}), 0), CheckpointError,
                 "GPTQ bits=3 is not supported: expected 4 or 8", id="ckpt-gptq-3-bits"),
    pytest.param(lambda t: load_layer(_checkpoint(t), 0, experts=[]), ValueError, r"experts=\[\] is invalid",
                 id="ckpt-no-experts"),
    pytest.param(lambda t: load_layer(_checkpoint(t), 0, dtype="bfloat16"), ValueError,
                 "dtype=bfloat16 is invalid", id="ckpt-dtype-string"),
    pytest.param(lambda t: load_layer(_checkpoint(t, {"quantization_config": _ct(strategy="tensor")}), 0),
                 CheckpointError, "strategy='tensor' is not supported", id="ckpt-ct-tensor"),
    # fuse()
    pytest.param(_fuse_twice, UnsupportedModelError, "already fused", id="fuse-twice"),
    pytest.param(_fused_model_in_training, RuntimeError, "FusedMoE is inference-only", id="fuse-train-mode"),
    pytest.param(_fuse_a_dense_model, UnsupportedModelError, "model_type 'llama'", id="fuse-dense"),
    pytest.param(lambda t: torch.no_grad()(_fused_model(t).half())(torch.randint(0, 128, (1, 5))), ValueError,
                 "hidden_states dtype torch.float16 differs from the layer dtype torch.float32",
                 id="fuse-then-half"),
]


@pytest.mark.parametrize(("call", "error", "fragment"), RAISES)
def test_misuse_raises_a_clear_error(call, error, fragment, tmp_path):
    with pytest.raises(error, match=fragment):
        call(tmp_path)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("hidden", "weights", "ids", "fragment"), [
    # before: float ids were truncated (to expert 0 here) by both: a silently wrong output
    (torch.randn(3, 64), torch.rand(3, 2), torch.rand(3, 2) * 0.9, "topk_ids must hold integer expert ids, got "
     "torch.float32"),
    # before: the reference ignored the third weight column silently
    (torch.randn(3, 64), torch.rand(3, 3), torch.randint(0, 8, (3, 2)), r"must both be \[3, top_k\] for 3 tokens, got "
     r"\[3, 2\] and \[3, 3\]"),
    # before: the CPU class failed inside oneDNN ("could not create a primitive descriptor")
    (torch.randn(3, 64).bfloat16(), torch.rand(3, 2), torch.randint(0, 8, (3, 2)), r"hidden_states must be \[M, 64\] "
     "in the layer dtype torch.float32, got torch.bfloat16"),
    (torch.randn(3, 64), torch.randint(0, 2, (3, 2)), torch.randint(0, 8, (3, 2)), "topk_weights must be floating"),
], ids=["float-ids", "weights-3-columns", "bf16-input", "int-weights"])
def test_apply_refuses_malformed_routing(backend, hidden, weights, ids, fragment):
    with pytest.raises(ValueError, match=fragment):
        _layer(backend).experts.apply(hidden, weights, ids)


# ---- cases with a correct result -----------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_given_as_parameters_or_strided_views_give_the_plain_result(backend):
    weights = ExpertWeights.random(CFG, unquantized(), seed=int(torch.randint(0, 2**31, ())))
    strided = dataclasses.replace(weights, w13=torch.nn.Parameter(weights.w13.transpose(1, 2).contiguous()
                                                                  .transpose(1, 2)))
    x, logits = torch.randn(5, 64), torch.randn(5, 8)
    outputs = []
    for w in (weights, strided):
        layer = FusedMoE(CFG, None, "cpu", prefer=backend)
        layer.load_weights(w)
        with torch.no_grad():
            outputs.append(layer(x, logits))
    torch.testing.assert_close(*outputs, rtol=1e-6, atol=1e-6)  # only the summation order may differ


def test_a_forced_backend_name_is_trimmed_and_case_folded():
    assert FusedMoE(CFG, None, "cpu", prefer=" Reference ").plan.backend == "reference"


def test_compressed_tensors_ignoring_the_experts_reads_them_unquantized(tmp_path):
    qc = {**_ct(), "ignore": ["re:.*experts.*"]}
    assert load_layer(_checkpoint(tmp_path, {"quantization_config": qc}), 0).format == "unquantized"


def test_a_model_cast_to_fp16_then_fused_runs_in_fp16():
    transformers = pytest.importorskip("transformers")
    from moe_core.integrations.transformers import fuse

    config = transformers.MixtralConfig(hidden_size=64, vocab_size=128, num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16, intermediate_size=96,
                                        num_local_experts=4, num_experts_per_tok=2)
    model = transformers.MixtralForCausalLM(config).eval().half()
    fuse(model)
    with torch.no_grad():
        assert model(torch.randint(0, 128, (1, 5))).logits.dtype == torch.float16


# ---- the CLI ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "fragment"), [
    (["explain", "--preset", "tiny", "--quant", ""], "unknown quantization scheme ''"),  # before: unquantized
    (["explain", "--preset", "tiny", "--placement", "balanced", "--ep-size", "2", "--expert-loads", "/nonexistent"],
     "--expert-loads /nonexistent: cannot read it (No such file or directory)"),  # before: no option named
    (["explain", "--preset", "tiny", "--tokens", "0"], "--tokens must be in [1, 8192]"),
    (["explain", "--preset", "tiny", "--device", "cuda"] if not torch.cuda.is_available() else
     ["explain", "--preset", "tiny", "--device", "tpu"], "device"),
    (["explain", "--preset", "tiny", "--backend", "nonexistent"], "prefer='nonexistent' names no installed backend"),
    (["run", "--preset", "tiny", "--quant", "fp8-block:tensor"], "unknown quantization scheme 'fp8-block:tensor'"),
], ids=["empty-quant", "loads-missing", "tokens-0", "absent-device", "unknown-backend", "fp8-block-tensor"])
def test_cli_errors_name_the_option(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and fragment in err


def test_cli_loads_file_that_is_a_directory(tmp_path, capsys):
    argv = ["explain", "--preset", "tiny", "--placement", "balanced", "--ep-size", "2", "--expert-loads", str(tmp_path)]
    assert main(argv) == 2
    assert f"--expert-loads {tmp_path}: cannot read it (Is a directory)" in capsys.readouterr().err


def test_explain_balanced_redundant_copies_beyond_the_ranks(tmp_path, capsys):
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps(list(range(1, 9))))
    assert main(["explain", "--preset", "tiny", "--placement", "balanced", "--ep-size", "2", "--parallel",
                 "all_to_all", "--expert-loads", str(loads), "--redundant", "99999999999999999999"]) == 2
    assert "redundant=99999999999999999999 is invalid" in capsys.readouterr().err
