"""Hugging Face `config.json` -> `MoEConfig` and `MoEQuantConfig`, exactly or not at all.

Every model type `moe_core.integrations.transformers.fuse` serves is read through the same descriptor
table (`moe_core.integrations._models.MODELS`): each descriptor's `ConfigFields` names the config
attributes its block is built from, and its routing, activation and checks are resolved from those as
`fuse` resolves them from the block. With transformers installed, config.json is parsed by the model
type's own config class (its defaults, attribute_map aliases and sub-configs); without it, or for a
model type the installed release lacks, config.json's keys are read under the same names and the
aliases transformers' classes accept, and a value config.json omits is refused, not guessed.
Anything the descriptors cannot express raises `UnsupportedModelError` naming the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from moe_core.config import Activation, ActivationKind, MoEConfig, ParallelConfig, Routing, Scoring
from moe_core.integrations._descriptors import (
    BlockDescriptor,
    ClampedSilu,
    Fixed,
    Mapped,
    Refused,
    SwigluOAI,
    UnsupportedModelError,
    resolve,
)
from moe_core.integrations._models import MODELS
from moe_core.quant import MoEQuantConfig, mxfp4_w4a16, unquantized

__all__ = ["SUPPORTED_MODEL_TYPES", "ConfigFileError", "UnsupportedModelError", "load_hf_config",
           "moe_config_from_hf", "quant_from_hf"]


class ConfigFileError(ValueError, TypeError):
    """A config.json that holds no JSON object. Also a TypeError: what reading keys of the JSON
    value it does hold raises, which callers catch."""


SUPPORTED_MODEL_TYPES = tuple(sorted(t for t, d in MODELS.items() if isinstance(d, BlockDescriptor)))

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# transformers' ACT2FN names whose functions moe_core computes exactly (as `fuse` accepts their classes).
_ACTIVATIONS = {"silu": ActivationKind.SILU, "swish": ActivationKind.SILU, "gelu": ActivationKind.GELU,
                "gelu_new": ActivationKind.GELU_TANH, "gelu_pytorch_tanh": ActivationKind.GELU_TANH,
                "relu2": ActivationKind.RELU2}


def load_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read config.json from a file or a model directory; multimodal wrappers give their text_config
    (with the wrapper's quantization_config). Invalid JSON raises json.JSONDecodeError and JSON that is
    no object `ConfigFileError`, both ValueErrors naming the file."""
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "config.json")
    with open(p) as f:
        text = f.read()
    try:
        cfg = _decode_special_floats(json.loads(text))
    except json.JSONDecodeError as exc:
        raise json.JSONDecodeError(f"{exc.msg} in {p}", exc.doc, exc.pos) from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise ConfigFileError(f"{p}: JSON nested too deeply to read (past Python's recursion limit); a "
                              "config.json is a few levels deep") from None
    if not isinstance(cfg, dict):
        raise ConfigFileError(f"{p} holds a JSON {type(cfg).__name__}, not an object (a config.json is one)")
    if "text_config" in cfg:  # multimodal wrappers keep the language model under text_config
        if not isinstance(cfg["text_config"], dict):
            raise ConfigFileError(f"{p}: text_config is a JSON {type(cfg['text_config']).__name__}, not an object")
        text_config = dict(cfg["text_config"])
        text_config.setdefault("quantization_config", cfg.get("quantization_config"))
        return text_config
    return cfg


# How transformers writes the floats JSON has no numbers for (its config.json writer and reader).
_FLOAT_TAG = "__float__"
_FLOAT_TAG_VALUES = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _decode_special_floats(value: Any) -> Any:
    """{"__float__": "Infinity"} (transformers' spelling of inf, -inf and NaN) -> the float, anywhere."""
    if isinstance(value, dict):
        if value.keys() == {_FLOAT_TAG} and value[_FLOAT_TAG] in _FLOAT_TAG_VALUES:
            return _FLOAT_TAG_VALUES[value[_FLOAT_TAG]]
        return {k: _decode_special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_special_floats(v) for v in value]
    return value


# Names config.json files use for the same field across transformers releases (their config classes'
# `attribute_map`s, e.g. Qwen3MoeConfig stores `num_local_experts` and reads `num_experts` through the
# map; OlmoeConfig the reverse). Tried in turn where no config class parses the file.
_ALIASES: dict[str, tuple[str, ...]] = {
    "num_experts": ("num_local_experts", "n_routed_experts"),
    "num_local_experts": ("num_experts", "n_routed_experts"),
    "n_routed_experts": ("num_local_experts", "num_experts"),
    "num_experts_per_tok": ("experts_per_token", "num_experts_per_token"),
}


def _config_class(model_type: object) -> type | None:
    """The installed transformers' config class of `model_type`, or None."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return None
    try:
        return CONFIG_MAPPING[model_type]
    except (KeyError, ImportError):
        return None


_ABSENT = object()


class _ConfigView:
    """A model's (text) config, read as the layer's modules read it (see the module docstring)."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self.model_type = cfg.get("model_type")
        self.parsed = None
        config_cls = _config_class(self.model_type)
        if config_cls is not None:
            try:
                self.parsed = config_cls.from_dict(_decode_special_floats(dict(cfg))).get_text_config()
            # ValueError, TypeError, ... and, for a field of the wrong type, huggingface_hub's
            # StrictDataclassError, which is no ValueError.
            except Exception as exc:
                raise UnsupportedModelError(f"{self.model_type}: transformers' {config_cls.__name__} rejects "
                                            f"this config: {exc}") from exc
        text = cfg.get("text_config")
        self.raw = text if isinstance(text, Mapping) else cfg

    def get(self, name: str) -> Any:
        """The value of config attribute `name`, or _ABSENT where the config class has no such attribute
        or, unparsed, config.json leaves it to a default only that class knows."""
        if self.parsed is not None:
            return getattr(self.parsed, name, _ABSENT)
        for candidate in (name, *_ALIASES.get(name, ())):
            if candidate in self.raw:
                return self.raw[candidate]
        return _ABSENT

    def need(self, name: str, field: str) -> Any:
        value = self.get(name)
        if value is None:
            raise UnsupportedModelError(f"{self.model_type}: {field} is read from {name}, which its config sets to None")
        if value is _ABSENT and self.parsed is not None:
            raise UnsupportedModelError(f"{self.model_type}: {field} is read from {name}, which "
                                        f"{type(self.parsed).__name__} does not have")
        if value is _ABSENT:
            names = ", ".join(dict.fromkeys((name, *_ALIASES.get(name, ()))))
            raise UnsupportedModelError(f"{self.model_type}: {field} is read from {name}, but config.json sets none "
                                        f"of {names} (its config class's default needs transformers installed)")
        return _one_value(self.model_type, name, value)


def _one_value(model_type: object, name: str, value: Any) -> Any:
    """A per-layer list (Hunyuan's num_experts, moe_topk) is one layer's value only when all agree."""
    if isinstance(value, list | tuple):
        if not value or any(v != value[0] for v in value):
            raise UnsupportedModelError(f"{model_type}: {name}={value!r} differs between layers; one MoEConfig "
                                        "describes one kind of layer")
        return value[0]
    return value


def _descriptor(model_type: object) -> BlockDescriptor:
    desc = MODELS.get(model_type) if isinstance(model_type, str) else None
    if isinstance(desc, BlockDescriptor):
        return desc
    if isinstance(desc, Refused):
        raise UnsupportedModelError(f"model_type={model_type!r} is not supported: {desc.reason}")
    raise UnsupportedModelError(f"model_type={model_type!r} is not supported; supported: "
                                f"{', '.join(SUPPORTED_MODEL_TYPES)}")


def _block_value(view: _ConfigView, desc: BlockDescriptor, spec: object, field: str) -> object:
    """A descriptor field's value from the config: `At` and `Select` paths through `desc.config`."""
    return resolve(spec, lambda path: _block_attribute(view, desc, path, field), str(view.model_type), field,
                   "its config")


def _block_attribute(view: _ConfigView, desc: BlockDescriptor, path: str, field: str) -> object:
    """The value the block's attribute at `path` takes from the config (None where the config sets none)."""
    try:
        source = desc.config.source(path)
    except KeyError:
        raise UnsupportedModelError(f"{view.model_type}: no config attribute is known for the block's {path} "
                                    f"({field})") from None
    if isinstance(source, Fixed):
        return source.value
    if isinstance(source, Mapped):
        value = view.get(source.name)
        value = None if value is _ABSENT else _one_value(view.model_type, source.name, value)
        return dict(source.cases).get(value, value)
    value = view.get(source)
    if value is _ABSENT:
        return view.need(source, field)  # raises, naming the field
    return _one_value(view.model_type, source, value)


def _activation(view: _ConfigView, desc: BlockDescriptor) -> Activation:
    act = desc.activation
    try:
        if isinstance(act, SwigluOAI):
            return Activation.swiglu_oai(alpha=float(_block_value(view, desc, act.alpha, "activation alpha")),
                                         limit=float(_block_value(view, desc, act.limit, "activation limit")))
        if isinstance(act, ClampedSilu):
            return Activation.silu(clamp=float(_block_value(view, desc, act.limit, "activation limit")))
    except ValueError as exc:
        raise UnsupportedModelError(f"{view.model_type}: {exc}") from exc
    source = desc.config.hidden_act
    name = source.value if isinstance(source, Fixed) else view.need(source, "the experts' activation")
    if name not in _ACTIVATIONS:
        raise UnsupportedModelError(f"{view.model_type}: {source}={name!r} is not supported "
                                    f"(supported: {sorted(_ACTIVATIONS)})")
    return Activation(_ACTIVATIONS[name])


def _routing(view: _ConfigView, desc: BlockDescriptor) -> Routing:
    r = desc.routing
    scoring = _block_value(view, desc, r.scoring, "routing.scoring")
    groups = int(_block_value(view, desc, r.num_expert_groups, "routing.num_expert_groups"))
    renormalize = _block_value(view, desc, r.renormalize, "routing.renormalize")
    if not isinstance(renormalize, bool):  # bool("false") would be True
        raise UnsupportedModelError(f"{view.model_type}: routing.renormalize={renormalize!r} (from its config) is "
                                    "invalid: expected true or false (a JSON boolean)")
    try:
        return Routing(
            scoring=Scoring(scoring) if isinstance(scoring, str) else scoring, renormalize=renormalize,
            renormalize_eps=r.renormalize_eps if renormalize else 0.0, num_expert_groups=groups,
            topk_groups=int(_block_value(view, desc, r.topk_groups, "routing.topk_groups")) if groups > 1 else 1,
            group_scoring=r.group_scoring,
            has_correction_bias=bool(_block_value(view, desc, r.correction_bias, "routing.correction_bias")),
            correction_bias_on_logits=r.correction_bias_on_logits,
            routed_scaling_factor=float(_block_value(view, desc, r.routed_scaling_factor,
                                                     "routing.routed_scaling_factor")),
            weight_on_input=r.weight_on_input)
    except ValueError as exc:
        raise UnsupportedModelError(f"{view.model_type}: {exc}") from exc


def moe_config_from_hf(cfg: Mapping[str, Any], dtype: torch.dtype | None = None,
                       parallel: ParallelConfig | None = None, max_num_tokens: int = 8192) -> MoEConfig:
    """The MoEConfig of one routed-expert layer of the model (shared experts are the caller's): what
    `fuse` builds for that model's blocks."""
    model_type = cfg.get("model_type")
    desc = _descriptor(model_type)
    view = _ConfigView(cfg)
    for check in desc.checks:
        value = _block_attribute(view, desc, check.path, check.path)
        if value not in check.accepted:
            raise UnsupportedModelError(f"{model_type}: {check.path}={value!r}: {check.reason}")
    fields = desc.config
    if dtype is None:
        dtype = _DTYPES.get(str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))), torch.bfloat16)
    try:
        return MoEConfig(
            num_experts=int(view.need(fields.num_experts, "the expert count")),
            top_k=int(_block_value(view, desc, desc.routing.top_k, "routing.top_k")),
            hidden_size=int(view.need("hidden_size", "the hidden size")),
            intermediate_size=int(view.need(fields.intermediate_size, "the experts' intermediate size")),
            activation=_activation(view, desc), routing=_routing(view, desc), dtype=dtype,
            parallel=parallel or ParallelConfig(), has_bias=fields.has_bias, max_num_tokens=max_num_tokens)
    except UnsupportedModelError:
        raise
    except ValueError as exc:
        raise UnsupportedModelError(f"{model_type}: not expressible as a MoEConfig: {exc}") from exc


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
                                "compressed-tensors (pack-quantized int, float-quantized fp8), mxfp4, fp8 (block-wise)")
