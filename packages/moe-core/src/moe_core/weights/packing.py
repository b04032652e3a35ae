"""Bit-level helpers shared by the canonical form, the readers and the weight processors.

Canonical 4-bit packing: two codes per uint8 along the last (input) dimension, the even element
in the low nibble. Every reader converts to it; every processor starts from it.
"""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_VALUES",
    "decode_e2m1",
    "decode_e8m0",
    "encode_e2m1",
    "pack_int4",
    "unpack_int4",
]

# The 16 values of OCP fp4 e2m1, indexed by code (bit 3 = sign).
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float32
)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 [..., K] (K even) -> uint8 [..., K/2], even k in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_int4: last dimension {codes.shape[-1]} must be even")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> uint8 codes [..., K] (inverse of pack_int4)."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"unpack_int4: expected uint8, got {packed.dtype}")
    out = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def decode_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] of packed e2m1 pairs -> float32 [..., K]."""
    return E2M1_VALUES.to(packed.device)[unpack_int4(packed).long()]


def encode_e2m1(values: torch.Tensor) -> torch.Tensor:
    """float [..., K] (already divided by the block scale) -> uint8 codes [..., K], round to nearest."""
    mags = E2M1_VALUES[:8].to(values.device)
    a = values.float().abs().clamp(max=6.0)
    # Round half to even between neighbours, as hardware converters do.
    mid = (mags[1:] + mags[:-1]) / 2
    idx = torch.bucketize(a, mid, right=True)  # a == mid[j] lands on j + 1
    tie = idx > 0
    at_mid = torch.zeros_like(a, dtype=torch.bool)
    at_mid[tie] = a[tie] == mid[idx[tie] - 1]
    idx = torch.where(at_mid & (idx % 2 == 1), idx - 1, idx)
    sign = (values < 0).to(torch.uint8) << 3
    return idx.to(torch.uint8) | sign


def decode_e8m0(exponents: torch.Tensor) -> torch.Tensor:
    """uint8 biased exponents (E8M0) -> float32 2**(e - 127). 255 (NaN) is rejected."""
    if exponents.dtype != torch.uint8:
        raise ValueError(f"decode_e8m0: expected uint8 exponents, got {exponents.dtype}")
    if bool((exponents == 255).any()):
        raise ValueError("decode_e8m0: exponent 255 encodes NaN; the checkpoint's scales are corrupt")
    return torch.exp2(exponents.float() - 127.0)
