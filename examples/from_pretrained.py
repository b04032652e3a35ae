"""Load a quantized MoE checkpoint into transformers with its experts on moe_core kernels, then generate.

    uv run python examples/from_pretrained.py Qwen/Qwen3-30B-A3B-GPTQ-Int4 --device cuda
    uv run python examples/from_pretrained.py --tiny          # offline: a 2-layer GPTQ checkpoint written here

A repo id is fetched into the Hugging Face cache (config and safetensors) unless it is there already; a
local directory is read in place. Every MoE block is fused and its experts are read layer by layer
straight into the kernel's layout at the checkpoint's precision (here GPTQ int4); attention linears the
checkpoint quantized too are dequantized to the model dtype (a logged note says so).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import torch

from moe_core.integrations.transformers import from_pretrained


def tiny_gptq_checkpoint(directory: Path) -> Path:
    """A random 2-layer Qwen3-MoE in GPTQ int4 (experts and attention), written by moe_core.weights.writers."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from moe_core.quant import int4_w4a16
    from moe_core.weights import ExpertWeights
    from moe_core.weights.writers import gptq_tensors, quantized_linear_tensors, write_model_dir

    config = Qwen3MoeConfig(hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_experts=8,
                            num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, vocab_size=256, initializer_range=0.1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    quant = int4_w4a16(64, scale_dtype="fp16")
    tensors = {}
    for name, t in model.state_dict().items():
        if ".experts." in name:
            continue
        if ".self_attn." in name and name.endswith("_proj.weight"):
            tensors.update(quantized_linear_tensors(t, name.removesuffix(".weight"), "gptq", quant.weight))
        else:
            tensors[name] = t.bfloat16()
    for i in range(config.num_hidden_layers):
        experts = model.model.layers[i].mlp.experts
        weights = ExpertWeights.from_float(experts.gate_up_proj.data, experts.down_proj.data, quant)
        tensors.update(gptq_tensors(weights, f"model.layers.{i}.mlp.experts"))
    hf_config = {**config.to_dict(), "dtype": "bfloat16",
                 "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True,
                                         "desc_act": False}}
    return write_model_dir(directory, tensors, hf_config, shards=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="Qwen/Qwen3-30B-A3B-GPTQ-Int4", help="repo id or directory")
    parser.add_argument("--tiny", action="store_true", help="write and load a tiny random GPTQ checkpoint instead")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prefer", default=None, help="force a backend (cpu, triton, marlin, reference, ...)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # per-layer progress of the load

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_gptq_checkpoint(Path(tmp) / "tiny-gptq") if args.tiny else args.model
        model = from_pretrained(path, device=args.device, prefer=args.prefer)
        print(model.fuse_report)
        if args.tiny:
            ids = torch.randint(0, model.config.vocab_size, (1, 8), device=args.device)
            with torch.inference_mode():
                print("generated ids:", model.generate(ids, max_new_tokens=8, do_sample=False)[0, 8:].tolist())
            return
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        prompt = tokenizer("Mixture-of-Experts layers route each token to", return_tensors="pt").to(args.device)
        with torch.inference_mode():
            out = model.generate(**prompt, max_new_tokens=32, do_sample=False)
        print(tokenizer.decode(out[0], skip_special_tokens=True))


if __name__ == "__main__":
    main()
