"""Shared pieces of the integer-weight readers (GPTQ, AWQ, compressed-tensors).

Each reader turns one checkpoint projection into a `QuantizedProjection` in canonical orientation
([out, in] codes as unsigned integers, scales and zeros [out, groups]); `assemble_int_experts` then
concatenates gate and up rows, stacks experts and packs int4 codes two per byte. Where a
checkpoint's int4 words already hold that packing's bytes (GPTQ, compressed-tensors: fields least
significant first, on a little-endian host) the readers take the bytes as they are
(`int4_words_as_packed`): unpacking every code to a byte and packing it again cost seconds per layer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from moe_core.quant import Granularity, QuantDType, QuantKey, ScaleSpec, ZeroPoint
from moe_core.weights._source import CheckpointError, TensorSource, join_key
from moe_core.weights.canonical import ExpertWeights
from moe_core.weights.packing import pack_int4

__all__ = ["QuantizedProjection", "assemble_int_experts", "check_trivial_g_idx", "expert_projection_names",
           "int4_words_as_packed", "unpack_int32"]

_SCALE_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass(frozen=True, eq=False)
class QuantizedProjection:
    """One expert projection in canonical orientation (rows = outputs, columns = inputs)."""

    # uint8 [out, in], unsigned codes 0 .. 2**bits - 1; with `packed`, 4-bit codes two per byte in
    # pack_int4's layout, uint8 [out, in / 2]
    codes: torch.Tensor
    scale: torch.Tensor  # float [out, groups] (groups = 1 for per-channel)
    zero: torch.Tensor | None  # uint8 [out, groups] unsigned zero codes, or None when implicit
    g_idx: torch.Tensor | None  # int32 [in] group of each input column (act-order), or None
    packed: bool = False


def unpack_int32(packed: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """int32 words holding 32/bits codes each, packed along `dim` of a 2-D tensor -> uint8 codes.

    Field i of a word (bits i*bits .. i*bits+bits-1, least significant first) is the word's element
    `order[i]` (default i), so `order` undoes an interleaved packing such as AWQ's.
    """
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    fields = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., per_word]
    if order is not None:
        fields = fields[..., torch.argsort(torch.tensor(order))]
    if dim == 1:
        return fields.reshape(packed.shape[0], packed.shape[1] * per_word).to(torch.uint8)
    # Packed along rows: word (r, c) holds rows r*per_word + i of column c.
    return fields.permute(0, 2, 1).reshape(packed.shape[0] * per_word, packed.shape[1]).to(torch.uint8)


def int4_words_as_packed(words: torch.Tensor, dim: int, size: int) -> torch.Tensor | None:
    """int32 words of eight 4-bit codes along `dim` of a 2-D tensor (field i, least significant first,
    is element 8c + i), `size` codes long along it -> uint8 [out, size / 2] in pack_int4's layout, or
    None where the bytes cannot be taken as they are (a big-endian host, an odd `size`).

    A little-endian word's byte b holds fields 2b (low nibble) and 2b + 1 (high): pack_int4's byte of
    elements 8c + 2b and 8c + 2b + 1. So the packing is the words' bytes, transposed where the words
    run along dim 0 (GPTQ's [in / 8, out])."""
    if sys.byteorder != "little" or size % 2:
        return None
    # Words transposed as int32 (each keeps its four bytes in order), not as bytes: a 2-D transpose
    # copies about twice as fast as a permute of [words, 4] byte runs.
    as_bytes = (words.t() if dim == 0 else words).contiguous().view(torch.uint8)
    return as_bytes[:, :size // 2].contiguous()


def expert_projection_names(source: TensorSource, prefix: str, first_expert: int, suffix: str
                            ) -> tuple[str | None, str, str]:
    """(gate, up, down) module names of per-expert projections: Mixtral w1/w3/w2 or *_proj."""
    if join_key(prefix, f"{first_expert}.w2.{suffix}") in source:
        return "w1", "w3", "w2"
    if join_key(prefix, f"{first_expert}.down_proj.{suffix}") in source:
        gated = join_key(prefix, f"{first_expert}.gate_proj.{suffix}") in source
        return ("gate_proj" if gated else None), "up_proj", "down_proj"
    raise CheckpointError(
        f"{source.what}: no quantized experts under {prefix!r}: expected "
        f"'{join_key(prefix, f'{first_expert}.gate_proj.{suffix}')}' or "
        f"'{join_key(prefix, f'{first_expert}.w1.{suffix}')}' (Mixtral names)")


def assemble_int_experts(experts: list[dict[str, QuantizedProjection]], names: tuple[str | None, str, str],
                         *, bits: int, group_size: int, zero_point: bool, act_order: bool,
                         where: str) -> ExpertWeights:
    """Per-expert {module name: projection} -> canonical int4/int8 `ExpertWeights`.

    group_size -1 means per channel. `where` names the layer in error messages. Act-order w13 g_idx
    is [E, K] when every expert's gate and up share one grouping, else [E, 2, K] (gate's, up's).
    """
    gate, up, down = names
    w13_names = [n for n in (gate, up) if n is not None]
    scale_dtypes = {p.scale.dtype for ex in experts for p in ex.values()}
    if len(scale_dtypes) != 1 or next(iter(scale_dtypes)) not in _SCALE_DTYPE_NAMES:
        raise CheckpointError(f"{where}: scales have dtypes {sorted(map(str, scale_dtypes))}; expected one of "
                              "bfloat16, float16, float32 shared by every projection")
    fields: dict[str, list[torch.Tensor]] = {k: [] for k in ("w13", "w2", "w13_scale", "w2_scale", "w13_zero",
                                                             "w2_zero", "w13_g_idx", "w2_g_idx")}
    packed = {p.packed for ex in experts for p in ex.values()}
    if len(packed) != 1 or (packed == {True} and bits != 4):
        raise ValueError(f"{where}: packed codes are 4-bit codes of every projection or of none")
    for ex in experts:
        for name, parts in (("w13", [ex[n] for n in w13_names]), ("w2", [ex[down]])):
            fields[name].append(torch.cat([p.codes for p in parts], 0))
            fields[f"{name}_scale"].append(torch.cat([p.scale for p in parts], 0))
            if zero_point:
                fields[f"{name}_zero"].append(torch.cat([p.zero for p in parts], 0))
            if act_order:
                fields[f"{name}_g_idx"].append(torch.stack([p.g_idx.to(torch.int32) for p in parts]))
    stacked = {k: torch.stack(v) for k, v in fields.items() if v}
    if act_order:
        stacked["w2_g_idx"] = stacked["w2_g_idx"][:, 0]
        w13_g_idx = stacked["w13_g_idx"]  # [E, halves, K]
        if bool((w13_g_idx == w13_g_idx[:, :1]).all()):
            stacked["w13_g_idx"] = w13_g_idx[:, 0]
    if group_size == -1:
        for k in ("w13_scale", "w2_scale", "w13_zero", "w2_zero"):
            if k in stacked:
                stacked[k] = stacked[k].squeeze(-1)
        spec = ScaleSpec(Granularity.CHANNEL, dtype=_SCALE_DTYPE_NAMES[scale_dtypes.pop()])
    else:
        spec = ScaleSpec(Granularity.GROUP, group_size=group_size, dtype=_SCALE_DTYPE_NAMES[scale_dtypes.pop()])
    dtype = {4: QuantDType.INT4, 8: QuantDType.INT8}[bits]
    key = QuantKey(dtype, spec, ZeroPoint.INTEGER if zero_point else ZeroPoint.NONE, act_order)
    if dtype is QuantDType.INT4 and packed == {False}:
        stacked["w13"], stacked["w2"] = pack_int4(stacked["w13"]), pack_int4(stacked["w2"])
    return ExpertWeights(key, **{k: v.contiguous() for k, v in stacked.items()})


def check_trivial_g_idx(g_idx: torch.Tensor, group_size: int, key: str, what: str) -> None:
    """A g_idx that a format writes without act-order must be the identity grouping i // group_size."""
    expected = torch.arange(g_idx.numel(), dtype=torch.int64) // group_size if group_size > 0 else 0
    if not torch.equal(g_idx.long(), torch.as_tensor(expected).expand_as(g_idx)):
        raise CheckpointError(f"{what}: {key!r} is a permuted (act-order) grouping but the quantization "
                              "config does not enable act-order; the config and tensors disagree")
