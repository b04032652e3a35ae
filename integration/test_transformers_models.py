"""Every MoE model type of the installed transformers: fused with parity, or refused with its reason.

The model types come from transformers itself (`moe_model_types()`: modeling modules with MoE code,
configs declaring experts); each must be classified in `moe_core.integrations._models.MODELS`, so a
new transformers release's new MoE types fail `test_every_moe_model_type_is_classified` until they
are described or refused.

Each served type is built tiny from its own config class (hidden 64, 2 layers, 8 experts, top-2;
`TINY_OVERRIDES` for the few whose configs need more), randomly initialized with
initializer_range=0.1 and every bias (router biases, selection biases) redrawn so it takes part
(`UNINITIALIZED_EXPERTS`: experts the model's own init leaves unset are drawn too).
Checks, as in test_transformers_parity.py (its module docstring states the tolerances and the
routing-slip rule, reused here):

- every fused block against the eager block it replaced, on fresh random hidden states, 3-D
  [batch, seq, K] and 2-D [tokens, K] where the eager block accepts 2-D;
- the model's output (logits, or the last hidden state for a base model) on random token ids, at
  the positions before each sequence's first routing slip.

Routing is recorded on both sides from the experts' inputs (eager: the experts module's top-k ids;
fused: the ids `FusedMoE.route` computes from the logits it receives).
"""

from __future__ import annotations

import zlib

import pytest
import torch
import transformers
from torch import nn

from _parity import record_fused_routing, relative_l2, unslipped_positions
from moe_core.integrations._descriptors import BlockDescriptor, Refused
from moe_core.integrations.transformers import (
    FusedMoEBlock,
    UnsupportedModelError,
    fuse,
    model_table,
    moe_blocks,
    moe_model_types,
    supported_model_types,
)

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
VOCAB = 128
SEQ = (2, 12)

# Applied to the config and each sub-config wherever the attribute already exists (not None).
TINY = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB,
            num_experts=8, n_routed_experts=8, num_local_experts=8, moe_num_experts=8, num_experts_per_tok=2,
            moe_k=2, moe_topk=2, n_group=4, topk_group=2, initializer_range=0.1, first_k_dense_replace=1,
            kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
            n_shared_experts=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# Per model type: attributes set after TINY (on the config, or on "text_config.<attr>").
TINY_OVERRIDES: dict[str, dict] = {
    "gpt_oss": {"swiglu_limit": 1.0, "sliding_window": 8},
    "deepseek_v2": {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2},
    "glm4v_moe": {"text_config.rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                  "mrope_section": [1, 1, 2], "partial_rotary_factor": 0.5}},
    "glm4v_moe_text": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                           "mrope_section": [1, 1, 2], "partial_rotary_factor": 0.5}},
    "lfm2_moe": {"num_dense_layers": 1, "layer_types": ["full_attention", "full_attention"]},
    "hunyuan_v1_moe": {"head_dim": 16},
    "flint": {"mlp_only_layers": [0]},
    "llama4": {"text_config.num_experts_per_tok": 1},
    "llama4_text": {"num_experts_per_tok": 1},
    "granitemoehybrid": {"mamba_n_heads": 2, "mamba_d_state": 16, "mamba_chunk_size": 16},
    # Per-layer attention fields (TINY skips them) and its sparse-attention indexer, made tiny.
    "dots3_note_text": {"num_attention_heads": 4, "num_key_value_heads": 4, "index_n_heads": 2, "index_head_dim": 16,
                        "index_topk": 8},
    # DSA attention layers take no RoPE dimensions; the first layers are dense by default.
    "glm5_next_text": {"qk_rope_head_dim": 0, "mlp_layer_types": ["dense", "sparse"]},
    "glm5_next": {"text_config.qk_rope_head_dim": 0, "text_config.mlp_layer_types": ["dense", "sparse"]},
    "deepseek_ocr2_text": {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                           "mlp_layer_types": ["dense", "sparse"]},
    "unlimited_ocr_text": {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2},
    "beam": {"mlp_layer_types": ["dense", "sparse"]},
    # The talker's text config lacks the field its MoE block reads for the shared expert's width.
    "qwen3_omni_moe_talker_text": {"shared_expert_intermediate_size": 48},
}


# Set wherever the config has the attribute, even if unset (None): a MoE config must route somewhere.
_ALWAYS = ("num_experts_per_tok", "n_routed_experts", "n_shared_experts")


# Model types without an auto model class: the transformers class that holds their MoE blocks.
MODEL_CLASSES = {"qwen3_omni_moe_text": "Qwen3OmniMoeThinkerTextModel",
                 "qwen3_omni_moe_talker_text": "Qwen3OmniMoeTalkerModel",
                 "deepseek_ocr2_text": "DeepseekOcr2TextModel", "unlimited_ocr_text": "UnlimitedOcrTextModel"}
# Models whose own init leaves the experts' weights as allocated (torch.empty): drawn here like the others'.
UNINITIALIZED_EXPERTS = {"qwen3_omni_moe_talker_text"}
# Models fed embeddings: the talker embeds codec tokens (get_input_embeddings) and has no embed_tokens
# for input_ids.
EMBEDS_INPUT = {"qwen3_omni_moe_talker_text"}


def _tiny_kwargs(config) -> dict:
    """TINY's values for the attributes this config has (set, or always-set ones)."""
    kwargs = {}
    for name, value in TINY.items():
        try:
            present = getattr(config, name, None) is not None or (name in _ALWAYS and hasattr(config, name))
        except Exception:
            continue
        if present:
            kwargs[name] = value
    if "qk_rope_head_dim" in kwargs:  # multi-head latent attention: head dims derive from the lora dims
        kwargs.pop("head_dim", None)
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
    return kwargs


def _set(config, name: str, value) -> None:
    *path, last = name.split(".")
    for part in path:
        config = getattr(config, part)
    setattr(config, last, value)


def tiny_config(model_type: str, kwargs_of=_tiny_kwargs):
    """The model type's own config class, built with tiny sizes (so derived fields follow them);
    `kwargs_of(config)`: the values each config and sub-config is built with."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_cls = CONFIG_MAPPING[model_type]
    overrides = TINY_OVERRIDES.get(model_type, {})
    top = {k: v for k, v in overrides.items() if "." not in k}
    default = config_cls()
    kwargs = {**kwargs_of(default), **top}
    for sub in ("text_config", "thinker_config", "vision_config", "audio_config"):
        part = getattr(default, sub, None)
        if part is not None and not isinstance(part, dict):
            # The sub-config's own overrides go in as it is built: its validation sees them.
            sub_overrides = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith(f"{sub}.")}
            kwargs[sub] = type(part)(**{**kwargs_of(part), **sub_overrides})
    config = config_cls(**kwargs)
    for name, value in overrides.items():
        if "." in name:
            _set(config, name, value)
    return config


def _auto_model(model_type: str, config) -> nn.Module:
    try:
        model = transformers.AutoModelForCausalLM.from_config(config)
    except ValueError:  # no causal-LM head registered for this config: the base model
        model = None
    if model is None or model.config.model_type != model_type:  # a multimodal type: its own model class
        model = transformers.AutoModel.from_config(config)
    return model


def instantiate(model_type: str, config) -> nn.Module:
    """The model of `config` (fp32), eager experts, every bias redrawn so it takes part."""
    config.experts_implementation = "eager"
    if model_type in MODEL_CLASSES:
        model = getattr(transformers, MODEL_CLASSES[model_type])(config)
    else:
        model = _auto_model(model_type, config)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if "bias" in name.rsplit(".", 1)[-1] and tensor.dtype.is_floating_point:
                tensor.normal_(0.0, 0.1)
            elif model_type in UNINITIALIZED_EXPERTS and name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
                tensor.normal_(0.0, config.initializer_range)
    return model


def build_model(model_type: str, dtype: torch.dtype, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return instantiate(model_type, tiny_config(model_type)).to(dtype=dtype).eval()




def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _model_output(model: nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
    if model.config.model_type in EMBEDS_INPUT:
        out = model(inputs_embeds=model.get_input_embeddings()(token_ids), use_cache=False)
    else:
        out = model(input_ids=token_ids, use_cache=False)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _record_eager_routing(blocks, desc: BlockDescriptor) -> list[torch.Tensor]:
    """Each block call's chosen experts: the ids its experts module receives, or for experts that get
    pre-weighted inputs only (Llama 4), the experts its router's dense scores select."""
    calls: list[torch.Tensor] = []
    for block in blocks:
        if desc.router_output is not None and desc.routing.weight_on_input:
            router = block.get_submodule(desc.router_output[0])
            top_k = router.top_k
            router.register_forward_hook(
                lambda module, args, out, k=top_k: calls.append(out[1].topk(k, dim=-1).indices.sort(dim=-1).values))
        else:
            experts = block.get_submodule(desc.experts)
            experts.register_forward_pre_hook(lambda module, args: calls.append(args[1].sort(dim=-1).values))
    return calls






def _block_class(desc: BlockDescriptor) -> type:
    import importlib

    module, _, name = desc.block.partition(":")
    return getattr(importlib.import_module(module), name)


def check_model(model_type: str, dtype: torch.dtype) -> None:
    desc = model_table()[model_type]
    model = build_model(model_type, dtype, seed=zlib.crc32(f"{model_type} {dtype}".encode()))
    block_cls = _block_class(desc)
    eager_blocks = {name: m for name, m in model.named_modules() if type(m) is block_cls}
    assert eager_blocks, f"tiny {model_type} has no {block_cls.__name__}"
    eager_routing = _record_eager_routing(eager_blocks.values(), desc)
    token_ids = torch.randint(3, VOCAB, SEQ)
    with torch.no_grad():
        eager_out = _model_output(model, token_ids)
        eager_calls = list(eager_routing)
        report = fuse(model)
        assert report.model_type == model_type
        assert [layer.name for layer in report.layers] == list(eager_blocks)
        fused_blocks = []
        for layer in report.layers:
            fused = model.get_submodule(layer.name)
            assert isinstance(fused, FusedMoEBlock)
            fused_blocks.append(fused)
            K = fused.moe.config.hidden_size
            hidden_3d = torch.randn(*SEQ, K, dtype=dtype)
            eager_calls_before = len(eager_routing)
            expected = _first(eager_blocks[layer.name](hidden_3d))
            error = relative_l2(_first(fused(hidden_3d)), expected)
            assert error < TOLERANCE[dtype], f"{layer.name} (3-D) on {layer.backend}: relative L2 {error:.2e}"
            hidden_2d = hidden_3d.reshape(-1, K)
            try:
                expected_2d = _first(eager_blocks[layer.name](hidden_2d))
            except (ValueError, RuntimeError, IndexError):
                expected_2d = None  # the eager block unpacks (batch, seq, hidden): 3-D only
            if expected_2d is not None:
                error = relative_l2(_first(fused(hidden_2d)), expected_2d)
                assert error < TOLERANCE[dtype], f"{layer.name} (2-D) on {layer.backend}: relative L2 {error:.2e}"
            del eager_routing[eager_calls_before:]
        fused_routing = record_fused_routing(fused_blocks)
        fused_out = _model_output(model, token_ids)
    keep = unslipped_positions(eager_calls, fused_routing, SEQ, dtype)
    assert keep.float().mean() >= 0.25, f"only {int(keep.sum())} of {keep.numel()} positions precede a routing slip"
    error = relative_l2(fused_out[keep], eager_out[keep])
    assert error < TOLERANCE[dtype], (f"{model_type} {dtype} output on {report.layers[0].backend} at {int(keep.sum())} "
                                      f"of {keep.numel()} positions: relative L2 {error:.2e}")


DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model_type", supported_model_types())
def test_fused_model_parity(model_type, dtype):
    check_model(model_type, dtype)


def test_models_page_is_current():
    from pathlib import Path

    from moe_core.integrations.transformers import models_markdown

    page = Path(__file__).resolve().parents[1] / "docs" / "models.md"
    assert page.read_text() == models_markdown(), ("docs/models.md is stale: regenerate it with "
                                                   "python -c 'from moe_core.integrations.transformers import "
                                                   "models_markdown; print(models_markdown(), end=\"\")' > docs/models.md")


def test_every_moe_model_type_is_classified():
    table = model_table()
    unclassified = sorted(set(moe_model_types()) - set(table))
    assert not unclassified, (f"MoE model types of transformers {transformers.__version__} that "
                              f"moe_core.integrations._models.MODELS neither describes nor refuses: {unclassified}")
    stale = sorted(set(table) - set(moe_model_types()))
    assert not stale, f"MODELS entries that are not MoE model types of this transformers: {stale}"


@pytest.mark.parametrize("model_type", sorted(t for t, d in model_table().items()
                                              if isinstance(d, Refused) and d.kind == "unsupported"))
def test_refused_model_type_names_the_reason(model_type):
    reason = model_table()[model_type].reason

    class Stub(nn.Module):
        config = type("Config", (), {"model_type": model_type})()

    with pytest.raises(UnsupportedModelError, match=rf"model_type {model_type!r}.*not supported: "):
        fuse(Stub())
    assert len(reason) > 20


def test_moe_blocks_are_the_blocks_fuse_replaces():
    model = build_model("qwen3_moe", torch.float32, seed=0)
    names = [name for name, _ in moe_blocks(model)]
    assert names and all(name.endswith(".mlp") for name in names)
    report = fuse(model)
    assert [layer.name for layer in report.layers] == names
    with pytest.raises(UnsupportedModelError, match=r"moe_blocks: qwen3_moe model .* has no .* blocks"):
        moe_blocks(model)  # fused: none left
