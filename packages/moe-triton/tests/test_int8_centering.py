"""The int8 centering recipes of the quantized GEMMs' PTX paths, in torch: `_dequant._INT8_ASM_BF16`
on every code (m - n is exactly code - 128 in bf16, as the plain conversion gives), and the byte quads'
(`_dequant.byte_quarter_ptx`): its prmt selector, read from the PTX and emulated, takes byte j of
each of two words into the lanes the recipe then centers."""

import re

import torch

from moe_triton.quant_gemm_details._dequant import byte_quarter_ptx, byte_quarter_torch, int8_centered_torch


def test_every_code_centers_exactly():
    codes = torch.arange(256, dtype=torch.uint8)
    want = (codes.to(torch.float32) - 128).to(torch.bfloat16)
    assert torch.equal(int8_centered_torch(codes), want)


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode): byte k of the result is byte (selector nibble k & 7) of {b, a}."""
    pool = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    return sum(((pool >> (8 * ((selector >> (4 * k)) & 7))) & 0xFF) << (8 * k) for k in range(4))


def test_byte_quarters_select_and_center_exactly():
    gen = torch.Generator().manual_seed(7)
    lo, hi = (torch.randint(-2**31, 2**31, (512,), dtype=torch.int64, generator=gen) for _ in range(2))
    for j in range(4):
        want_lo = (((lo >> (8 * j)) & 0xFF).float() - 128).to(torch.bfloat16)
        want_hi = (((hi >> (8 * j)) & 0xFF).float() - 128).to(torch.bfloat16)
        got_lo, got_hi = byte_quarter_torch(lo, hi, j)
        assert torch.equal(got_lo, want_lo) and torch.equal(got_hi, want_hi), j
        for fp16 in (False, True):
            ptx = byte_quarter_ptx(j, "$0", "$1", "$2", fp16)
            selector = int(re.search(r"prmt\.b32 p, \$1, \$2, (0x[0-9a-fA-F]+);", ptx).group(1), 16)
            for a, b in zip(lo[:64].tolist(), hi[:64].tolist(), strict=True):
                p = _prmt(a, b, selector)
                # the lanes the recipe reads: bits 0-7 and 16-23 (the lop3 masks drop bytes 1 and 3)
                assert (p & 0xFF, (p >> 16) & 0xFF) == ((a >> (8 * j)) & 0xFF, (b >> (8 * j)) & 0xFF), (j, fp16)
