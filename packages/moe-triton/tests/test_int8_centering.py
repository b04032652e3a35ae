"""The int8 centering recipe of the quantized GEMM's PTX path (`_dequant._INT8_ASM_BF16`), in torch
on every code: m - n is exactly code - 128 in bf16, as the shipped conversion gives."""

import torch

from moe_triton.quant_gemm_details._dequant import int8_centered_torch


def test_every_code_centers_exactly():
    codes = torch.arange(256, dtype=torch.uint8)
    want = (codes.to(torch.float32) - 128).to(torch.bfloat16)
    assert torch.equal(int8_centered_torch(codes), want)
