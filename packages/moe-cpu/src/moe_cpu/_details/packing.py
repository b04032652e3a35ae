"""Canonical expert weights -> the layouts of the ATen CPU kernels. Pure functions of their inputs."""

from __future__ import annotations

import dataclasses

import torch

from moe_core.quant import ZeroPoint
from moe_core.weights import ExpertWeights
from moe_core.weights.packing import unpack_int4

# tinygemm's fixed code offset: w = (q - 8) * scale + zero
TINYGEMM_OFFSET = 8
INT8_OFFSET = 128


def act_order_permutation(g_idx: torch.Tensor, group_size: int, name: str) -> torch.Tensor:
    """int64 [E, C]: input channels sorted by group, so that group j occupies [j*g, (j+1)*g).

    Holds only when every group has exactly `group_size` channels (GPTQ desc_act does); anything
    else cannot be expressed by contiguous groups and is refused.
    """
    perm = torch.argsort(g_idx.long(), dim=1, stable=True)
    expected = torch.arange(g_idx.shape[1]).div(group_size, rounding_mode="floor")
    if not torch.equal(torch.gather(g_idx.long(), 1, perm), expected.expand_as(perm)):
        raise ValueError(f"{name}_g_idx: every scale group must hold exactly {group_size} input channels "
                         "for the CPU int4 kernel; this act-order assignment does not")
    return perm


def w13_halves(weights: ExpertWeights) -> tuple[ExpertWeights, ExpertWeights]:
    """The gate rows and the up rows of a gated w13 as weights of their own (w13 = that half, with
    its half of the per-half g_idx [E, 2, K]), for halves whose act-order groupings differ."""
    n = weights.w13.shape[1] // 2
    g_idx = weights.w13_g_idx
    return tuple(dataclasses.replace(
        weights, w13=weights.w13[:, rows], w13_scale=weights.w13_scale[:, rows],
        w13_zero=weights.w13_zero[:, rows] if weights.w13_zero is not None else None,
        w13_g_idx=g_idx[:, half] if g_idx is not None else None)
        for half, rows in enumerate((slice(0, n), slice(n, 2 * n))))


def int4_tinygemm(weights: ExpertWeights, name: str, dtype: torch.dtype, perm: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [E, R, C/2], scale_and_zeros [E, C/g, R, 2] in `dtype`) for one GEMM's weights.

    One expert at a time: the unpacked codes of a whole layer (a byte per weight, and twice that while
    unpacking) would outgrow the loader's memory bound of one 16-bit expert tensor."""
    key = weights.key
    words = getattr(weights, name)  # [E, R, C/2] uint8, two codes a byte
    packed = None
    for e in range(words.shape[0]):
        codes = unpack_int4(words[e])  # [R, C] uint8 0..15
        if perm is not None:
            codes = codes[:, perm[e]]
        one = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        if packed is None:
            packed = one.new_empty((words.shape[0], *one.shape))
        packed[e] = one
    scale = getattr(weights, f"{name}_scale").float()  # [E, R, C/g]
    if key.zero_point is ZeroPoint.FLOAT:  # canonical (q - 8) * s + zero is tinygemm's own formula
        zero_f = getattr(weights, f"{name}_zero").float()
    elif key.zero_point is ZeroPoint.INTEGER:  # (q - z) * s == (q - 8) * s + (8 - z) * s
        zero_f = (TINYGEMM_OFFSET - getattr(weights, f"{name}_zero").float()) * scale
    else:
        zero_f = torch.zeros_like(scale)
    scale_and_zeros = torch.stack([scale, zero_f], dim=-1).transpose(1, 2).contiguous().to(dtype)
    return packed, scale_and_zeros


def int8_per_channel(weights: ExpertWeights, name: str, dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(int8 [E, R, C] = code - 128, scales [E, R], zero correction [E, R] or None) in `dtype`.

    Zero points become a per-row constant c with value = (code - 128) * s + c (integer zeros:
    c = (128 - z) * s; float zeros: c = zero); c times the input's row sum is added after the GEMM.
    """
    # u ^ 0x80 read as two's complement is u - 128 for every byte u: one byte per weight of temporaries,
    # where going through int16 takes three (more than the loader's bound of one 16-bit tensor).
    int8 = (getattr(weights, name) ^ INT8_OFFSET).view(torch.int8)
    scale = getattr(weights, f"{name}_scale").float()
    correction = None
    if weights.key.zero_point is ZeroPoint.INTEGER:
        correction = ((INT8_OFFSET - getattr(weights, f"{name}_zero").float()) * scale).to(dtype)
    elif weights.key.zero_point is ZeroPoint.FLOAT:
        correction = getattr(weights, f"{name}_zero").to(dtype, copy=True)
    return int8, scale.to(dtype, copy=True), correction  # copies: never views of the caller's tensors


def dequantized(weights: ExpertWeights, dtype: torch.dtype, chunk: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13, w2) in `dtype`, dequantized two experts at a time: dequantization makes int64 and fp32
    temporaries of about 32 bytes per parameter, which for a whole layer would not fit in memory."""
    E = weights.num_experts
    w13 = torch.empty((*weights.w13.shape[:2], weights.w2.shape[1]), dtype=dtype)
    w2 = torch.empty((*weights.w2.shape[:2], weights.intermediate_size), dtype=dtype)
    for start in range(0, E, chunk):
        part = dataclasses.replace(weights, **{n: t[start:start + chunk] for n, t in weights.tensors().items()})
        a, b = part.dequantize()
        w13[start:start + chunk] = a
        w2[start:start + chunk] = b
    return w13, w2
