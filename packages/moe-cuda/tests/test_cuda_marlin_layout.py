"""Marlin's tile layout against its definition, element by element, and the round trips."""

from __future__ import annotations

import pytest
import torch

from moe_cuda.marlin_layout import (
    marlin_bias,
    marlin_repack,
    marlin_scales,
    marlin_unbias,
    marlin_unpack,
    marlin_unscale,
    marlin_zero_points,
    marlin_zero_points_unpack,
)

_INTERLEAVE = {4: [0, 2, 4, 6, 1, 3, 5, 7], 8: [0, 2, 1, 3]}


def repack_by_definition(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """One expert, one element at a time: where does (k, n) go, written from the fragment's view."""
    K, N = codes.shape
    per_word = 32 // bits
    words = [[0] * (N * 16 // per_word) for _ in range(K // 16)]
    for k in range(K):
        for n in range(N):
            r, c, tile = k % 16, n % 16, n // 16
            run, j = tile // 4, tile % 4  # 1024-slot runs of four tiles
            lane = 4 * (c % 8) + (r % 8) // 2
            slot = (r % 2) + 2 * (r // 8)
            o = 32 * lane + 8 * j + 4 * (c // 8) + slot
            group = len(_INTERLEAVE[bits])
            o = o - o % group + _INTERLEAVE[bits].index(o % group)
            index = 1024 * run + o
            words[k // 16][index // per_word] |= int(codes[k, n]) << (bits * (index % per_word))
    flat = torch.tensor(words, dtype=torch.int64)
    return torch.where(flat >= 1 << 31, flat - (1 << 32), flat).to(torch.int32)


@pytest.mark.parametrize("bits", [4, 8])
def test_repack_equals_the_element_by_element_definition(bits):
    gen = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 1 << bits, (2, 32, 128), generator=gen)
    packed = marlin_repack(codes, bits)
    assert packed.shape == (2, 2, 128 * bits // 2) and packed.dtype == torch.int32
    for e in range(2):
        assert torch.equal(packed[e], repack_by_definition(codes[e], bits))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shape", [(1, 16, 64), (3, 128, 192), (2, 256, 128)])
def test_unpack_inverts_repack(bits, shape):
    codes = torch.randint(0, 1 << bits, shape, generator=torch.Generator().manual_seed(1))
    assert torch.equal(marlin_unpack(marlin_repack(codes, bits), bits, shape[2]), codes)


def test_repack_refuses_shapes_off_the_tiles():
    with pytest.raises(ValueError, match="N % 64"):
        marlin_repack(torch.zeros(1, 16, 32, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="4- or 8-bit"):
        marlin_repack(torch.zeros(1, 16, 64, dtype=torch.int64), 2)


def test_scale_orders_by_definition_and_round_trip():
    grouped = torch.arange(2 * 3 * 128, dtype=torch.float32).view(2, 3, 128)
    out = marlin_scales(grouped)
    # grouped: within each run of 64 columns, output column 8 * i + j takes input column i + 8 * j
    for i in range(8):
        for j in range(8):
            assert out[0, 0, 64 + 8 * i + j] == grouped[0, 0, 64 + i + 8 * j]
    channel = torch.arange(2 * 1 * 64, dtype=torch.float32).view(2, 1, 64)
    single = marlin_scales(channel)
    # per channel: within each run of 32, output 8 * i + t takes 2 * i + (0, 1, 8, 9, 16, 17, 24, 25)[t]
    for i in range(4):
        for t, off in enumerate((0, 1, 8, 9, 16, 17, 24, 25)):
            assert single[1, 0, 32 + 8 * i + t] == channel[1, 0, 32 + 2 * i + off]
    assert torch.equal(marlin_unscale(out), grouped) and torch.equal(marlin_unscale(single), channel)
    bias = torch.randn(3, 128)
    assert torch.equal(marlin_unbias(marlin_bias(bias)), bias)
    assert torch.equal(marlin_bias(bias), marlin_scales(bias.unsqueeze(1)).squeeze(1))


def test_zero_points_by_definition_and_round_trip():
    zeros = torch.randint(0, 16, (2, 4, 128), generator=torch.Generator().manual_seed(2))
    packed = marlin_zero_points(zeros)
    assert packed.shape == (2, 4, 16) and packed.dtype == torch.int32
    assert torch.equal(marlin_zero_points_unpack(packed), zeros)
    # by definition: grouped column order, then the 4-bit interleave, 8 nibbles per word, first lowest
    grouped = marlin_scales(zeros.float()).long()
    word = 0
    for slot, src in enumerate(_INTERLEAVE[4]):
        word |= int(grouped[1, 2, 8 + src]) << (4 * slot)
    assert int(packed[1, 2, 1]) & 0xFFFFFFFF == word
