"""transformers models of real MoE shapes, built from their config classes with random weights on the GPU.

`hf_config(preset, layers)` gives the model config of a preset (the real model's sizes; fewer layers
where asked), `build_model` the causal LM in bf16 on the device (no hub: transformers' own
initialisation), `fused_block` one MoE block of that model after `fuse()`.
"""

from __future__ import annotations

import torch
from torch import nn

# Per preset: (config class, model type, the real model's config values that shape its MoE and attention).
_CONFIGS = {
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(
        hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_hidden_layers=48, vocab_size=151936, max_position_embeddings=40960, decoder_sparse_step=1,
        mlp_only_layers=[], tie_word_embeddings=False, rope_theta=1e6)),
    "mixtral-8x7b": ("MixtralConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
        num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32, vocab_size=32000,
        max_position_embeddings=32768, rope_theta=1e6)),
    "gpt-oss-20b": ("GptOssConfig", dict(
        hidden_size=2880, intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_hidden_layers=24, vocab_size=201088,
        sliding_window=128)),
    "gpt-oss-120b": ("GptOssConfig", dict(
        hidden_size=2880, intermediate_size=2880, num_local_experts=128, num_experts_per_tok=4,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_hidden_layers=36, vocab_size=201088,
        sliding_window=128)),
    "deepseek-v3": ("DeepseekV3Config", dict(
        hidden_size=7168, moe_intermediate_size=2048, intermediate_size=18432, n_routed_experts=256,
        num_experts_per_tok=8, n_group=8, topk_group=4, routed_scaling_factor=2.5, n_shared_experts=1,
        norm_topk_prob=True, first_k_dense_replace=0, num_attention_heads=128, num_key_value_heads=128,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        num_hidden_layers=61, vocab_size=129280)),
}


def hf_config(preset: str, layers: int | None = None):
    import transformers

    cls_name, values = _CONFIGS[preset]
    values = dict(values)
    if layers is not None:
        values["num_hidden_layers"] = layers
    config = getattr(transformers, cls_name)(**values)
    # gpt-oss's attention sinks have no sdpa path in transformers: its eager attention.
    config._attn_implementation = "eager" if config.model_type == "gpt_oss" else "sdpa"
    return config


def build_model(preset: str, layers: int | None, device: torch.device, seed: int = 0) -> nn.Module:
    """The causal LM of `preset` in bf16 on `device`, weights from transformers' initialisation."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = hf_config(preset, layers)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval()


class _OneBlock(nn.Module):
    """What `fuse()` needs around a lone block: a module with the model's config."""

    def __init__(self, config, block: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.mlp = block


def fused_block(preset: str, quant, device: torch.device) -> tuple[nn.Module, torch.dtype]:
    """One MoE block of `preset`'s model, random bf16 weights, fused with `quant` on the triton backend."""
    from moe_core.integrations._models import MODELS
    from moe_core.integrations.transformers import fuse

    config = hf_config(preset, 1)
    module, _, cls_name = MODELS[config.model_type].block.partition(":")
    import importlib

    block_cls = getattr(importlib.import_module(module), cls_name)
    torch.manual_seed(0)
    with torch.device(device):
        holder = _OneBlock(config, block_cls(config).to(torch.bfloat16))
    for p in holder.parameters():  # transformers' _init_weights is not run on a lone block
        p.data.normal_(0, 0.02)
    fuse(holder, quant=quant, prefer="triton")
    return holder.mlp.eval(), torch.bfloat16
