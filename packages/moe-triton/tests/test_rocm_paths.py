"""What an AMD (ROCm) GPU would run: the portable kernels only. Tuned files of NVIDIA GPUs ask for
Hopper-only paths (Gluon wgmma GEMMs, TMA tensor-descriptor loads); on ROCm the same tiles run on
the `tl.dot` and direct kernels with plain loads. PDL and the PTX nibble unpack are gated on
`torch.version.hip` at launch (`_common/pdl.py`, `quant_gemm.py`), and the fp8 class claims CUDA only."""

from __future__ import annotations

import pytest
import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import MoEConfig
from moe_core.quant import fp8_w8a8, int4_w4a16, mxfp4_w4a16, unquantized
from moe_triton._common.target import tma_capable
from moe_triton.configs import lookup
from moe_triton.experts import TritonExperts
from moe_triton.quantized import TritonFp8Experts, TritonMxfp4Experts, TritonWna16Experts

MI300X = DeviceInfo(Platform.ROCM, 0, "AMD Instinct MI300X", (9, 4))
H100 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H100 80GB HBM3", (9, 0))
# qwen3-30b-a3b's layer: the shipped H100/H200 files hold wgmma, persistent and TMA tiles for it.
QWEN3_30B = MoEConfig(128, 8, 2048, 768, dtype=torch.bfloat16)
TOKENS = (1, 8, 32, 128, 512, 2048, 8192)


def test_hopper_tiles_of_nvidia_files_run_portable_kernels_on_rocm():
    experts = TritonExperts(QWEN3_30B, unquantized(), MI300X)
    tiles = [t for m in TOKENS for t in (experts.config_for(m).config.gemm1, experts.config_for(m).config.gemm2)]
    assert not any(t.wgmma or t.persistent or t.tma for t in tiles)
    assert any(t.direct for t in tiles) and any(not t.direct for t in tiles)  # decode and grouped GEMMs
    # The same files do ask for those paths: this is a real downgrade, not an empty check.
    asked = [t for m in TOKENS for t in (lookup(experts._key, m).config.gemm1, lookup(experts._key, m).config.gemm2)]
    assert any(t.wgmma for t in asked) and any(t.tma for t in asked)


@pytest.mark.parametrize(("cls", "quant"), [(TritonWna16Experts, int4_w4a16(128)), (TritonMxfp4Experts, mxfp4_w4a16())])
def test_quantized_launches_on_rocm_use_the_tl_dot_kernel(cls, quant):
    """The NVIDIA int4 files (MXFP4 borrows them) run their wgmma GEMMs as tl.dot ones."""
    experts = cls(QWEN3_30B, quant, MI300X)
    hits = [experts.config_for(m) for m in TOKENS]
    assert any("wgmma off" in hit.detail for hit in hits)
    for hit in hits:
        assert not hit.config.gemm1.wgmma and not hit.config.gemm2.wgmma


@pytest.mark.parametrize("device, served", [(MI300X, False), (H100, True)])
def test_fp8_is_claimed_on_cuda_only(device, served):
    assert bool(TritonFp8Experts.supports(QWEN3_30B, fp8_w8a8("channel"), device)) is served


def test_tma_only_on_nvidia_hopper_and_later():
    assert tma_capable(H100) and not tma_capable(MI300X)
    assert not tma_capable(DeviceInfo(Platform.CUDA, 0, "NVIDIA A100", (8, 0)))
    assert not tma_capable(DeviceInfo(Platform.XPU, 0, "Intel Data Center GPU Max"))
