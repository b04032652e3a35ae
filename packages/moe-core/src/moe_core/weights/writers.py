"""Checkpoint tensors in each supported format, written from canonical `ExpertWeights`.

For tests, examples and benchmarks that need a real checkpoint directory without the producing
library at hand. Each writer follows the format's documented packing with the producing library's
loop structure (AutoGPTQ's `pack`, AutoAWQ's `from_linear` order map, gpt-oss block layout), written
independently of the readers' vectorised unpacking, so a round trip checks one against the other.
compressed-tensors has no writer here: its tests and the example use that library's own compressor.
`quantized_linear_tensors` writes the non-expert linears (attention, shared experts) that quantized
checkpoints carry too; `random_gptq_int4_tensors` draws a benchmark layer directly in GPTQ's packing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from moe_core.quant import Granularity, QuantDType, QuantKey, ZeroPoint
from moe_core.weights._source import join_key
from moe_core.weights.awq import AWQ_PACK_ORDER
from moe_core.weights.canonical import ExpertWeights, quantize_expert_tensor
from moe_core.weights.packing import unpack_int4

__all__ = [
    "awq_tensors",
    "block_fp8_tensors",
    "gpt_oss_mxfp4_tensors",
    "gptq_tensors",
    "quantized_linear_tensors",
    "random_gptq_int4_tensors",
    "unquantized_tensors",
    "write_model_dir",
]


def write_model_dir(directory: str | Path, tensors: Mapping[str, torch.Tensor], config: Mapping[str, object],
                    shards: int = 1) -> Path:
    """Write config.json and the tensors as `shards` safetensors files (+ index when sharded)."""
    from safetensors.torch import save_file

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    names = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k].contiguous() for k in names}, root / "model.safetensors")
        return root
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({k: tensors[k].contiguous() for k in part}, root / fname)
        weight_map.update(dict.fromkeys(part, fname))
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def unquantized_tensors(weights: ExpertWeights, prefix: str, layout: str) -> dict[str, torch.Tensor]:
    """layout: "mixtral" (w1/w3/w2), "proj" (gate/up/down_proj), "fused" (transformers 5 [E, 2N, K])
    or "gpt_oss" ([in, out], gate/up rows interleaved, with biases)."""
    w13, w2 = weights.w13, weights.w2
    gate, up = w13.chunk(2, dim=1)
    if layout in ("mixtral", "proj"):
        g, u, d = ("w1", "w3", "w2") if layout == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        out = {}
        for e in range(w13.shape[0]):
            for name, t in ((g, gate[e]), (u, up[e]), (d, w2[e])):
                out[join_key(prefix, f"{e}.{name}.weight")] = t.clone()
        return out
    if layout == "fused":
        return {join_key(prefix, "gate_up_proj"): w13.clone(), join_key(prefix, "down_proj"): w2.clone()}
    if layout == "gpt_oss":
        if weights.w13_bias is None:
            raise ValueError("the gpt_oss layout carries biases: the weights have none")
        return {join_key(prefix, "gate_up_proj"): _interleave_rows(w13).transpose(1, 2).contiguous(),
                join_key(prefix, "gate_up_proj_bias"): _interleave_rows(weights.w13_bias),
                join_key(prefix, "down_proj"): w2.transpose(1, 2).contiguous(),
                join_key(prefix, "down_proj_bias"): weights.w2_bias.clone()}
    raise ValueError(f"layout={layout!r} is invalid: expected 'mixtral', 'proj', 'fused' or 'gpt_oss'")


def gptq_tensors(weights: ExpertWeights, prefix: str, v1_zeros: bool = True) -> dict[str, torch.Tensor]:
    """Per-expert gate/up/down_proj qweight, qzeros, scales, g_idx. Symmetric keys write zero 2**(bits-1)."""
    bits = _int_bits(weights)
    out = {}
    for _, module, codes, scale, zero, g_idx in _int_projections(weights, prefix):
        out.update(_gptq_module(module, codes, scale, zero, g_idx, weights.key, bits, v1_zeros))
    return out


def awq_tensors(weights: ExpertWeights, prefix: str) -> dict[str, torch.Tensor]:
    """Per-expert qweight [K, N/8], qzeros [G, N/8] (AWQ field order), scales [G, N]."""
    _check_awq(weights.key)
    out = {}
    for _, module, codes, scale, zero, _ in _int_projections(weights, prefix):
        out.update(_awq_module(module, codes, scale, zero))
    return out


def quantized_linear_tensors(weight: torch.Tensor, module: str, fmt: str, key: QuantKey,
                             g_idx: torch.Tensor | None = None, v1_zeros: bool = True) -> dict[str, torch.Tensor]:
    """One nn.Linear weight [out, in], quantized round-to-nearest to `key`, as `fmt` ("gptq", "awq" or
    "fp8": block FP8 with weight_scale_inv) stores it under `module`: the attention and shared-expert
    linears that quantized checkpoints hold beside their experts. g_idx [in]: act-order grouping."""
    codes, scale, zero = quantize_expert_tensor(weight[None], key, None if g_idx is None else g_idx[None])
    if fmt == "fp8":
        if key.dtype is not QuantDType.FP8_E4M3 or key.scale.granularity is not Granularity.BLOCK:
            raise ValueError(f"block FP8 checkpoints hold block-scaled fp8 weights, not {key}")
        return {f"{module}.weight": codes[0].contiguous(), f"{module}.weight_scale_inv": scale[0].float().contiguous()}
    codes = unpack_int4(codes[0]) if key.dtype is QuantDType.INT4 else codes[0]
    scale = scale[0] if scale.dim() == 3 else scale[0].unsqueeze(1)
    zero = None if zero is None else (zero[0] if zero.dim() == 3 else zero[0].unsqueeze(1))
    if fmt == "gptq":
        if key.dtype not in (QuantDType.INT4, QuantDType.INT8):
            raise ValueError(f"GPTQ checkpoints hold int4/int8 weights, not {key}")
        return _gptq_module(module, codes, scale, zero, g_idx, key, key.bits, v1_zeros)
    if fmt == "awq":
        _check_awq(key)
        return _awq_module(module, codes, scale, zero)
    raise ValueError(f"fmt={fmt!r} is invalid: expected 'gptq', 'awq' or 'fp8'")


def random_gptq_int4_tensors(prefix: str, num_experts: int, hidden_size: int, intermediate_size: int,
                             group_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A layer of GPTQ int4 (sym, v1 zeros, no act-order) experts with random codes, drawn directly
    in the stored packing: real-shape benchmark checkpoints in seconds per layer rather than the
    minutes of quantizing float weights. Scales ~ 1/(8 sqrt(fan_in)), so outputs stay O(1)."""
    out = {}
    K, N = hidden_size, intermediate_size
    for e in range(num_experts):
        for name, fan_in, fan_out in (("gate_proj", K, N), ("up_proj", K, N), ("down_proj", N, K)):
            module = join_key(prefix, f"{e}.{name}")
            words = torch.randint(-(1 << 31), 1 << 31, (fan_in // 8, fan_out), generator=generator, dtype=torch.int64)
            out[f"{module}.qweight"] = words.to(torch.int32)
            groups = fan_in // group_size
            # v1 stores zero - 1: the implicit symmetric zero 8 is written as 7 in every nibble
            out[f"{module}.qzeros"] = torch.full((groups, fan_out // 8), 0x77777777, dtype=torch.int32)
            scale = (torch.rand(groups, fan_out, generator=generator) + 0.5) / (8 * fan_in**0.5)
            out[f"{module}.scales"] = scale.to(torch.float16)
            out[f"{module}.g_idx"] = torch.arange(fan_in, dtype=torch.int32) // group_size
    return out


def block_fp8_tensors(weights: ExpertWeights, prefix: str) -> dict[str, torch.Tensor]:
    """Per-expert gate/up/down_proj `weight` (fp8) and `weight_scale_inv` (fp32 block grid)."""
    key = weights.key
    if key.dtype is not QuantDType.FP8_E4M3 or key.scale.granularity is not Granularity.BLOCK:
        raise ValueError(f"block FP8 checkpoints hold block-scaled fp8 weights, not {key}")
    br = key.scale.block_shape[0]
    N = weights.w13.shape[1] // 2
    if N % br:
        raise ValueError(f"intermediate size {N} is not a multiple of the block rows {br}")
    rows = N // br
    out = {}
    for e in range(weights.num_experts):
        parts = (("gate_proj", weights.w13[e, :N], weights.w13_scale[e, :rows]),
                 ("up_proj", weights.w13[e, N:], weights.w13_scale[e, rows:]),
                 ("down_proj", weights.w2[e], weights.w2_scale[e]))
        for name, w, s in parts:
            out[join_key(prefix, f"{e}.{name}.weight")] = w.contiguous()
            out[join_key(prefix, f"{e}.{name}.weight_scale_inv")] = s.float().contiguous()
    return out


def gpt_oss_mxfp4_tensors(weights: ExpertWeights, prefix: str) -> dict[str, torch.Tensor]:
    """gpt-oss `*_blocks` [E, R, K/32, 16], `*_scales` [E, R, K/32], `*_bias`, with gate/up rows interleaved."""
    if weights.key.dtype is not QuantDType.FP4_E2M1 or weights.w13_bias is None:
        raise ValueError("gpt-oss MXFP4 checkpoints hold MXFP4 weights with biases")
    E, R, half_k = weights.w13.shape
    K, N = half_k * 2, weights.w2.shape[2] * 2
    return {
        join_key(prefix, "gate_up_proj_blocks"): _interleave_rows(weights.w13).reshape(E, R, K // 32, 16),
        join_key(prefix, "gate_up_proj_scales"): _interleave_rows(weights.w13_scale),
        join_key(prefix, "gate_up_proj_bias"): _interleave_rows(weights.w13_bias),
        join_key(prefix, "down_proj_blocks"): weights.w2.reshape(E, K, N // 32, 16).clone(),
        join_key(prefix, "down_proj_scales"): weights.w2_scale.clone(),
        join_key(prefix, "down_proj_bias"): weights.w2_bias.clone(),
    }


# ---- helpers -------------------------------------------------------------------------------


def _interleave_rows(t: torch.Tensor) -> torch.Tensor:
    """Canonical gate rows then up rows along dim 1 -> gate0, up0, gate1, up1, ..."""
    gate, up = t.chunk(2, dim=1)
    return torch.stack((gate, up), dim=2).flatten(1, 2).contiguous()


def _int_bits(weights: ExpertWeights) -> int:
    if weights.key.dtype not in (QuantDType.INT4, QuantDType.INT8):
        raise ValueError(f"integer checkpoints hold int4/int8 weights, not {weights.key}")
    return weights.key.bits


def _check_awq(key: QuantKey) -> None:
    if key.dtype is not QuantDType.INT4 or key.zero_point is not ZeroPoint.INTEGER or key.act_order:
        raise ValueError(f"AWQ stores int4 codes with integer zero points and no act-order, not {key}")


def _gptq_module(module: str, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                 g_idx: torch.Tensor | None, key: QuantKey, bits: int, v1_zeros: bool) -> dict[str, torch.Tensor]:
    """One projection (codes [out, in], scale and zero [out, G]) as GPTQ's four tensors."""
    _, in_f = codes.shape
    if zero is None:
        zero = torch.full_like(scale, 1 << (bits - 1), dtype=torch.uint8)
    stored_zero = (zero.long() - int(v1_zeros)) % (1 << bits)
    if g_idx is None:
        g = key.scale.group_size if key.scale.granularity is Granularity.GROUP else in_f
        g_idx = torch.arange(in_f, dtype=torch.int32) // g
    return {f"{module}.qweight": _pack_rows(codes.t().long(), bits),
            f"{module}.qzeros": _pack_rows(stored_zero.long(), bits).t().contiguous(),  # along N
            f"{module}.scales": scale.t().contiguous(),
            f"{module}.g_idx": g_idx.to(torch.int32).clone()}  # gate and up may share it: own copies


def _awq_module(module: str, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> dict[str, torch.Tensor]:
    return {f"{module}.qweight": _pack_awq(codes.t().long()),
            f"{module}.qzeros": _pack_awq(zero.t().long()),
            f"{module}.scales": scale.t().contiguous()}


def _int_projections(weights: ExpertWeights, prefix: str):
    """Yield (expert, module name, codes [out, in], scale [out, G], zero [out, G] | None, g_idx | None)."""
    int4 = weights.key.dtype is QuantDType.INT4
    N = weights.w13.shape[1] // 2
    for e in range(weights.num_experts):
        for name, field, rows, half in (("gate_proj", "w13", slice(0, N), 0), ("up_proj", "w13", slice(N, 2 * N), 1),
                                        ("down_proj", "w2", slice(None), None)):
            codes = getattr(weights, field)[e, rows]
            codes = unpack_int4(codes) if int4 else codes
            scale = getattr(weights, f"{field}_scale")[e, rows]
            zero = getattr(weights, f"{field}_zero")
            zero = zero[e, rows] if zero is not None else None
            if scale.dim() == 1:  # per channel: one group
                scale = scale.unsqueeze(1)
                zero = zero.unsqueeze(1) if zero is not None else None
            g_idx = getattr(weights, f"{field}_g_idx")
            if g_idx is not None:
                g_idx = g_idx[e, half] if g_idx.dim() == 3 else g_idx[e]  # [E, 2, K]: gate's, then up's
            yield e, join_key(prefix, f"{e}.{name}"), codes, scale, zero, g_idx


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit words held in int64 -> the same bits as int32."""
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def _pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """AutoGPTQ's pack loop: word r of a column holds rows r*pf .. r*pf+pf-1, the first in the lowest bits."""
    per_word = 32 // bits
    rows = values.shape[0]
    if rows % per_word:
        raise ValueError(f"{rows} values do not fill whole int32 words of {per_word}")
    words = torch.zeros(rows // per_word, values.shape[1], dtype=torch.int64)
    for r in range(rows // per_word):
        for i in range(per_word):
            words[r] |= values[r * per_word + i] << (bits * i)
    return _to_int32(words)


def _pack_awq(values: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's from_linear loop: field i of word c holds column 8c + AWQ_PACK_ORDER[i]."""
    rows, cols = values.shape
    if cols % 8:
        raise ValueError(f"{cols} columns do not fill whole int32 words of 8")
    words = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for c in range(cols // 8):
        for i, col in enumerate(AWQ_PACK_ORDER):
            words[:, c] |= values[:, c * 8 + col] << (4 * i)
    return _to_int32(words)
