"""Hugging Face `config.json` -> `MoEConfig` and `MoEQuantConfig`, exactly or not at all.

Each supported `model_type` maps its router and expert fields to the descriptors; anything the
descriptors cannot express raises `UnsupportedModelError` naming the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.quant import MoEQuantConfig, mxfp4_w4a16, unquantized

__all__ = ["SUPPORTED_MODEL_TYPES", "UnsupportedModelError", "load_hf_config", "moe_config_from_hf", "quant_from_hf"]


class UnsupportedModelError(ValueError):
    """The model's MoE block cannot be expressed exactly by moe_core's descriptors."""


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_GATED = {"silu": Activation.silu, "swish": Activation.silu, "gelu": Activation.gelu,
          "gelu_pytorch_tanh": Activation.gelu_tanh, "gelu_new": Activation.gelu_tanh}


def load_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read config.json from a file or a model directory."""
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "config.json")
    with open(p) as f:
        cfg = json.load(f)
    if "text_config" in cfg:  # multimodal wrappers keep the language model under text_config
        text = dict(cfg["text_config"])
        text.setdefault("quantization_config", cfg.get("quantization_config"))
        return text
    return cfg


# Names transformers' config classes accept for the same field (their `attribute_map`s, e.g.
# Qwen3MoeConfig writes `num_local_experts` and reads `num_experts` through the map; OlmoeConfig the
# reverse). Used when transformers is not installed; with it, the config class's own map is read too.
_ALIASES: dict[str, tuple[str, ...]] = {
    "num_experts": ("num_local_experts", "n_routed_experts"),
    "num_local_experts": ("num_experts", "n_routed_experts"),
    "n_routed_experts": ("num_local_experts", "num_experts"),
    "num_experts_per_tok": ("experts_per_token", "num_experts_per_token"),
}


def _transformers_aliases(model_type: object) -> dict[str, str]:
    """The installed transformers config class's attribute_map (alias -> stored name), or {}."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return {}
    try:
        return dict(getattr(CONFIG_MAPPING[model_type], "attribute_map", {}) or {})
    except (KeyError, ImportError):
        return {}


def _need(cfg: Mapping[str, Any], *names: str) -> Any:
    """The first of `names` the config sets, each also under the aliases transformers accepts for it."""
    attribute_map = _transformers_aliases(cfg.get("model_type"))
    tried: list[str] = []
    for n in names:
        for candidate in (n, attribute_map.get(n), *_ALIASES.get(n, ())):
            if candidate is None or candidate in tried:
                continue
            tried.append(candidate)
            if cfg.get(candidate) is not None:
                return cfg[candidate]
    raise UnsupportedModelError(f"{cfg.get('model_type')}: config has none of {tuple(tried)}")


def _activation(cfg: Mapping[str, Any]) -> Activation:
    act = cfg.get("hidden_act", "silu")
    if act not in _GATED:
        raise UnsupportedModelError(f"{cfg.get('model_type')}: hidden_act={act!r} is not supported "
                                    f"(supported: {sorted(_GATED)})")
    return _GATED[act]()


def _softmax_model(cfg, experts_key: str, inter_key: str, renormalize: bool) -> dict[str, Any]:
    return dict(num_experts=_need(cfg, experts_key), top_k=_need(cfg, "num_experts_per_tok"),
                intermediate_size=_need(cfg, inter_key), activation=_activation(cfg),
                routing=Routing.softmax_topk(renormalize))


def _fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    mt = cfg.get("model_type")
    if mt == "mixtral":
        return _softmax_model(cfg, "num_local_experts", "intermediate_size", renormalize=True)
    if mt in ("qwen2_moe", "qwen3_moe"):
        return _softmax_model(cfg, "num_experts", "moe_intermediate_size", bool(cfg.get("norm_topk_prob", False)))
    if mt == "olmoe":
        return _softmax_model(cfg, "num_experts", "intermediate_size", bool(cfg.get("norm_topk_prob", False)))
    if mt == "deepseek_v3":
        if cfg.get("scoring_func", "sigmoid") != "sigmoid" or cfg.get("topk_method", "noaux_tc") != "noaux_tc":
            raise UnsupportedModelError("deepseek_v3: only scoring_func='sigmoid' with topk_method='noaux_tc' "
                                        f"is supported, got {cfg.get('scoring_func')!r}/{cfg.get('topk_method')!r}")
        return dict(num_experts=_need(cfg, "n_routed_experts"), top_k=_need(cfg, "num_experts_per_tok"),
                    intermediate_size=_need(cfg, "moe_intermediate_size"), activation=_activation(cfg),
                    routing=Routing.deepseek_v3(_need(cfg, "n_group"), _need(cfg, "topk_group"),
                                                float(cfg.get("routed_scaling_factor", 1.0)),
                                                renormalize=bool(cfg.get("norm_topk_prob", True))))
    if mt == "gpt_oss":
        # gpt-oss: top-k on the router logits, then softmax over the k kept ones == renormalized softmax.
        return dict(num_experts=_need(cfg, "num_local_experts"),
                    top_k=_need(cfg, "num_experts_per_tok", "experts_per_token"),
                    intermediate_size=_need(cfg, "intermediate_size"),
                    activation=Activation.swiglu_oai(1.702, float(cfg.get("swiglu_limit", 7.0))),
                    routing=Routing.softmax_topk(True), has_bias=True)
    raise UnsupportedModelError(f"model_type={mt!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")


SUPPORTED_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss")


def moe_config_from_hf(cfg: Mapping[str, Any], dtype: torch.dtype | None = None,
                       parallel: ParallelConfig | None = None, max_num_tokens: int = 8192) -> MoEConfig:
    """The MoEConfig of one routed-expert layer of the model (shared experts are the caller's)."""
    fields = _fields(cfg)
    if dtype is None:
        dtype = _DTYPES.get(str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))), torch.bfloat16)
    return MoEConfig(hidden_size=_need(cfg, "hidden_size"), dtype=dtype,
                     parallel=parallel or ParallelConfig(), max_num_tokens=max_num_tokens, **fields)


# A representative routed-expert projection: compressed-tensors resolves schemes per module name.
_EXPERT_MODULE = "model.layers.0.mlp.experts.0.down_proj"


def quant_from_hf(cfg: Mapping[str, Any]) -> MoEQuantConfig:
    """The expert weights' scheme from `quantization_config`, or unquantized when there is none.

    Parsed by the checkpoint readers' own format parsers, so `moe explain --config` and
    `moe_core.weights.load_layer` accept and refuse the same configs. The scale storage dtype is the
    format's usual one; when loading, `load_layer(...).quant` (read from the tensors) is authoritative.
    """
    from moe_core.weights.awq import AWQFormat
    from moe_core.weights.compressed_tensors import compressed_tensors_scheme_for
    from moe_core.weights.fp8 import BlockFP8Format
    from moe_core.weights.gptq import GPTQFormat

    qc = cfg.get("quantization_config")
    if not qc:
        return unquantized()
    method = qc.get("quant_method")
    try:
        if method == "gptq":
            return GPTQFormat.from_config(qc).quant_config()
        if method == "awq":
            return AWQFormat.from_config(qc).quant_config()
        if method == "compressed-tensors":
            scheme = compressed_tensors_scheme_for(qc, [_EXPERT_MODULE])
            return unquantized() if scheme is None else scheme.quant_config()
        if method == "mxfp4":
            return mxfp4_w4a16()
        if method == "fp8":
            return BlockFP8Format.from_config(qc).quant_config()
    except ValueError as exc:
        raise UnsupportedModelError(str(exc)) from exc
    raise UnsupportedModelError(f"quant_method={method!r} is not supported; supported: gptq, awq, "
                                "compressed-tensors (pack-quantized), mxfp4, fp8 (block-wise)")
