"""Where a fused bf16 model's logits depart from transformers' own: before or after a routing slip.

A Mixtral of hidden size 4096 (experts 3584 wide, 8 experts, top-2), or with --model gpt-oss a
gpt-oss of gpt-oss-20b's widths (hidden and expert width 2880, 32 experts, top-4, a 32000-token
vocabulary), random weights, bf16, at 2, 4 and 8 layers (gpt-oss: 2 and 4), 2 sequences of 32 tokens,
run by transformers eager and then after `fuse()` on the `cpu` backend. A slip: a (layer, token)
whose chosen experts differ between the runs (bf16 near-ties). Prints the logits' relative L2 error
over all positions, the slips, and the error at the positions before their sequence's first slip
against the positions after it.

    uv run python benchmarks/cpu_routing_slips.py [--model mixtral|gpt-oss]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_transformers_parity import _record_routing

from _parity import record_fused_routing, relative_l2
from moe_core.integrations.transformers import fuse


def config_of(model: str, layers: int):
    if model == "gpt-oss":
        config = transformers.GptOssConfig(hidden_size=2880, intermediate_size=2880, num_local_experts=32,
                                           num_experts_per_tok=4, num_attention_heads=64, num_key_value_heads=8,
                                           head_dim=64, num_hidden_layers=layers, vocab_size=32000, sliding_window=128)
        config._attn_implementation = "eager"  # gpt-oss's attention sinks have no sdpa path
        return config
    return transformers.MixtralConfig(hidden_size=4096, intermediate_size=3584, num_local_experts=8,
                                      num_experts_per_tok=2, num_attention_heads=32, num_key_value_heads=8,
                                      num_hidden_layers=layers, vocab_size=32000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["mixtral", "gpt-oss"], default="mixtral")
    args = parser.parse_args()
    for layers in (2, 4) if args.model == "gpt-oss" else (2, 4, 8):
        config = config_of(args.model, layers)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
        ids = torch.randint(0, config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            eager_routing = _record_routing([layer.mlp for layer in model.model.layers])
            eager = model(ids).logits.float()
            report = fuse(model, prefer="cpu")
            fused_routing = record_fused_routing(model.get_submodule(layer.name) for layer in report.layers)
            fused = model(ids).logits.float()
        slipped = torch.stack([(e != f).any(-1) for e, f in zip(eager_routing, fused_routing)])  # [layers, tokens]
        before = slipped.any(0).view(ids.shape).int().cumsum(1) == 0
        after = relative_l2(fused[~before], eager[~before]) if (~before).any() else float("nan")
        print(f"{layers} layers: logits rel. err {relative_l2(fused, eager):.4f}; slips {int(slipped.sum())} of "
              f"{slipped.numel()} routings; before a slip ({int(before.sum())} of {before.numel()} positions) "
              f"{relative_l2(fused[before], eager[before]):.4f}, after {after:.4f}", flush=True)


if __name__ == "__main__":
    main()
