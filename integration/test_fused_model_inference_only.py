"""A model fused by `fuse()` is inference-only: with grad mode enabled (training) it raises FusedMoE's
error instead of training with gradients that silently skip the experts; under no_grad it runs."""

from __future__ import annotations

import pytest
import torch
import transformers

from moe_core.integrations.transformers import fuse


def _fused_tiny_mixtral():
    torch.manual_seed(0)
    config = transformers.MixtralConfig(hidden_size=64, vocab_size=128, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16, intermediate_size=96, num_local_experts=4,
                                        num_experts_per_tok=2)
    model = transformers.MixtralForCausalLM(config)
    fuse(model, prefer="reference")
    return model


_REFUSAL = (r"FusedMoE is inference-only and computes no gradients, but hidden_states and router_logits require "
            r"grad .* under torch.no_grad\(\) or torch.inference_mode\(\)")


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_fused_model_with_grad_raises(mode):
    model = _fused_tiny_mixtral()
    model.train(mode == "train")
    token_ids = torch.randint(0, 128, (2, 6))
    with pytest.raises(RuntimeError, match=_REFUSAL):
        model(token_ids, labels=token_ids).loss.backward()


def test_fused_model_runs_under_no_grad_and_inference_mode():
    model = _fused_tiny_mixtral().eval()
    token_ids = torch.randint(0, 128, (2, 6))
    with torch.no_grad():
        expected = model(token_ids).logits
    with torch.inference_mode():
        torch.testing.assert_close(model(token_ids).logits, expected, rtol=0, atol=0)
