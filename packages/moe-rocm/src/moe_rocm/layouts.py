"""Canonical weights -> the layout AITER's fused MoE reads. Pure functions; they run on the CPU too.

**The weight shuffle** (AITER's `aiter.ops.shuffle.shuffle_weight(w, layout=(16, 16))`, which vLLM
applies to w13 and w2 before calling `fused_moe`). With `layout = (rows, half_k)`, a tile is `rows`
output rows by `2 * half_k` input columns, tiles in row-major order; inside a tile the columns are cut
into 16-byte chunks (8 bf16/fp16 values, 16 fp8 values) and the tile is stored chunk column by
chunk column, each one holding the chunk of every row in turn:

    w[e, rt*rows + r, ct*cols + kc*chunk + j]  ->  shuffled[e, rt, ct, kc, r, j]   (cols = 2 * half_k)

so one 16-byte load per lane reads `chunk` consecutive K values of one row. The shape stays
[E, rows_total, cols_total]; rows must divide by 16 and columns by 32.

**fp8** (AITER's `dtypes.fp8`): e4m3fn on gfx950, e4m3fnuz on gfx942. The two share their bit layout
but an e4m3fnuz value is half the e4m3fn value of the same bits (exponent bias 8 instead of 7), and
0x80 is -0 in e4m3fn but NaN in e4m3fnuz. Converting canonical e4m3fn codes for gfx942 therefore keeps
the bits, turns 0x80 into 0x00 and doubles the scales: every dequantized value stays exactly the same
(vLLM's `normalize_e4m3fn_to_e4m3fnuz` does the same).

**Scales** stay fp32 and unshuffled (AITER's `shuffle_scale` leaves fp32 scales as they are):
per-channel w13 [E, R, 1], w2 [E, K, 1]; 128x128 blocks w13 [E, R/128, K/128], w2 [E, K/128, N/128].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_core.config import MoEConfig
from moe_core.quant import Granularity, QuantDType
from moe_core.weights import ExpertWeights, PackedWeights
from moe_rocm.aiter_api import GFX942, GFX950, GfxArch, arch_of

__all__ = ["LAYOUT", "SHUFFLE_TILE", "AiterProcessor", "shuffle_weight", "to_aiter_fp8", "unshuffle_weight"]

# AITER's shuffle `layout` argument as vLLM passes it: (rows per tile, half the input columns per tile).
SHUFFLE_TILE = (16, 16)
_LOAD_BYTES = 16  # one lane's load: the contiguous chunk inside a tile
LAYOUT = "aiter.shuffle16x16"
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _tile_geometry(w: torch.Tensor, tile: tuple[int, int]) -> tuple[int, int, int]:
    if w.dim() != 3:
        raise ValueError(f"expected an expert-stacked weight [E, rows, cols], got shape {list(w.shape)}")
    if w.element_size() not in _SAME_SIZE_INT or _LOAD_BYTES % w.element_size():
        raise ValueError(f"cannot shuffle {w.dtype} weights: expected 1-, 2- or 4-byte elements")
    rows, cols = tile[0], 2 * tile[1]
    chunk = _LOAD_BYTES // w.element_size()
    if cols % chunk:
        raise ValueError(f"shuffle tile {tile}: {cols} columns do not split into {chunk}-element loads")
    if w.shape[1] % rows or w.shape[2] % cols:
        raise ValueError(f"cannot shuffle a weight of shape {list(w.shape)} with tile {tile}: rows must be a "
                         f"multiple of {rows} and columns a multiple of {cols}")
    return rows, cols, chunk


def shuffle_weight(w: torch.Tensor, tile: tuple[int, int] = SHUFFLE_TILE) -> torch.Tensor:
    """Canonical [E, rows, cols] -> AITER's tiled order (same shape and dtype); see the module docstring."""
    rows, cols, chunk = _tile_geometry(w, tile)
    E, R, C = w.shape
    # Permute the raw bits: the values are never read, and not every device copies fp8 dtypes.
    bits = w.contiguous().view(_SAME_SIZE_INT[w.element_size()])
    tiles = bits.reshape(E, R // rows, rows, C // cols, cols // chunk, chunk).permute(0, 1, 3, 4, 2, 5)
    return tiles.contiguous().reshape(E, R, C).view(w.dtype)


def unshuffle_weight(w: torch.Tensor, tile: tuple[int, int] = SHUFFLE_TILE) -> torch.Tensor:
    """The inverse of `shuffle_weight`: AITER's tiled order -> canonical [E, rows, cols]."""
    rows, cols, chunk = _tile_geometry(w, tile)
    E, R, C = w.shape
    bits = w.contiguous().view(_SAME_SIZE_INT[w.element_size()])
    tiles = bits.reshape(E, R // rows, C // cols, cols // chunk, rows, chunk).permute(0, 1, 4, 2, 3, 5)
    return tiles.contiguous().reshape(E, R, C).view(w.dtype)


def to_aiter_fp8(codes: torch.Tensor, scale: torch.Tensor, arch: GfxArch) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical e4m3fn codes and fp32 scales -> the same values in `arch`'s fp8 (see the module docstring)."""
    if codes.dtype != torch.float8_e4m3fn:
        raise ValueError(f"expected canonical float8_e4m3fn codes, got {codes.dtype}")
    bits = codes.view(torch.uint8)
    if bool(((bits & 0x7F) == 0x7F).any()):
        raise ValueError("fp8 weights hold NaN codes (0x7f / 0xff); a checkpoint's weights must be finite")
    if arch.fp8_dtype == torch.float8_e4m3fn:
        return codes, scale
    if arch.fp8_dtype != torch.float8_e4m3fnuz:
        raise ValueError(f"{arch.name}: no conversion from e4m3fn to {arch.fp8_dtype}")
    bits = torch.where(bits == 0x80, torch.zeros_like(bits), bits)  # -0 in e4m3fn is NaN in e4m3fnuz
    return bits.view(torch.float8_e4m3fnuz), scale * 2  # the same bits are worth half in e4m3fnuz


@dataclass(frozen=True)
class AiterProcessor:
    """Canonical `ExpertWeights` -> `LAYOUT`: shuffled w13 / w2 (layer dtype, or the arch's fp8) and fp32 scales.

    Tensors: "w13" [E, R, K], "w2" [E, K, N] in AITER's shuffled order; fp8 adds "w13_scale" and
    "w2_scale" ([E, R, 1] / [E, K, 1] per channel, [E, R/128, K/128] / [E, K/128, N/128] per block).
    Pure: reads the canonical tensors and returns new ones.
    """

    layout: str = LAYOUT
    arch: GfxArch | None = None  # None: the architecture of the device the weights go to (fp8 needs one)

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        key = weights.key
        if not key.quantized:
            for name in ("w13", "w2"):
                if getattr(weights, name).dtype != config.dtype:
                    raise ValueError(f"{name} is {getattr(weights, name).dtype} but the layer dtype is {config.dtype}; "
                                     "unquantized weights must be in the layer dtype")
            tensors = {"w13": weights.w13, "w2": weights.w2}
        elif key.dtype is QuantDType.FP8_E4M3 and key.scale.granularity in (Granularity.CHANNEL, Granularity.BLOCK):
            tensors = self._fp8(weights, self.arch or _device_arch(device))
        else:
            raise ValueError(f"{self.layout}: no AITER layout for {key} weights (accepted: unquantized, fp8 with "
                             "per-channel or 128x128 block scales)")
        tensors = {name: t.to(device) for name, t in tensors.items()}
        for name in ("w13", "w2"):
            tensors[name] = shuffle_weight(tensors[name])
            tensors[name].is_shuffled = True  # AITER's own flag: fused_moe picks its shuffled-weight kernels by it
        return PackedWeights(self.layout, tensors)

    @staticmethod
    def _fp8(weights: ExpertWeights, arch: GfxArch) -> dict[str, torch.Tensor]:
        tensors = {}
        for name in ("w13", "w2"):
            scale = getattr(weights, f"{name}_scale").float()
            if weights.key.scale.granularity is Granularity.CHANNEL:
                scale = scale.unsqueeze(-1)
            else:
                br, bc = weights.key.scale.block_shape
                rows, cols = getattr(weights, name).shape[1:]
                if (br, bc) != (128, 128) or rows % br or cols % bc:
                    raise ValueError(f"{name}: AITER's block fp8 takes whole 128x128 blocks, got blocks {(br, bc)} "
                                     f"over a [{rows}, {cols}] weight")
            tensors[name], tensors[f"{name}_scale"] = to_aiter_fp8(getattr(weights, name), scale, arch)
        return tensors


def _device_arch(device: torch.device) -> GfxArch:
    """The architecture of the ROCm device `device`; fp8 weights cannot be converted without it."""
    if device.type != "cuda" or not torch.version.hip:
        raise ValueError(f"fp8 weights for AITER depend on the GPU architecture ({GFX942.name}: e4m3fnuz, "
                         f"{GFX950.name}: e4m3fn), and {device} is not a ROCm device: process them on the ROCm "
                         "device, or build AiterProcessor(arch=GFX942 or GFX950)")
    return arch_of(torch.cuda.get_device_capability(device))
