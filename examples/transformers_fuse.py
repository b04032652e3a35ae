"""Fuse a tiny random Qwen3-MoE from transformers and compare its logits with the eager model.

    uv run python examples/transformers_fuse.py [--prefer BACKEND]

No download: the model is built from `Qwen3MoeConfig` with random weights. Without --prefer the
oracle picks the backend; if no installed backend serves this machine, the example says so, prints
the candidate table and runs on moe-core's fp32 reference instead.
"""

from __future__ import annotations

import argparse

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from moe_core import NoBackendError
from moe_core.integrations.transformers import fuse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefer", default=None, help="force a backend (e.g. cpu, triton, reference)")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = Qwen3MoeConfig(hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
                            num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, vocab_size=256, initializer_range=0.1)
    config.experts_implementation = "eager"  # transformers' own per-expert loop as the baseline
    model = Qwen3MoeForCausalLM(config).eval()
    token_ids = torch.randint(0, config.vocab_size, (2, 16))

    with torch.no_grad():
        eager_logits = model(token_ids).logits
        try:
            report = fuse(model, prefer=args.prefer)
        except NoBackendError as exc:
            print(f"no installed backend serves this machine:\n{exc}\n\nrunning on prefer='reference' instead\n")
            report = fuse(model, prefer="reference")
        fused_logits = model(token_ids).logits

    print(report)
    print()
    print(report.layers[0].plan.explain())
    print()
    diff = (fused_logits - eager_logits).abs().max().item()
    print(f"max |fused - eager| logit difference: {diff:.3e} (logits up to {eager_logits.abs().max().item():.2f})")


if __name__ == "__main__":
    main()
