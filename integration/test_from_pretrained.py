"""`from_pretrained`: tiny checkpoints of every format, loaded fused, against transformers eager.

Each checkpoint is a 2-layer model with random weights; quantized formats quantize the attention
linears too (as GPTQ, AWQ, compressed-tensors and block-FP8 producers do). The reference is the eager
transformers model holding the same weights dequantized (experts through `ExpertWeights.dequantize`,
the linears through the library's round-to-nearest values), so the loaded model must match it to
rounding. compressed-tensors checkpoints are packed by that library's own compressor; the others by
`moe_core.weights.writers`; unquantized by transformers' own save_pretrained.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys

import pytest
import torch

from _parity import relative_l2
from moe_core.integrations.transformers import UnsupportedModelError, from_pretrained, fuse
from moe_core.quant import MoEQuantConfig, fp8_w8a8, int4_w4a16, mxfp4_w4a16, unquantized
from moe_core.weights import CheckpointError, ExpertWeights
from moe_core.weights.writers import (
    awq_tensors,
    block_fp8_tensors,
    gpt_oss_mxfp4_tensors,
    gptq_tensors,
    quantized_linear_tensors,
    write_model_dir,
)

transformers = pytest.importorskip("transformers")

E, TOP_K, K, N, LAYERS, VOCAB, GROUP = 4, 2, 128, 128, 2, 128, 64
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
# Against eager fp32 on the dequantized weights: a fp32 model runs the same arithmetic up to summation
# order; a bf16 one rounds every weight and activation (eager bf16 itself is ~1e-2 off).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
# fp8 checkpoints are W8A8: the experts round their inputs to e4m3 (2^-4 relative) per 128 channels
# (block FP8, compressed-tensors FP8_BLOCK) or per token (FP8_DYNAMIC), as the checkpoint says; eager
# runs them unrounded.
FP8_ACTIVATIONS = 0.15


def qwen3_config(**extra):
    config = transformers.Qwen3MoeConfig(
        hidden_size=K, intermediate_size=256, moe_intermediate_size=N, num_experts=E, num_experts_per_tok=TOP_K,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=VOCAB,
        initializer_range=0.1, **extra)
    config.experts_implementation = "eager"
    return config


def gpt_oss_config():
    config = transformers.GptOssConfig(
        hidden_size=K, intermediate_size=N, num_local_experts=E, num_experts_per_tok=TOP_K, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=VOCAB, initializer_range=0.1,
        layer_types=["full_attention"] * LAYERS)
    config.experts_implementation = "eager"
    return config


def float_model(config, seed: int):
    torch.manual_seed(seed)
    cls = transformers.AutoModelForCausalLM
    return cls.from_config(config, dtype=torch.float32).eval()


def dequantized_linear(w: torch.Tensor, key, g_idx=None) -> torch.Tensor:
    """The library's round-to-nearest value of one linear [out, in], through ExpertWeights.dequantize."""
    out, inp = w.shape
    gi = None if g_idx is None else (g_idx[None], torch.zeros(1, out, dtype=torch.int32))
    ew = ExpertWeights.from_float(w.repeat(2, 1)[None], torch.randn(1, inp, out), MoEQuantConfig(key), g_idx=gi)
    return ew.dequantize()[0][0, :out]


def compressed_tensors_tensors(weight: torch.Tensor, module: str, bits: int, symmetric: bool, group: int | None):
    """One linear quantized and packed by compressed-tensors itself; returns (tensors, the weight its own
    decompressor gives back, fp32)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric,
                            strategy="group" if group else "channel", group_size=group)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    w = weight.bfloat16()
    blocks = w.float().view(w.shape[0], -1, group or w.shape[1])
    scale, zero = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args)
    packed = PackedQuantizationCompressor.compress(
        {"weight": w, "weight_scale": scale.bfloat16(), "weight_zero_point": zero}, scheme)
    back = PackedQuantizationCompressor.decompress({**packed, "weight_scale": packed["weight_scale"].float()}, scheme)
    return {f"{module}.{k}": v for k, v in packed.items()}, back["weight"].float()


# compressed-tensors fp8 formats -> its preset (weights and input activations) the checkpoint is written with
CT_FP8_PRESETS = {"ct-fp8-channel": "FP8_DYNAMIC", "ct-fp8-block": "FP8_BLOCK"}


def compressed_tensors_fp8_tensors(weight: torch.Tensor, module: str, preset: str):
    """One linear quantized to fp8 by compressed-tensors' FloatQuantizationCompressor with the preset's
    weight strategy (scales from its calculate_qparams); returns (tensors, its own decompress, fp32)."""
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = preset_name_to_scheme(preset, ["Linear"])
    w = weight.bfloat16()
    rows, cols = w.shape
    if scheme.weights.strategy == "channel":
        regions = w.float()
    else:  # block: zero-padded to whole blocks, as compressed-tensors pads
        br, bc = scheme.weights.block_structure
        nr, nc = -(-rows // br), -(-cols // bc)
        padded = torch.nn.functional.pad(w.float(), (0, nc * bc - cols, 0, nr * br - rows))
        regions = padded.view(nr, br, nc, bc).transpose(1, 2).reshape(nr, nc, -1)
    scale, _ = calculate_qparams(regions.amin(-1), regions.amax(-1), scheme.weights)
    scale = scale.view(rows, 1) if scheme.weights.strategy == "channel" else scale
    packed = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale.bfloat16()}, scheme)
    back = FloatQuantizationCompressor.decompress({**packed, "weight_scale": packed["weight_scale"].float()}, scheme)
    return {f"{module}.{k}": v for k, v in packed.items()}, back["weight"].float()


def compressed_tensors_linear(fmt: str, weight: torch.Tensor, module: str):
    if fmt in CT_FP8_PRESETS:
        return compressed_tensors_fp8_tensors(weight, module, CT_FP8_PRESETS[fmt])
    bits, symmetric = (4 if "int4" in fmt else 8), not fmt.endswith("-asym")
    return compressed_tensors_tensors(weight, module, bits, symmetric, GROUP if bits == 4 else None)


def build_checkpoint(fmt: str, model) -> tuple[dict, dict | None, dict]:
    """(checkpoint tensors, quantization_config, reference state: model key -> fp32 dequantized value)."""
    state = {k: v.bfloat16().float() for k, v in model.state_dict().items()}  # as config.json's dtype stores them
    reference = dict(state)
    tensors = {k: v.bfloat16() for k, v in state.items() if ".experts." not in k}
    gen = torch.Generator().manual_seed(3)
    qc = None
    linear_key = None
    if fmt == "gptq":
        linear_key, qc = int4_w4a16(GROUP, act_order=True, scale_dtype="fp16").weight, {
            "quant_method": "gptq", "bits": 4, "group_size": GROUP, "sym": True, "desc_act": True}
    elif fmt == "awq":
        linear_key, qc = int4_w4a16(GROUP, zero_point=True, scale_dtype="fp16").weight, {
            "quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}
    elif fmt == "fp8":
        linear_key, qc = fp8_w8a8("block").weight, {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    for layer in range(LAYERS):
        for proj in ATTENTION if fmt not in ("unquantized", "mxfp4") else ():
            module = f"model.layers.{layer}.self_attn.{proj}"
            w = state[f"{module}.weight"]
            del tensors[f"{module}.weight"]
            if fmt.startswith("ct-"):
                packed, deq = compressed_tensors_linear(fmt, w, module)
                tensors.update(packed)
                reference[f"{module}.weight"] = deq
                continue
            g_idx = (torch.randperm(w.shape[1], generator=gen) // GROUP).int() if linear_key.act_order else None
            tensors.update(quantized_linear_tensors(w, module, fmt, linear_key, g_idx))
            reference[f"{module}.weight"] = dequantized_linear(w, linear_key, g_idx)
        tensors.update(experts_checkpoint(fmt, layer, state, reference, gen))
    if fmt in CT_FP8_PRESETS:
        from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

        scheme = preset_name_to_scheme(CT_FP8_PRESETS[fmt], ["Linear"])
        config = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized",
                                    ignore=["lm_head", "re:.*mlp.gate$"], quantization_status="compressed")
        qc = json.loads(json.dumps(config.model_dump(exclude_none=True), default=str))
    elif fmt.startswith("ct-"):
        bits, symmetric = (4 if "int4" in fmt else 8), not fmt.endswith("-asym")
        strategy = "group" if bits == 4 else "channel"
        weights = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy}
        if strategy == "group":
            weights["group_size"] = GROUP
        qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
              "ignore": ["lm_head", "re:.*mlp.gate$"],
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
    if fmt == "mxfp4":
        qc = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                  "model.embed_tokens", "lm_head"]}
    return tensors, qc, reference


def experts_checkpoint(fmt: str, layer: int, state: dict, reference: dict, gen) -> dict:
    prefix = f"model.layers.{layer}.mlp.experts"
    w13, w2 = state[f"{prefix}.gate_up_proj"], state[f"{prefix}.down_proj"]
    if fmt == "mxfp4":  # gpt-oss stores [in, out] with gate/up rows interleaved
        b13, b2 = state[f"{prefix}.gate_up_proj_bias"], state[f"{prefix}.down_proj_bias"]
        gate, up = w13[..., ::2], w13[..., 1::2]
        canonical13 = torch.cat([gate, up], -1).transpose(1, 2)
        ew = ExpertWeights.from_float(canonical13, w2.transpose(1, 2), mxfp4_w4a16(),
                                      torch.cat([b13[..., ::2], b13[..., 1::2]], -1).bfloat16(), b2.bfloat16())
        d13, d2 = ew.dequantize()
        reference[f"{prefix}.gate_up_proj"] = interleave(d13).transpose(1, 2)
        reference[f"{prefix}.down_proj"] = d2.transpose(1, 2)
        reference[f"{prefix}.gate_up_proj_bias"] = interleave(ew.w13_bias.float())
        reference[f"{prefix}.down_proj_bias"] = ew.w2_bias.float()
        return gpt_oss_mxfp4_tensors(ew, prefix)
    if fmt.startswith("ct-"):
        tensors, d13, d2 = {}, [], []
        for e in range(E):
            parts = {}
            for proj, w in (("gate_proj", w13[e, :N]), ("up_proj", w13[e, N:]), ("down_proj", w2[e])):
                packed, parts[proj] = compressed_tensors_linear(fmt, w, f"{prefix}.{e}.{proj}")
                tensors.update(packed)
            d13.append(torch.cat([parts["gate_proj"], parts["up_proj"]]))
            d2.append(parts["down_proj"])
        reference[f"{prefix}.gate_up_proj"], reference[f"{prefix}.down_proj"] = torch.stack(d13), torch.stack(d2)
        return tensors
    if fmt == "gptq":
        g_idx = (torch.stack([torch.stack([torch.randperm(K, generator=gen) // GROUP for _ in range(2)])
                              for _ in range(E)]).int(),  # gate and up calibrated apart
                 torch.stack([torch.randperm(N, generator=gen) // GROUP for _ in range(E)]).int())
        ew = ExpertWeights.from_float(w13, w2, int4_w4a16(GROUP, act_order=True, scale_dtype="fp16"), g_idx=g_idx)
        tensors = gptq_tensors(ew, prefix)
    elif fmt == "awq":
        ew = ExpertWeights.from_float(w13, w2, int4_w4a16(GROUP, zero_point=True, scale_dtype="fp16"))
        tensors = awq_tensors(ew, prefix)
    elif fmt == "fp8":
        ew = ExpertWeights.from_float(w13, w2, fp8_w8a8("block"))
        tensors = block_fp8_tensors(ew, prefix)
    else:
        raise ValueError(fmt)
    reference[f"{prefix}.gate_up_proj"], reference[f"{prefix}.down_proj"] = ew.dequantize()
    return tensors


def interleave(t: torch.Tensor) -> torch.Tensor:
    """Canonical gate rows then up rows (dim 1) -> gpt-oss's alternating gate, up rows."""
    return torch.stack([t[:, :N], t[:, N:]], 2).flatten(1, 2)


def hub_cache_layout(tmp_path, flat):
    """`models--org--tiny/snapshots/<rev>/` whose files are symlinks into `blobs/`, as huggingface_hub writes."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(flat.iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copy(f, blob)
        (snapshot / f.name).symlink_to(f"../../blobs/blob{i}")
    return snapshot


CASES = {  # format -> (model config, layout, dtype, backend)
    "gptq": (qwen3_config, "sharded", torch.float32, "reference"),
    "awq": (qwen3_config, "hub", torch.bfloat16, "cpu"),
    "ct-int4-asym": (qwen3_config, "single", torch.bfloat16, "cpu"),
    "ct-int4-sym": (qwen3_config, "single", torch.float32, "cpu"),
    "ct-int8-sym": (qwen3_config, "sharded", torch.float32, "cpu"),
    "ct-fp8-channel": (qwen3_config, "single", torch.bfloat16, "cpu"),
    "ct-fp8-block": (qwen3_config, "sharded", torch.float32, "cpu"),
    "fp8": (qwen3_config, "hub", torch.float32, "cpu"),
    "mxfp4": (gpt_oss_config, "single", torch.bfloat16, "cpu"),
}


# formats whose attention transformers' compressed-tensors quantizer holds (compressed-tensors 0.20 lays out an
# int4 zero point unpacked, which its asymmetric checkpoints store packed: those are dequantized)
HF_QUANTIZED = ("ct-int4-sym", "ct-int8-sym", "ct-fp8-channel", "ct-fp8-block")
WITHOUT_QUANTIZER = {"gptq": "GPTQ", "awq": "AWQ", "fp8": "fine-grained FP8"}  # not installed here, or GPU only


def write(tmp_path, fmt: str, seed: int = 0):
    make_config, layout, _, _ = CASES[fmt]
    model = float_model(make_config(), seed)
    tensors, qc, reference = build_checkpoint(fmt, model)
    config = model.config.to_dict()
    config["dtype"] = "bfloat16"
    config.pop("experts_implementation", None)
    if qc is not None:
        config["quantization_config"] = qc
    # the hub layouts are sharded too: the index's entries are links into blobs/
    flat = write_model_dir(tmp_path / "flat", tensors, config, shards={"sharded": 3, "hub": 2}.get(layout, 1))
    model.load_state_dict(reference)
    path = hub_cache_layout(tmp_path, flat) if layout == "hub" else flat
    return path, model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """fmt -> (checkpoint path, eager model on its dequantized weights), each written once; tests that
    change a checkpoint write their own."""
    written = {}

    def get(fmt: str):
        if fmt not in written:
            written[fmt] = write(tmp_path_factory.mktemp(fmt), fmt)
        return written[fmt]

    return get


@pytest.mark.parametrize("fmt", list(CASES))
def test_loaded_logits_match_eager_on_the_dequantized_weights(checkpoint, fmt, caplog):
    _, _, dtype, backend = CASES[fmt]
    path, eager = checkpoint(fmt)
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    with caplog.at_level(logging.INFO, logger="moe_core"), torch.no_grad():
        model = from_pretrained(path, prefer=backend, dtype=dtype)
        logits = model(ids).logits
        expected = eager(ids).logits  # fp32: the dequantized weights exactly
    assert {layer.backend for layer in model.fuse_report.layers} == {backend}
    tolerance = FP8_ACTIVATIONS if fmt in ("fp8", *CT_FP8_PRESETS) else TOLERANCE[dtype]
    assert relative_l2(logits, expected) < tolerance, relative_l2(logits, expected)
    if fmt in HF_QUANTIZED:  # quantized attention goes through transformers' quantizer, with a note
        assert "load through transformers' compressed-tensors quantizer" in caplog.text
    elif fmt != "mxfp4":  # or is dequantized with a note naming transformers' quantizer it lacked, never dropped
        assert "outside the experts are" in caplog.text and "dequantized to" in caplog.text
        assert f"transformers' {WITHOUT_QUANTIZER.get(fmt, 'compressed-tensors')} quantizer" in caplog.text
    assert "loading the experts of 2 MoE layers" in caplog.text
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (2, 9)


def test_unquantized_checkpoint_written_by_transformers(tmp_path):
    model = float_model(qwen3_config(), seed=5)
    model.save_pretrained(tmp_path / "m")
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        loaded = from_pretrained(tmp_path / "m", prefer="cpu", dtype=torch.float32)
        assert relative_l2(loaded(ids).logits, model(ids).logits) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("fmt", ["gptq", "ct-int4-sym", "ct-int8-sym", "ct-fp8-channel", "ct-fp8-block", "fp8",
                                 "mxfp4"])
def test_save_round_trip_is_bit_exact_and_loads_again(tmp_path, checkpoint, fmt):
    from safetensors import safe_open

    from moe_core.weights.checkpoint import SafetensorsDirectory

    path, _ = checkpoint(fmt)
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model = from_pretrained(path, prefer="reference", dtype=torch.float32)
        first = model(ids).logits
        model.save_pretrained(tmp_path / "saved", max_shard_size=200_000)
        source, saved = SafetensorsDirectory(path), SafetensorsDirectory(tmp_path / "saved")
        # the experts and the quantized linears (attention) are written back as stored, bit for bit
        quantized = {k.rpartition(".")[0] for k in source if k.endswith(("qweight", "weight_packed", "weight_scale"))}
        stored = [k for k in source if ".experts." in k or k.rpartition(".")[0] in quantized]
        assert stored and all(source[k].dtype == saved[k].dtype and torch.equal(
            source[k].view(torch.uint8), saved[k].view(torch.uint8)) for k in stored)
        assert set(saved) == set(source)  # quantized attention written back as stored, nothing added or lost
        assert len(list((tmp_path / "saved").glob("model-*.safetensors"))) > 1
        with safe_open(next((tmp_path / "saved").glob("model-*.safetensors")), "pt") as f:
            assert f.metadata() == {"format": "pt"}
        saved_config = json.loads((tmp_path / "saved" / "config.json").read_text())
        assert saved_config["quantization_config"]["quant_method"] == json.loads(
            (path / "config.json").read_text())["quantization_config"]["quant_method"]
        again = from_pretrained(tmp_path / "saved", prefer="reference", dtype=torch.float32)
        assert torch.equal(again(ids).logits, first)


@pytest.mark.parametrize("fmt", ["ct-int8-sym", "ct-fp8-channel", "ct-fp8-block"])
def test_transformers_reads_the_saved_compressed_tensors_checkpoint(tmp_path, checkpoint, fmt):
    path, eager = checkpoint(fmt)
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        from_pretrained(path, prefer="cpu", dtype=torch.float32).save_pretrained(tmp_path / "saved")
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.float32)
        for layer in range(LAYERS):  # the experts transformers decompresses are the ones we loaded
            ours, back = eager.model.layers[layer].mlp.experts, theirs.model.layers[layer].mlp.experts
            for name in ("gate_up_proj", "down_proj"):
                # int8: transformers decompresses to bf16; fp8 codes times their scale are exact in fp32
                assert relative_l2(getattr(back, name), getattr(ours, name)) < (1e-2 if fmt == "ct-int8-sym" else 1e-6)
        # transformers decompresses in its own order and rounding, and runs fp8 attention W8A8 (its activations
        # rounded to e4m3, which eager does not): close, not bit-equal
        tolerance = FP8_ACTIVATIONS if fmt in CT_FP8_PRESETS else 1e-2
        assert relative_l2(theirs(ids).logits, eager(ids).logits) < tolerance


@pytest.mark.parametrize("fmt", HF_QUANTIZED)
def test_compressed_tensors_attention_runs_in_transformers_quantizer_modules(checkpoint, fmt):
    """The attention linears are compressed-tensors' modules set up by transformers' quantizer, holding
    exactly the weights transformers' own from_pretrained gives them; the logits differ from its model
    only by the experts (moe_core's kernels at the checkpoint's precision, transformers' eager ones on
    weights it decompresses to bf16 and runs without fp8 input rounding)."""
    path, _ = checkpoint(fmt)
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ours = from_pretrained(path, prefer="cpu", dtype=torch.float32)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        expected = theirs(ids).logits  # its first forward decompresses its compressed-tensors modules
        logits = ours(ids).logits
        for layer in range(LAYERS):
            for proj in ATTENTION:
                mine = getattr(ours.model.layers[layer].self_attn, proj)
                other = getattr(theirs.model.layers[layer].self_attn, proj)
                assert mine.quantization_scheme == other.quantization_scheme is not None
                assert mine.quantization_status == other.quantization_status
                assert dict(mine.named_parameters()).keys() == dict(other.named_parameters()).keys() > {"weight"}
                assert torch.equal(mine.weight, other.weight)
        assert relative_l2(logits, expected) < (FP8_ACTIVATIONS if fmt in CT_FP8_PRESETS else 1e-2)
        assert ours.generate(ids, max_new_tokens=3, do_sample=False).shape == (2, 9)


def test_without_transformers_compressed_tensors_quantizer_attention_is_dequantized(checkpoint, monkeypatch,
                                                                                      caplog):
    path, eager = checkpoint("ct-int8-sym")
    for name in [m for m in sys.modules if m.split(".")[0] == "compressed_tensors"] + ["compressed_tensors"]:
        monkeypatch.setitem(sys.modules, name, None)  # `import compressed_tensors...` raises ImportError
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(8))
    with caplog.at_level(logging.INFO, logger="moe_core"), torch.no_grad():
        model = from_pretrained(path, prefer="cpu", dtype=torch.float32)
        assert relative_l2(model(ids).logits, eager(ids).logits) < TOLERANCE[torch.float32]
    q_proj = model.model.layers[0].self_attn.q_proj
    assert not hasattr(q_proj, "quantization_scheme") and set(dict(q_proj.named_parameters())) == {"weight"}
    assert re.search(r"8 linear layer\(s\) outside the experts are compressed-tensors-quantized .* dequantized to "
                     r"float32 .*transformers' compressed-tensors quantizer is unavailable: .*compressed_tensors",
                     caplog.text)


def test_asymmetric_int4_attention_is_dequantized_naming_the_quantizer_layout(checkpoint, caplog):
    path, _ = checkpoint("ct-int4-asym")
    with caplog.at_level(logging.INFO, logger="moe_core"):
        model = from_pretrained(path, prefer="cpu", dtype=torch.float32)
    assert not hasattr(model.model.layers[0].self_attn.q_proj, "quantization_scheme")
    assert re.search(r"dequantized to float32 .*transformers' compressed-tensors quantizer lays out "
                     r"model.layers.0.self_attn.\w+.weight_zero_point as \[\d+, 2\], but the checkpoint stores "
                     r"model.layers.0.self_attn.\w+.weight_zero_point as \[\d+, 2\]", caplog.text)


def test_save_refuses_changed_experts_before_writing(tmp_path, checkpoint):
    path, _ = checkpoint("awq")
    model = from_pretrained(path, prefer="cpu", dtype=torch.bfloat16)
    block = model.model.layers[1].mlp
    block.moe.load_weights(ExpertWeights.from_float(torch.randn(E, 2 * N, K), torch.randn(E, K, N),
                                                    block.moe.quant, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"the experts of model.layers.1.mlp no longer hold"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_save_refuses_a_changed_quantizer_linear_before_writing(tmp_path, checkpoint):
    path, _ = checkpoint("ct-int8-sym")
    model = from_pretrained(path, prefer="cpu", dtype=torch.float32)
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.mul_(2)
    with pytest.raises(RuntimeError, match=r"model.layers.1.self_attn.o_proj \(loaded through transformers' "
                                           r"compressed-tensors quantizer\) no longer hold"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_save_of_a_fuse_model_raises_before_writing(tmp_path):
    model = float_model(qwen3_config(), seed=0)
    fuse(model, prefer="cpu")
    with pytest.raises(NotImplementedError, match=r"fused by moe_core fuse\(\).*would lack them"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---- refusals name the cause, before anything is loaded ------------------------------------------------


def test_refuses_an_unsupported_model_type(tmp_path):
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=32)
    write_model_dir(tmp_path / "m", {"x": torch.randn(2)}, config.to_dict())
    with pytest.raises(UnsupportedModelError, match=r"model_type 'llama' .* is not a MoE model type fuse\(\) serves"):
        from_pretrained(tmp_path / "m")


def test_refuses_an_unsupported_quantization_format(tmp_path):
    config = qwen3_config().to_dict()
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    write_model_dir(tmp_path / "m", {"x": torch.randn(2)}, config)
    with pytest.raises(CheckpointError, match=r"quant_method='bitsandbytes' is not a format moe_core reads; "
                                              r"supported: none \(float weights\), gptq"):
        from_pretrained(tmp_path / "m")


@pytest.mark.parametrize(("preset", "change", "message"), [
    ("FP8", {}, r"group_0\.input_activations\.dynamic=False is not served: .*no scheme applies a static "
                r"\(calibrated\) input_scale; expected true"),
    ("FP8_DYNAMIC", {"symmetric": False}, r"group_0\.weights\.symmetric=false is not served: fp8 codes have no "
                                          r"zero point"),
])
def test_refuses_compressed_tensors_fp8_it_cannot_run_exactly_before_loading(tmp_path, preset, change, message):
    """compressed-tensors' FP8 preset calibrates static input scales; asymmetric fp8 has zero points: the
    checkpoint (no tensors needed) is refused from config.json alone, naming the file and the group's field."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    scheme = preset_name_to_scheme(preset, ["Linear"])
    qc = json.loads(json.dumps(QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized")
                               .model_dump(exclude_none=True), default=str))
    qc["config_groups"]["group_0"]["weights"].update(change)
    config = qwen3_config().to_dict()
    config["quantization_config"] = qc
    write_model_dir(tmp_path / "m", {"x": torch.randn(2)}, config)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(tmp_path / 'm' / 'config.json'))}: .*{message}"):
        from_pretrained(tmp_path / "m")


def test_refuses_a_checkpoint_missing_a_dense_weight(tmp_path, checkpoint):
    path, _ = checkpoint("gptq")
    from moe_core.weights.checkpoint import SafetensorsDirectory

    tensors = SafetensorsDirectory(path)
    kept = {k: tensors[k] for k in tensors if k != "model.layers.1.post_attention_layernorm.weight"}
    write_model_dir(tmp_path / "cut", kept, json.loads((path / "config.json").read_text()))
    with pytest.raises(CheckpointError, match=r"no tensor for 1 of the model's parameters: "
                                              r"model.layers.1.post_attention_layernorm.weight"):
        from_pretrained(tmp_path / "cut")


def test_hub_cache_links_must_stay_in_the_repository_blobs(tmp_path):
    path, _ = write(tmp_path, "awq")
    shard = next(path.glob("model-00001-*.safetensors"))
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(shard.resolve(), outside)
    shard.unlink()
    shard.symlink_to(outside)  # a link out of the repository's blobs/
    with pytest.raises(CheckpointError, match=r"points outside the model directory .* a link into the repository's "
                                              r"blobs/"):
        from_pretrained(path)


def test_report_names_each_layer_and_runs_the_checkpoint_scheme(checkpoint):
    path, _ = checkpoint("fp8")
    report = from_pretrained(path, prefer="cpu", dtype=torch.float32).fuse_report
    assert [layer.name for layer in report.layers] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    quant = report.layers[0].plan.quant
    assert quant.weight != unquantized().weight and "fp8" in quant.name
