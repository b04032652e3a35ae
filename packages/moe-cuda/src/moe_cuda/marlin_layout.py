"""Marlin's weight layout, written from its definition: canonical codes -> the int32 tiles, scales,
zero points and biases `moe_wna16_marlin_gemm` reads, and back (for tests and the dequantizing twin).

The definition (16-bit activations; vLLM's gptq_marlin_repack kernel implements the same):

- B is [K, N] (input channel k, output channel n) of b-bit codes, b = 4 or 8. It is cut into 16x16
  tiles; each row of tiles (16 input channels) becomes one row of the result, the tiles side by side
  (tile-major, then row-major inside a tile), so element (k, n) sits at position
  (n // 16) * 256 + (k % 16) * 16 + n % 16 of result row k // 16.
- Each run of 1024 positions (four tiles) is reordered for the MMA fragments: output slot
  o = 32 * t + 8 * j + 4 * h + s, for lane t (0..31) of a warp, tile j (0..3), column half h (0..1)
  and slot s (0..3), takes the element of tile j at row 2 * (t % 4) + s % 2 + 8 * (s // 2) and
  column t // 4 + 8 * h. Then, within each group of 32 / b slots (one int32 word), the slots are
  interleaved so the dequantizer's shifts find them: 4-bit [0, 2, 4, 6, 1, 3, 5, 7], 8-bit [0, 2, 1, 3].
- Words pack 32 / b consecutive slots, the first in the lowest bits. The result is int32
  [K / 16, N * 16 * b / 32] per expert.

Scales [groups, N] are reordered within runs of 64 columns (grouped scales: a transpose of 8x8) or
of 32 (one group covering all of K, i.e. per channel). Zero points use the grouped order, the 4-bit
interleave, then pack 8 per int32 along N. Biases use the 32-run order.
"""

from __future__ import annotations

import functools

import torch

__all__ = [
    "TILE",
    "marlin_bias",
    "marlin_repack",
    "marlin_scale_order",
    "marlin_scales",
    "marlin_unbias",
    "marlin_unpack",
    "marlin_unscale",
    "marlin_zero_points",
    "marlin_zero_points_unpack",
    "scalar_type_id",
]

TILE = 16
_INTERLEAVE = {4: (0, 2, 4, 6, 1, 3, 5, 7), 8: (0, 2, 1, 3)}


@functools.cache
def _slot_order(bits: int) -> torch.Tensor:
    """int64 [1024]: which position of a 4-tile run (tile-major) each output slot takes."""
    t = torch.arange(32).view(32, 1, 1, 1)
    j = torch.arange(4).view(1, 4, 1, 1)
    h = torch.arange(2).view(1, 1, 2, 1)
    s = torch.arange(4).view(1, 1, 1, 4)
    row = 2 * (t % 4) + s % 2 + 8 * (s // 2)
    col = t // 4 + 8 * h
    order = (256 * j + 16 * row + col).reshape(-1)
    group = len(_INTERLEAVE[bits])
    return order.view(-1, group)[:, list(_INTERLEAVE[bits])].reshape(-1)


def _check_bits(bits: int) -> None:
    if bits not in _INTERLEAVE:
        raise ValueError(f"Marlin packs 4- or 8-bit codes, not {bits}-bit")


def marlin_repack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [E, K, N] (integers 0 .. 2**bits - 1, any integer dtype) -> int32 [E, K/16, N*bits/2].
    One expert at a time: the int64 temporaries of a whole real-size layer would not fit a GPU."""
    _check_bits(bits)
    E, K, N = codes.shape
    if K % TILE or N % 64:
        raise ValueError(f"Marlin tiles need K % 16 == 0 and N % 64 == 0, got K={K}, N={N}")
    return torch.cat([_repack(codes[e:e + 1], bits) for e in range(E)])


def _repack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    E, K, N = codes.shape
    tiles = codes.to(torch.int64).reshape(E, K // TILE, TILE, N // TILE, TILE).permute(0, 1, 3, 2, 4)
    rows = tiles.reshape(E, K // TILE, N // 64, 1024)[..., _slot_order(bits).to(codes.device)]
    per_word = 32 // bits
    slots = rows.reshape(E, K // TILE, -1, per_word)
    shifts = torch.arange(per_word, device=codes.device) * bits
    words = (slots << shifts).sum(-1)  # disjoint bit fields: the sum is an OR
    return _to_int32(words)


def marlin_unpack(packed: torch.Tensor, bits: int, size_n: int) -> torch.Tensor:
    """Inverse of `marlin_repack`: int32 [E, K/16, N*bits/2] -> int64 codes [E, K, N]."""
    _check_bits(bits)
    E, k_tiles, _ = packed.shape
    per_word = 32 // bits
    shifts = torch.arange(per_word, device=packed.device) * bits
    slots = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    rows = slots.reshape(E, k_tiles, size_n // 64, 1024)
    positions = torch.empty_like(rows)
    positions[..., _slot_order(bits).to(packed.device)] = rows
    tiles = positions.reshape(E, k_tiles, size_n // TILE, TILE, TILE).permute(0, 1, 3, 2, 4)
    return tiles.reshape(E, k_tiles * TILE, size_n)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 holding unsigned 32-bit values -> int32 with the same bits."""
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


@functools.cache
def _scale_runs(grouped: bool) -> torch.Tensor:
    if grouped:  # 8x8 transpose of each run of 64 columns
        return torch.arange(64).view(8, 8).t().reshape(-1)
    first = torch.tensor([0, 1, 8, 9, 16, 17, 24, 25])
    return (2 * torch.arange(4).view(4, 1) + first).reshape(-1)


def marlin_scale_order(grouped: bool) -> torch.Tensor:
    """int64 [64] (grouped) or [32]: the column of each run that each output column takes."""
    return _scale_runs(grouped)


def _reorder_columns(t: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    shape = t.shape
    return t.reshape(*shape[:-1], -1, order.numel())[..., order.to(t.device)].reshape(shape)


def _restore_columns(t: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    shape = t.shape
    runs = t.reshape(*shape[:-1], -1, order.numel())
    out = torch.empty_like(runs)
    out[..., order.to(t.device)] = runs
    return out.reshape(shape)


def marlin_scales(scales: torch.Tensor) -> torch.Tensor:
    """Scales [E, groups, N] (groups along K) -> Marlin's column order (same shape and dtype).

    One group covering the whole input (per-channel scales, or a group as large as K) takes the
    per-channel order, as the kernel then reads them.
    """
    return _reorder_columns(scales, marlin_scale_order(scales.shape[1] > 1)).contiguous()


def marlin_unscale(scales: torch.Tensor) -> torch.Tensor:
    """Inverse of `marlin_scales`."""
    return _restore_columns(scales, marlin_scale_order(scales.shape[1] > 1))


def marlin_bias(bias: torch.Tensor) -> torch.Tensor:
    """Biases [E, N] -> Marlin's per-channel column order."""
    return _reorder_columns(bias, marlin_scale_order(False)).contiguous()


def marlin_unbias(bias: torch.Tensor) -> torch.Tensor:
    """Inverse of `marlin_bias`."""
    return _restore_columns(bias, marlin_scale_order(False))


def marlin_zero_points(zeros: torch.Tensor) -> torch.Tensor:
    """4-bit integer zero points [E, groups, N] -> int32 [E, groups, N/8] (grouped order, interleaved, packed)."""
    z = _reorder_columns(zeros.to(torch.int64), marlin_scale_order(True))
    z = _reorder_columns(z, torch.tensor(_INTERLEAVE[4]))
    words = (z.reshape(*z.shape[:-1], -1, 8) << (torch.arange(8, device=z.device) * 4)).sum(-1)
    return _to_int32(words).contiguous()


def marlin_zero_points_unpack(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `marlin_zero_points`: int64 [E, groups, N]."""
    z = (packed.to(torch.int64).unsqueeze(-1) >> (torch.arange(8, device=packed.device) * 4)) & 0xF
    z = z.reshape(*packed.shape[:-1], -1)
    z = _restore_columns(z, torch.tensor(_INTERLEAVE[4]))
    return _restore_columns(z, marlin_scale_order(True))


def scalar_type_id(exponent: int, mantissa: int, signed: bool, bias: int, finite_only: bool, nan_repr: int) -> int:
    """vLLM's ScalarType id, the int that names the weight type to its kernels: bit fields exponent (8),
    mantissa (8), signed (1), bias (32), finite-values-only (1), NaN representation (8), low to high."""
    value, offset = 0, 0
    for field, width in ((exponent, 8), (mantissa, 8), (int(signed), 1), (bias, 32), (int(finite_only), 1),
                         (nan_repr, 8)):
        value |= (field & ((1 << width) - 1)) << offset
        offset += width
    return value
