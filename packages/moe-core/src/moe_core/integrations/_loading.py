"""`from_pretrained`: a transformers MoE model from a checkpoint, its experts straight into `FusedMoE`.

    model = from_pretrained("Qwen/Qwen3-30B-A3B-GPTQ-Int4", device="cuda")
    print(model.fuse_report)

Steps, each refusing with the reason before the next:
1. the model directory (a folder, a hub-cache snapshot, or a repo id fetched through huggingface_hub),
   its config.json: the model type must be one `fuse` serves, the quantization format one
   `moe_core.weights` reads;
2. the transformers model built from the config with every parameter on the meta device (buffers
   such as rotary frequencies are computed for real), so nothing of the experts is allocated;
3. every MoE block described (as `fuse` does) and its experts found in the checkpoint;
4. the non-expert weights read by name from the safetensors files (through transformers' renamings of
   checkpoint keys where the model type has them) onto `device` in the model's dtype. Linears that the
   checkpoint quantized outside the experts (attention, shared experts) load through transformers'
   own quantizer where it serves the format (compressed-tensors: its modules are set up on the meta
   model before anything is read, take the checkpoint's tensors as stored, and are decompressed by
   compressed-tensors once loaded); otherwise they are dequantized to the model dtype by the same
   readers, with a logged note naming what was missing; none is dropped;
5. layer by layer, the experts read into canonical form by `moe_core.weights.checkpoint.read_layer`
   (quantized experts stay quantized: no 16-bit copy) and converted to the kernel's layout by the
   `FusedMoE` the oracle chose; the block is swapped for a `FusedMoEBlock`.

Peak host memory: the loaded model plus one layer's experts in canonical form (quantized codes, or
16-bit for float checkpoints) and, while a layer is unpacked, its codes one byte each.

The model's `save_pretrained` writes the checkpoint back in its own format (`_saving.py`).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from moe_core._progress import LoggedProgress
from moe_core.config import MoEConfig
from moe_core.integrations._descriptors import BlockDescriptor, Refused, UnsupportedModelError
from moe_core.integrations._models import MODELS
from moe_core.layer import FusedMoE
from moe_core.weights._source import CheckpointError, TensorSource
from moe_core.weights.checkpoint import (
    SUPPORTED_QUANT_METHODS,
    SafetensorsDirectory,
    find_experts_prefix,
    read_layer,
    read_model_config,
)

__all__ = ["CheckpointSource", "from_pretrained"]

_log = logging.getLogger(__name__)
_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass
class CheckpointSource:
    """Where a loaded model's tensors came from, for `save_pretrained` (see `_saving.py`).

    params: checkpoint key -> the fused model's parameter (or buffer) name holding it, or the tensor
    itself where the fused model keeps only a copy (a selection bias inside its FusedMoE).
    raw: checkpoint keys written back as stored (experts, and the tensors of dequantized linears),
    with what must be unchanged for that to be exact (`raw_guards`).
    """

    root: Path
    config: dict
    params: dict[str, str | torch.Tensor] = field(default_factory=dict)
    raw: list[str] = field(default_factory=list)
    raw_guards: list[tuple[str, Callable[[], bool]]] = field(default_factory=list)


# ---- the entry point -------------------------------------------------------------------------------


def from_pretrained(path: str | Path, *, device: object = None, dtype: torch.dtype | None = None,
                    prefer: str | None = None, revision: str | None = None) -> nn.Module:
    """A transformers causal LM from a checkpoint, every MoE block fused, its experts at the
    checkpoint's own precision.

    path: a model directory (config.json and safetensors: one file, or shards with
    model.safetensors.index.json), a hub-cache snapshot directory, or a hub repo id ("org/name",
    downloaded through huggingface_hub into its cache unless there already; `revision` picks one).
    device: where the model runs (default cpu). dtype: the model dtype (default config.json's, else
    bfloat16). prefer: force a backend for every MoE layer, as in `moe_core.select`.

    Formats (config.json's `quantization_config`): none (float weights), GPTQ (act-order included), AWQ
    gemm, compressed-tensors pack-quantized int4/int8 and float-quantized fp8 W8A8 (tensor, channel or
    block weight scales with dynamic per-token, per-tensor or 1 x block-column activation scales, as
    `fp8_w8a8`; static input scales and asymmetric fp8 are refused), block FP8 (`weight_scale_inv`) and
    gpt-oss MXFP4.

    Linears the checkpoint quantized outside the experts (attention, shared experts): compressed-tensors
    ones go through transformers' own compressed-tensors quantizer when it imports (the compressed-tensors
    package): its modules are set up on the meta model, take the checkpoint's tensors as stored, and are
    decompressed by compressed-tensors once loaded, as transformers does on the first forward (so they
    hold a weight of the model dtype and run their scheme, fp8 input rounding included, as in
    transformers' own model). Otherwise, and for GPTQ, AWQ and block FP8 (whose transformers quantizers
    need gptqmodel, optimum, accelerate, kernels or a GPU, and are not applied here), they are dequantized
    to the model dtype by moe_core's readers, with a logged note naming what was missing. Either way
    `save_pretrained` writes their checkpoint tensors back as stored.

    Returns the model in eval mode, with `model.fuse_report` (each layer's backend; `.explain()`
    gives every candidate's reason). Raises UnsupportedModelError (model type, block) or
    CheckpointError / ValueError (format, files, tensors) before loading anything it cannot serve.
    """
    from transformers import AutoConfig

    root, config_json = read_model_config(_model_dir(path, revision))
    model_type = config_json.get("model_type")
    desc = MODELS.get(model_type)
    if isinstance(desc, Refused):
        raise UnsupportedModelError(f"from_pretrained: model_type {model_type!r} is not supported: {desc.reason}")
    if desc is None:
        raise UnsupportedModelError(f"from_pretrained: model_type {model_type!r} ({root / 'config.json'}) is not a "
                                    "MoE model type fuse() serves; see moe_core.integrations.transformers."
                                    "supported_model_types()")
    fmt = _format(root, config_json)
    hf_config = AutoConfig.from_pretrained(root)
    dtype = _model_dtype(dtype, hf_config)
    device = torch.device("cpu" if device is None else device)
    tensors = SafetensorsDirectory(root)

    quantizer = _hf_quantizer(fmt, device)
    model, blocks, layers, plan, quantizer = _skeleton(hf_config, dtype, model_type, desc, tensors, fmt, quantizer)
    source = CheckpointSource(root=root, config=config_json)
    for name, block in blocks:  # refuse a block the descriptors cannot express before reading anything
        _describe(model_type, name, block, desc)

    loaded = _load_dense(model, plan, fmt, tensors, device, dtype, source, quantizer.why_not)
    progress = LoggedProgress(_log, f"loading the experts of {len(blocks)} MoE layers from {root}")
    fused = []
    for i, (name, block) in enumerate(blocks):
        index, prefix = layers[name]
        moe_block = _fused_block(model_type, name, block, desc, tensors, config_json, index, device, dtype, prefer)
        model.set_submodule(name, moe_block)
        source.raw += tensors.keys_under(prefix + ".")
        source.raw_guards.append((f"the experts of {name}", _unchanged_experts(moe_block.moe)))
        fused.append((name, moe_block))
        progress(i + 1, len(blocks))
    _record_param_names(model, loaded, source)
    if plan.kept:
        _decompress(model, quantizer.hf, source)
    _refuse_meta(model)

    from moe_core.integrations._saving import install_save
    from moe_core.integrations.transformers import FusedLayer, FuseReport

    model.fuse_report = FuseReport(model_type, tuple(FusedLayer(name, b.plan) for name, b in fused))
    install_save(model, source)
    return model.eval()


# ---- step 1: files and format -------------------------------------------------------------------------


def _model_dir(path: str | Path, revision: str | None) -> Path:
    """A local directory as it is; "org/name" that is not one is fetched into the hub cache."""
    local = Path(path)
    if local.is_dir():
        if revision is not None:
            raise ValueError(f"revision={revision!r} was given for the local directory {local}; a revision "
                             "selects a hub snapshot: pass the repo id instead")
        return local
    text = str(path)
    if local.exists() or text.count("/") != 1 or text.startswith((".", "/")):
        raise CheckpointError(f"{path}: not a model directory (config.json and safetensors files) nor a hub repo id "
                              "of the form 'org/name'")
    from huggingface_hub import snapshot_download

    _log.info("fetching %s (config, safetensors) through huggingface_hub", text)
    return Path(snapshot_download(text, revision=revision, allow_patterns=["*.json", "*.safetensors"]))


@dataclass(frozen=True)
class _Format:
    """The checkpoint's quantization: how a non-expert linear's tensors are recognised and read."""

    method: str | None  # None: unquantized
    qc: Mapping | None
    markers: tuple[str, ...]  # a module holding any of these tensors was quantized by the checkpoint
    parsed: object = None  # the reader's format record (GPTQFormat, AWQFormat, BlockFP8Format)


def _format(root: Path, config: Mapping) -> _Format:
    qc = config.get("quantization_config")
    if qc is None:
        return _Format(None, None, ())
    if not isinstance(qc, dict):
        raise CheckpointError(f"{root / 'config.json'}: quantization_config must be a JSON object, got {qc!r}")
    method = qc.get("quant_method")
    if method not in SUPPORTED_QUANT_METHODS:
        raise CheckpointError(f"{root / 'config.json'}: quantization_config.quant_method={method!r} is not a format "
                              f"moe_core reads; supported: none (float weights), {', '.join(SUPPORTED_QUANT_METHODS)}")
    try:
        if method == "gptq":
            from moe_core.weights.gptq import GPTQFormat

            return _Format(method, qc, ("qweight",), GPTQFormat.from_config(qc))
        if method == "awq":
            from moe_core.weights.awq import AWQFormat

            return _Format(method, qc, ("qweight",), AWQFormat.from_config(qc))
        if method == "fp8":
            from moe_core.weights.fp8 import BlockFP8Format

            return _Format(method, qc, ("weight_scale_inv",), BlockFP8Format.from_config(qc))
        if method == "compressed-tensors":
            from moe_core.weights.compressed_tensors import check_compressed_tensors_groups

            # every group, not only the experts': e.g. static input scales are refused before loading
            check_compressed_tensors_groups(qc)
            # pack-quantized linears hold weight_packed, float-quantized (fp8) ones weight + weight_scale
            return _Format(method, qc, ("weight_packed", "weight_scale"))
    except ValueError as exc:
        raise CheckpointError(f"{root / 'config.json'}: {exc}") from exc
    return _Format(method, qc, ())  # mxfp4: gpt-oss quantizes the experts only


def _model_dtype(dtype: torch.dtype | None, hf_config) -> torch.dtype:
    if dtype is None:
        dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or torch.bfloat16
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        return dtype if dtype in _FLOAT_DTYPES else torch.bfloat16
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"dtype={dtype} is invalid: expected torch.bfloat16, torch.float16 or torch.float32")
    return dtype


@dataclass(frozen=True)
class _Quantizer:
    """transformers' quantizer for the linears the checkpoint quantized outside the experts, or why
    there is none (said in the note of the linears dequantized instead)."""

    hf: object | None
    why_not: str = ""


# transformers' quantizers of the formats from_pretrained dequantizes: their name and the packages they need
_HF_QUANTIZER_NEEDS = {"gptq": ("GPTQ", ("optimum", "gptqmodel")), "awq": ("AWQ", ("gptqmodel", "accelerate")),
                       "fp8": ("fine-grained FP8", ("accelerate", "kernels"))}


def _hf_quantizer(fmt: _Format, device: torch.device) -> _Quantizer:
    if fmt.method == "compressed-tensors":
        try:
            from transformers.quantizers import AutoHfQuantizer

            quantizer = AutoHfQuantizer.from_config(copy.deepcopy(dict(fmt.qc)), pre_quantized=True)
            quantizer.validate_environment()
        except ImportError as exc:
            return _Quantizer(None, f"transformers' compressed-tensors quantizer is unavailable: {exc}")
        return _Quantizer(quantizer)
    if fmt.method not in _HF_QUANTIZER_NEEDS:
        return _Quantizer(None)  # unquantized, or quantized experts only (mxfp4)
    name, needs = _HF_QUANTIZER_NEEDS[fmt.method]
    missing = [package for package in needs if importlib.util.find_spec(package) is None]
    if missing:
        return _Quantizer(None, f"transformers' {name} quantizer needs {' and '.join(missing)}, which "
                                f"{'is' if len(missing) == 1 else 'are'} not installed")
    if fmt.method == "fp8" and device.type not in ("cuda", "xpu"):
        return _Quantizer(None, f"transformers' {name} quantizer runs fp8 linears on CUDA or XPU only, not "
                                f"{device.type}")
    return _Quantizer(None, f"from_pretrained hands only compressed-tensors linears to transformers' quantizer, "
                            f"not {name} ones")


# ---- step 2: the model without its weights ----------------------------------------------------------


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Register every new parameter on the meta device (buffers stay where they are created: rotary
    frequencies and the like are computed in __init__ and are not in checkpoints)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _meta_model(hf_config, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        with _parameters_on_meta():
            return AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    except ValueError as exc:  # no causal-LM class for this config
        raise UnsupportedModelError(f"from_pretrained: no transformers causal LM class for model_type "
                                    f"{hf_config.model_type!r}: {exc}") from exc


def _blocks(model: nn.Module, model_type: str, desc: BlockDescriptor) -> list[tuple[str, nn.Module]]:
    module, _, cls_name = desc.block.partition(":")
    block_cls = getattr(importlib.import_module(module), cls_name)
    blocks = [(name, m) for name, m in model.named_modules() if type(m) is block_cls]
    if not blocks:
        raise UnsupportedModelError(f"from_pretrained: the {model_type} model built from config.json has no "
                                    f"{block_cls.__name__} blocks")
    return blocks


def _checkpoint_layer(tensors: SafetensorsDirectory, block_name: str) -> tuple[int, str]:
    """(decoder layer index, the checkpoint's experts prefix) of a block such as 'model.layers.3.mlp'."""
    match = _LAYER.search(block_name + ".")
    if match is None:
        raise UnsupportedModelError(f"from_pretrained: MoE block {block_name!r} is not inside a numbered decoder layer "
                                    "('layers.N.'), so its experts cannot be found in the checkpoint")
    index = int(match.group(1))
    return index, find_experts_prefix(tensors, index, str(tensors.root))


def _skeleton(hf_config, dtype: torch.dtype, model_type: str, desc: BlockDescriptor, tensors: SafetensorsDirectory,
              fmt: _Format, quantizer: _Quantizer):
    """(meta model, its MoE blocks, each block's (layer index, experts prefix), the plan of every other
    tensor, the quantizer used). With transformers' quantizer, its modules take the place of the
    linears it quantizes before anything is read; where they do not match the checkpoint's tensors as
    stored, the model is built again without it, and the returned quantizer says why."""
    model = _meta_model(hf_config, dtype)
    if quantizer.hf is not None:
        # the quantizer's own step, not preprocess_model: that also swaps fused experts of some model
        # types (llama4) for per-expert linears, which moe_core reads from the checkpoint itself
        quantizer.hf._process_model_before_weight_loading(model)
    blocks = _blocks(model, model_type, desc)
    layers = {name: _checkpoint_layer(tensors, name) for name, _ in blocks}
    expert_modules = {f"{name}.{desc.experts}" for name, _ in blocks}
    plan = _plan_dense(model, tensors, fmt, {prefix for _, prefix in layers.values()}, expert_modules)
    clash = _layout_clash(model, plan, tensors, fmt)
    if clash is not None:
        return _skeleton(hf_config, dtype, model_type, desc, tensors, fmt, _Quantizer(None, clash))
    return model, blocks, layers, plan, quantizer


def _layout_clash(model: nn.Module, plan: _DensePlan, tensors: SafetensorsDirectory, fmt: _Format) -> str | None:
    """Why transformers' quantizer modules cannot take the checkpoint's tensors as stored, if they cannot
    (compressed-tensors 0.20 lays out an int4 zero point unpacked, [out, groups], which its checkpoints
    store packed, [out / 8, groups])."""
    for name, key in plan.kept.items():
        ours, stored = list(_lookup(model, name).shape), tensors.header(key)[0]
        if ours != stored:
            return (f"transformers' {fmt.method} quantizer lays out {name} as {ours}, but the checkpoint stores "
                    f"{key} as {stored}")
    return None


def _describe(model_type: str, name: str, block: nn.Module, desc: BlockDescriptor):
    from moe_core.integrations.transformers import _resolve

    return _resolve(model_type, name, block, desc)


# ---- step 4: everything but the experts --------------------------------------------------------------


@dataclass
class _DensePlan:
    float_keys: dict[str, str]  # model parameter name -> checkpoint key
    quantized: dict[str, str]  # model module name (a Linear) -> checkpoint module name, to dequantize
    kept: dict[str, str]  # model tensor of a transformers quantizer's module -> checkpoint key, loaded as stored
    tied: dict[str, str]  # model parameter absent from the checkpoint -> the one transformers ties it to


def _renamer(model: nn.Module) -> Callable[[str], str]:
    """Checkpoint key -> model key through transformers' renamings for this model type (e.g. Mixtral's
    block_sparse_moe -> mlp). Converters (which merge tensors) are not applied: they act on experts,
    which the readers take from the checkpoint's own names."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        renamings = [t for t in get_model_conversion_mapping(model) if type(t) is WeightRenaming]
    except (ImportError, AttributeError, TypeError) as exc:  # a transformers without these mappings
        _log.debug("no transformers key renamings (%s); checkpoint keys are used as they are", exc)
        return lambda key: key

    def rename(key: str) -> str:
        for renaming in renamings:
            key = renaming.rename_source_key(key)[0]
        return key

    return rename


def _plan_dense(model: nn.Module, tensors: SafetensorsDirectory, fmt: _Format, expert_prefixes: set[str],
                expert_modules: set[str]) -> _DensePlan:
    """Match every model parameter outside the experts to checkpoint tensors; refuse any left unmatched."""
    rename = _renamer(model)

    def outside(name: str, prefixes: set[str]) -> bool:  # no proper dotted prefix of name is in prefixes
        parts = name.split(".")
        return not any(".".join(parts[:i]) in prefixes for i in range(1, len(parts)))

    wanted = {n for n, _ in model.named_parameters(remove_duplicate=False) if outside(n, expert_modules)}
    wanted |= {n for n, _ in model.named_buffers(remove_duplicate=False)
               if _persistent(model, n) and outside(n, expert_modules)}
    keys = [k for k in tensors if outside(k, expert_prefixes)]
    # modules transformers' quantizer (compressed-tensors) set up: they take the checkpoint's tensors as stored
    held = {name for name, m in model.named_modules() if getattr(m, "quantization_scheme", None) is not None}
    quantized: dict[str, str] = {}  # model Linear -> checkpoint module
    for key in keys:
        module, _, leaf = key.rpartition(".")
        target = rename(f"{module}.weight").removesuffix(".weight")
        if leaf in fmt.markers and f"{target}.weight" in wanted and target not in held:
            quantized[target] = module
    float_keys, kept, unused = {}, {}, []
    quantized_modules = set(quantized.values())
    for key in keys:
        module, _, leaf = key.rpartition(".")
        if module in quantized_modules and leaf != "bias":
            continue  # read by the dequantizer (an fp8 `weight` too, no float weight); a bias loads as a float
        target = rename(key)
        if target not in wanted:
            unused.append(key)
        elif target.rpartition(".")[0] in held and leaf != "bias":
            kept[target] = key
        else:
            float_keys[target] = key
    covered = set(float_keys) | set(kept) | {f"{m}.weight" for m in quantized}
    tied_to = _tied_weights(model)
    tied = {m: tied_to[m] for m in wanted - covered if tied_to.get(m) in covered}
    missing = sorted(wanted - covered - set(tied))
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise CheckpointError(f"{tensors.root}: the checkpoint has no tensor for {len(missing)} of the model's "
                              f"parameters: {shown} (keys are matched by name, after transformers' renamings)")
    if unused:
        _log.warning("%s: %d checkpoint tensor(s) outside the experts match no model parameter and are not "
                     "loaded (as transformers leaves them): %s", tensors.root, len(unused),
                     ", ".join(sorted(unused)[:6]) + (" ..." if len(unused) > 6 else ""))
    return _DensePlan(float_keys, quantized, kept, tied)


def _persistent(model: nn.Module, name: str) -> bool:
    module, _, leaf = name.rpartition(".")
    return leaf not in model.get_submodule(module)._non_persistent_buffers_set


def _tied_weights(model: nn.Module) -> dict[str, str]:
    """Parameter names transformers ties to another (lm_head.weight -> embed_tokens.weight)."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if not getattr(model.config, "tie_word_embeddings", False):
        return {}
    return dict(tied) if isinstance(tied, dict) else {}


def _set_tensor(model: nn.Module, name: str, value: torch.Tensor) -> torch.Tensor:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    if leaf in module._parameters:
        if not isinstance(value, nn.Parameter):
            value = nn.Parameter(value, requires_grad=False)
        module._parameters[leaf] = value
    else:
        module._buffers[leaf] = value
    return value


def _load_dense(model: nn.Module, plan: _DensePlan, fmt: _Format, tensors: SafetensorsDirectory,
                device: torch.device, dtype: torch.dtype, source: CheckpointSource,
                why_not_quantizer: str) -> dict[str, torch.Tensor]:
    """Load the non-expert tensors; returns checkpoint key -> the model tensor now holding it (float
    tensors only: the tensors of quantized linears are written back as stored, `source.raw`)."""
    from moe_core.integrations._dequantize import dequantized_linear

    def load(name: str, key: str) -> torch.Tensor:
        current = _lookup(model, name)
        value = tensors[key]
        if tuple(value.shape) != tuple(current.shape):
            raise CheckpointError(f"{tensors.root}: tensor {key!r} has shape {list(value.shape)}, but the model's "
                                  f"{name} is {list(current.shape)}")
        # the model's own dtype per tensor: transformers keeps some in fp32 (e.g. selection biases)
        target_dtype = current.dtype if current.dtype.is_floating_point else value.dtype
        return _set_tensor(model, name, value.to(device=device, dtype=target_dtype))

    loaded = {key: load(name, key) for name, key in plan.float_keys.items()}
    if plan.kept:
        _log.info("%s: %d linear layer(s) outside the experts are %s-quantized in the checkpoint (e.g. %s); they load "
                  "through transformers' %s quantizer, whose modules compressed-tensors decompresses to %s once "
                  "loaded", tensors.root, len({name.rpartition(".")[0] for name in plan.kept}), fmt.method,
                  next(iter(plan.kept.values())).rpartition(".")[0], fmt.method, str(dtype).removeprefix("torch."))
    for name, key in plan.kept.items():
        load(name, key)
        source.raw.append(key)
    if plan.quantized:
        _log.info("%s: %d linear layer(s) outside the experts are %s-quantized in the checkpoint (e.g. %s); they are "
                  "dequantized to %s (moe_core runs quantized experts only; %s)", tensors.root, len(plan.quantized),
                  fmt.method, next(iter(plan.quantized.values())), str(dtype).removeprefix("torch."), why_not_quantizer)
    for target, module in plan.quantized.items():
        linear = model.get_submodule(target)
        read = TensorSource(tensors, str(tensors.root))
        weight = dequantized_linear(read, module, fmt.method, fmt.qc, fmt.parsed)
        if tuple(weight.shape) != tuple(linear.weight.shape):
            raise CheckpointError(f"{tensors.root}: the quantized linear {module!r} dequantizes to "
                                  f"{list(weight.shape)}, but the model's {target}.weight is {list(linear.weight.shape)}")
        linear.weight = nn.Parameter(weight.to(device=device, dtype=dtype), requires_grad=False)
        source.raw += sorted(read.consumed)
        source.raw_guards.append((f"{target}.weight (dequantized from the checkpoint's {fmt.method} tensors)",
                                  _unchanged(linear, "weight")))
    for name, tied_to in plan.tied.items():
        _set_tensor(model, name, _lookup(model, tied_to))
    for name, buf in list(model.named_buffers()):
        if buf.device != device:
            _set_tensor(model, name, buf.to(device))
    return loaded


def _is_param(model: nn.Module, name: str) -> bool:
    module, _, leaf = name.rpartition(".")
    return leaf in model.get_submodule(module)._parameters


def _unchanged(module: nn.Module, leaf: str) -> Callable[[], bool]:
    """True while `module.leaf` is the tensor loaded, unmodified (same object, same version counter)."""
    tensor = getattr(module, leaf)
    version = tensor._version
    return lambda: getattr(module, leaf, None) is tensor and tensor._version == version


def _unchanged_tensors(module: nn.Module, leaves: list[str]) -> Callable[[], bool]:
    """True while each of `module`'s `leaves` is the tensor it holds now, unmodified."""
    checks = [_unchanged(module, leaf) for leaf in leaves]
    return lambda: all(check() for check in checks)


def _decompress(model: nn.Module, quantizer, source: CheckpointSource) -> None:
    """compressed-tensors turns the loaded tensors of its modules into a weight of the model dtype, as
    transformers' quantizer does on the model's first forward. The checkpoint tensors behind them are
    written back as stored, so each module must keep what this leaves it (its bias is saved from the
    model, as any float tensor)."""
    held = [(name, m) for name, m in model.named_modules() if getattr(m, "quantization_scheme", None) is not None]
    quantizer.compressor.decompress_model(model)
    for name, module in held:
        leaves = [leaf for leaf, _ in module.named_parameters(recurse=False) if leaf != "bias"]
        leaves += [leaf for leaf, _ in module.named_buffers(recurse=False)]
        source.raw_guards.append((f"{name} (loaded through transformers' compressed-tensors quantizer)",
                                  _unchanged_tensors(module, leaves)))


def _unchanged_experts(moe: FusedMoE) -> Callable[[], bool]:
    """True while the layer holds the weights loaded from the checkpoint (load_weights replaces them)."""
    packed = moe.experts.weights
    return lambda: moe.experts.weights is packed


def _record_param_names(model: nn.Module, loaded: dict[str, torch.Tensor], source: CheckpointSource) -> None:
    """Where each float checkpoint tensor lives in the fused model (a router weight is now the fused
    block's `router_weight`), found by identity; a tensor the fused model no longer holds (a selection
    bias, copied into its FusedMoE) is kept as loaded."""
    names = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
        names.setdefault(id(t), name)
    for key, t in loaded.items():
        source.params[key] = names.get(id(t), t)


def _lookup(model: nn.Module, name: str) -> torch.Tensor | None:
    try:
        return model.get_parameter(name) if _is_param(model, name) else model.get_buffer(name)
    except AttributeError:
        return None


def _refuse_meta(model: nn.Module) -> None:
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(f"from_pretrained: {len(left)} model tensor(s) were not loaded: {', '.join(left[:6])}")


# ---- step 5: the experts -----------------------------------------------------------------------------


def _fused_block(model_type: str, name: str, block: nn.Module, desc: BlockDescriptor,
                 tensors: SafetensorsDirectory, config_json: Mapping, index: int, device: torch.device,
                 dtype: torch.dtype, prefer: str | None):
    from moe_core.integrations.transformers import FusedMoEBlock, _module, _present, _tensor

    where = f"{model_type} block {name!r}"
    spec = _describe(model_type, name, block, desc)
    expected = spec.weights  # meta tensors: the shapes the model declares
    loaded = read_layer(tensors, config_json, index, dtype=dtype)
    w = loaded.weights
    if (w.num_experts, w.hidden_size, w.intermediate_size) != (expected.num_experts, expected.hidden_size,
                                                               expected.intermediate_size):
        raise CheckpointError(f"{tensors.root}: the experts under {loaded.experts_prefix!r} are {w.num_experts} x "
                              f"(hidden {w.hidden_size}, intermediate {w.intermediate_size}), but the model built "
                              f"from config.json has {expected.num_experts} x (hidden {expected.hidden_size}, "
                              f"intermediate {expected.intermediate_size})")
    try:
        config = MoEConfig(num_experts=expected.num_experts, top_k=spec.top_k, hidden_size=expected.hidden_size,
                           intermediate_size=expected.intermediate_size, activation=spec.activation,
                           routing=spec.routing, dtype=dtype, has_bias=w.has_bias)
    except ValueError as exc:
        raise UnsupportedModelError(f"{where}: not expressible as a MoEConfig: {exc}") from exc
    router_weight = _tensor(where, block, desc.router.weight, "router weight")
    if tuple(router_weight.shape) != (config.num_experts, config.hidden_size):
        raise UnsupportedModelError(f"{where}: router weight '{desc.router.weight}' has shape "
                                    f"{list(router_weight.shape)}, expected [{config.num_experts}, {config.hidden_size}]")
    shared = desc.shared
    if shared is not None and not (shared.optional and _present(block, shared.module) is None):
        _module(where, block, shared.module, "shared experts module")
    moe = FusedMoE(config, loaded.quant, device, prefer)
    moe.load_weights(w, spec.correction_bias)
    return FusedMoEBlock(moe, desc, block, spec.output_scale)
