"""Write a tiny one-layer MoE checkpoint in every supported format, load each with
`moe_core.weights.load_layer` into a `FusedMoE`, and compare its output with the fp32 reference.

    uv run python examples/load_checkpoints.py

Two errors are printed per format, both relative L2 over the layer output:
  vs dequantized: the layer against `reference_moe` on the weights it loaded (must be ~bf16 noise:
                  the reader and the kernel agree with the checkpoint);
  vs float:       the layer against `reference_moe` on the float weights before quantization
                  (the format's own quantization error).
compressed-tensors is packed by that library's own compressor when it is installed (it is in the
workspace's dev groups); the other formats are written by `moe_core.weights.writers`.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from moe_core import (
    Activation,
    FusedMoE,
    MoEConfig,
    fp8_w8a8,
    int4_w4a16,
    mxfp4_w4a16,
    reference_moe,
    route_torch,
    unquantized,
)
from moe_core.weights import ExpertWeights, load_layer
from moe_core.weights.writers import (
    awq_tensors,
    block_fp8_tensors,
    gpt_oss_mxfp4_tensors,
    gptq_tensors,
    unquantized_tensors,
    write_model_dir,
)

E, TOP_K, K, N, TOKENS = 8, 2, 256, 128, 16
MLP = "model.layers.0.mlp"
PREFIX = f"{MLP}.experts"


def float_weights(seed: int, bias: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * N, K, generator=gen) * K**-0.5
    w2 = torch.randn(E, K, N, generator=gen) * N**-0.5
    b13 = (torch.randn(E, 2 * N, generator=gen) * 0.1).bfloat16() if bias else None
    b2 = (torch.randn(E, K, generator=gen) * 0.1).bfloat16() if bias else None
    return w13, w2, b13, b2


def compressed_tensors_checkpoint(w13: torch.Tensor, w2: torch.Tensor) -> tuple[dict, dict]:
    """Per-expert projections quantized and packed by compressed-tensors itself (W4A16_ASYM, group 64)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=64)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    tensors = {}
    for e in range(E):
        for proj, w in (("gate_proj", w13[e, :N]), ("up_proj", w13[e, N:]), ("down_proj", w2[e])):
            w = w.bfloat16()
            blocks = w.float().view(w.shape[0], -1, 64)
            scale, zero = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args)
            packed = PackedQuantizationCompressor.compress(
                {"weight": w, "weight_scale": scale.bfloat16(), "weight_zero_point": zero}, scheme)
            tensors.update({f"{PREFIX}.{e}.{proj}.{k}": v for k, v in packed.items()})
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                            ignore=["lm_head", "re:.*mlp.gate$"], quantization_status="compressed")
    return tensors, json.loads(json.dumps(qc.model_dump(exclude_none=True)))  # as config.json holds it


def build(fmt: str, w13: torch.Tensor, w2: torch.Tensor, b13: torch.Tensor | None, b2: torch.Tensor | None
          ) -> tuple[dict, dict | None, str]:
    """(checkpoint tensors, quantization_config, model_type) of `fmt` from the float weights."""
    if fmt == "unquantized (transformers fused)":
        ew = ExpertWeights.from_float(w13, w2, unquantized(), dtype=torch.bfloat16)
        return unquantized_tensors(ew, PREFIX, "fused"), None, "qwen3_moe"
    if fmt == "gptq int4 act-order":
        gen = torch.Generator().manual_seed(1)
        g_idx = (torch.stack([torch.randperm(K, generator=gen) // 64 for _ in range(E)]).int(),
                 torch.stack([torch.randperm(N, generator=gen) // 64 for _ in range(E)]).int())
        ew = ExpertWeights.from_float(w13, w2, int4_w4a16(64, act_order=True, scale_dtype="fp16"), g_idx=g_idx)
        qc = {"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True, "desc_act": True}
        return gptq_tensors(ew, PREFIX), qc, "qwen3_moe"
    if fmt == "awq int4":
        ew = ExpertWeights.from_float(w13, w2, int4_w4a16(64, zero_point=True, scale_dtype="fp16"))
        qc = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm"}
        return awq_tensors(ew, PREFIX), qc, "qwen3_moe"
    if fmt == "compressed-tensors int4 asym":
        tensors, qc = compressed_tensors_checkpoint(w13, w2)
        return tensors, qc, "qwen3_moe"
    if fmt == "gpt-oss mxfp4":
        ew = ExpertWeights.from_float(w13, w2, mxfp4_w4a16(), b13, b2)
        return gpt_oss_mxfp4_tensors(ew, PREFIX), {"quant_method": "mxfp4"}, "gpt_oss"
    if fmt == "block fp8 (deepseek-v3)":
        ew = ExpertWeights.from_float(w13, w2, fp8_w8a8("block"))
        qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
        return block_fp8_tensors(ew, PREFIX), qc, "deepseek_v3"
    raise ValueError(fmt)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main() -> None:
    # These shapes are tiny: one thread avoids torch 2.15's per-call thread-pool cost in index_add_
    # (about 60 ms a call on 2 threads, 5 us on one), which the fp32 reference uses.
    torch.set_num_threads(1)
    formats = ["unquantized (transformers fused)", "gptq int4 act-order", "awq int4", "compressed-tensors int4 asym",
               "gpt-oss mxfp4", "block fp8 (deepseek-v3)"]
    print(f"{'format':34} {'loaded as':46} {'vs dequantized':>15} {'vs float':>10}   experts (chosen by the oracle)")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in formats:
            gpt_oss = fmt.startswith("gpt-oss")
            config = MoEConfig(num_experts=E, top_k=TOP_K, hidden_size=K, intermediate_size=N, dtype=torch.bfloat16,
                               has_bias=gpt_oss,
                               activation=Activation.swiglu_oai() if gpt_oss else Activation.silu())
            w13, w2, b13, b2 = float_weights(seed=len(fmt), bias=gpt_oss)
            original = ExpertWeights.from_float(w13, w2, unquantized(), b13, b2, dtype=torch.float32)
            try:
                tensors, qc, model_type = build(fmt, w13, w2, b13, b2)
            except ImportError as exc:
                print(f"{fmt:34} not run: {exc.name} is not installed")
                continue
            gen = torch.Generator().manual_seed(7)
            tensors[f"{MLP}.gate.weight"] = torch.randn(E, K, generator=gen).bfloat16()
            hf_config = {"model_type": model_type, "num_experts": E, "num_experts_per_tok": TOP_K}
            if qc is not None:
                hf_config["quantization_config"] = qc
            model_dir = write_model_dir(Path(tmp) / fmt.split()[0], tensors, hf_config)

            loaded = load_layer(model_dir, 0)
            layer = FusedMoE(config, loaded.quant, device="cpu")  # the oracle's choice on this machine
            layer.load_weights(loaded.weights)
            x = torch.randn(TOKENS, K, generator=gen).bfloat16()
            logits = x.float() @ loaded.router_weight.float().t()
            out = layer(x, logits)
            topk_w, topk_ids = route_torch(logits, config.routing, TOP_K)
            vs_loaded = reference_moe(x, loaded.weights, config, topk_w, topk_ids, quant=loaded.quant)
            vs_float = reference_moe(x, original, config, topk_w, topk_ids)
            print(f"{fmt:34} {loaded.quant.name + ' / ' + loaded.format:46} {rel_l2(out, vs_loaded):15.2e} "
                  f"{rel_l2(out, vs_float):10.2e}   {layer.plan.experts_cls.name()}")


if __name__ == "__main__":
    main()
