"""FlashInfer's layouts against their definitions, and both classes' paths through their torch twins."""

from __future__ import annotations

import os

import pytest
import torch
from _cuda_helpers import layer, run_against_reference

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, ParallelConfig
from moe_core.quant import fp8_w8a8, unquantized
from moe_cuda.flashinfer import (
    FlashInferCutlassExperts,
    FlashInferTrtllmBf16Experts,
    block_major_k,
    from_block_major_k,
    swap_gate_up,
    trtllm_gemm1_rows,
    trtllm_gemm2_rows,
)

# TRT-LLM's srcToDstBlk32RowMap, as FlashInfer lists it: row i of a 32-row block moves to this position.
BLOCK32_MAP = [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
               4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31]


def test_gemm1_rows_by_definition():
    n = 64
    # step 1: up rows first, then gate rows; step 2: alternate the halves row by row
    swapped = list(range(n, 2 * n)) + list(range(n))
    alternating = [swapped[j // 2] if j % 2 == 0 else swapped[n + j // 2] for j in range(2 * n)]
    # step 3: in each block of 32, the row at position i moves to position BLOCK32_MAP[i]
    shuffled = [0] * (2 * n)
    for i, row in enumerate(alternating):
        shuffled[i // 32 * 32 + BLOCK32_MAP[i % 32]] = row
    assert trtllm_gemm1_rows(2 * n).tolist() == shuffled
    assert sorted(shuffled) == list(range(2 * n))


def test_gemm2_rows_and_block_major_k_round_trip():
    rows = trtllm_gemm2_rows(96)
    assert sorted(rows.tolist()) == list(range(96)) and rows[8] == 1 and rows[1] == 4
    w = torch.randn(2, 96, 256).to(torch.bfloat16)
    blocked = block_major_k(w)
    assert blocked.shape == (2, 4, 96, 64)  # 128-byte blocks: 64 bf16 columns
    assert torch.equal(blocked[1, 2, 5], w[1, 5, 128:192])
    assert torch.equal(from_block_major_k(blocked), w)
    with pytest.raises(ValueError, match="blocks of 64"):
        block_major_k(torch.zeros(1, 32, 96, dtype=torch.bfloat16))


def test_swap_gate_up_is_its_own_inverse():
    t = torch.arange(2 * 6 * 3).view(2, 6, 3)
    assert torch.equal(swap_gate_up(t)[:, :3], t[:, 3:]) and torch.equal(swap_gate_up(swap_gate_up(t)), t)


@pytest.mark.parametrize(("config", "quant"), [
    (layer(), unquantized()),
    (layer(dtype=torch.float16), unquantized()),
    (layer(), fp8_w8a8("block")),
], ids=["bf16", "fp16", "fp8-block"])
def test_cutlass_layout_through_the_twin(config, quant):
    err, _ = run_against_reference(FlashInferCutlassExperts, config, quant)
    assert err < (2e-2 if quant.weight.quantized else 1e-2), err


def test_cutlass_fp8_blocks_take_bf16_activations_only():
    h100 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H100 80GB HBM3", (9, 0))
    supports = FlashInferCutlassExperts.supports_extra  # supports() also asks for an installed flashinfer
    assert supports(layer(), fp8_w8a8("block"), h100)
    refused = supports(layer(dtype=torch.float16), fp8_w8a8("block"), h100)
    assert not refused and "torch.float16 activations (supported: torch.bfloat16)" in refused.reason
    assert supports(layer(dtype=torch.float16), unquantized(), h100)


def test_trtllm_layout_through_the_twin():
    err, _ = run_against_reference(FlashInferTrtllmBf16Experts, layer(), unquantized())
    assert err < 1e-2, err


def test_capabilities_state_their_hardware():
    h200 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H200", (9, 0))
    b200 = DeviceInfo(Platform.CUDA, 0, "NVIDIA B200", (10, 0))
    trtllm = FlashInferTrtllmBf16Experts.supports(layer(), unquantized(), h200)
    assert "compute capability" in trtllm.reason
    for cls in (FlashInferCutlassExperts, FlashInferTrtllmBf16Experts):
        assert cls.capability.validated_on == ()
        assert cls.capability.limitations[0].startswith("NOT validated on real hardware")
        support = cls.supports(layer(), unquantized(), b200)
        assert support or "flashinfer" in support.reason
        assert not cls.supports(layer(activation=Activation.gelu()), unquantized(), b200)
        assert not cls.supports(layer(parallel=ParallelConfig(ep_size=2, ep_rank=0)), unquantized(), b200)


def test_first_sm90_build_is_announced_once(tmp_path, monkeypatch, capsys):
    import sys
    import types

    from moe_cuda import flashinfer

    env = types.SimpleNamespace(FLASHINFER_JIT_DIR=tmp_path, get_aot_artifacts=lambda name: ())
    jit = types.SimpleNamespace(env=env)
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(jit=jit))
    monkeypatch.setitem(sys.modules, "flashinfer.jit", jit)
    monkeypatch.setitem(sys.modules, "flashinfer.jit.env", env)
    monkeypatch.setenv("FLASHINFER_JIT_VERBOSE", "")  # recorded, so the test's own setting is undone
    monkeypatch.delenv("FLASHINFER_JIT_VERBOSE")
    monkeypatch.setenv("FLASHINFER_JIT_DEBUG", "")
    monkeypatch.delenv("FLASHINFER_JIT_DEBUG")
    flashinfer.announce_sm90_build.cache_clear()
    flashinfer.announce_sm90_build()
    flashinfer.announce_sm90_build()
    said = capsys.readouterr().err
    assert said.count("8.6 CPU-hours") == 1 and str(tmp_path) in said
    assert os.environ["FLASHINFER_JIT_VERBOSE"] == "1"  # ninja's [n/N] lines
    assert os.environ["FLASHINFER_JIT_DEBUG"] == "0"  # not the -O0 debug build VERBOSE alone means
    built = tmp_path / "fused_moe_90" / "fused_moe_90.so"
    built.parent.mkdir()
    built.touch()
    flashinfer.announce_sm90_build.cache_clear()
    flashinfer.announce_sm90_build()
    assert capsys.readouterr().err == ""
    flashinfer.announce_sm90_build.cache_clear()
