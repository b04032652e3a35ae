"""FlashInfer's layouts against their definitions, and the classes' paths through their torch twins."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from _cuda_helpers import layer, run_against_reference

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, ParallelConfig, Routing
from moe_core.quant import fp8_w8a8, int4_w4a16, mxfp4_w4a16, unquantized
from moe_core.weights.canonical import ExpertWeights
from moe_cuda.flashinfer import (
    FlashInferCutlassExperts,
    FlashInferCutlassMxfp4Experts,
    FlashInferTrtllmBf16Experts,
    block_major_k,
    deinterleave_fp4_for_sm90,
    fold_scales_for_sm90,
    from_block_major_k,
    interleave_fp4_for_sm90,
    swap_gate_up,
    trtllm_gemm1_rows,
    trtllm_gemm2_rows,
    unfold_scales_for_sm90,
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
    # The CUTLASS bf16/fp8 class passed its device tests on an H100 and an H200; the TRT-LLM one never ran.
    assert FlashInferCutlassExperts.capability.validated_on == ("cuda: NVIDIA H100 80GB HBM3", "cuda: NVIDIA H200")
    assert not any("NOT validated" in text for text in FlashInferCutlassExperts.capability.limitations)
    assert FlashInferTrtllmBf16Experts.capability.validated_on == ()
    assert FlashInferTrtllmBf16Experts.capability.limitations[0].startswith("NOT validated on real hardware")
    for cls in (FlashInferCutlassExperts, FlashInferTrtllmBf16Experts):
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


# ---- flashinfer_cutlass, MXFP4 x bf16 (sm90) ----------------------------------------------------


def _kernel_interleave_loop(weight: torch.Tensor) -> torch.Tensor:
    """interleave_fp4_weights_for_sm90_mixed_gemm_kernel line by line, one thread at a time (one expert)."""
    rows, cols = weight.shape[0], weight.shape[1] * 2
    src, dst = weight.reshape(-1).tolist(), [0] * weight.numel()
    moves = [(0x80, 24), (0x70, 18), (0x08, 12), (0x07, 6), (0x8000, 13), (0x7000, 7), (0x0800, 1),
             (0x0700, -5), (0x800000, 2), (0x700000, -4), (0x080000, -10), (0x070000, -16), (0x80000000, -1),
             (0x10000000, 1), (0x60000000, -3), (0x08000000, -13), (0x01000000, -11), (0x06000000, -15)]
    for block_id in range(rows // 2):
        for partition_id in range(cols // 64):
            for lane_id in range(16):
                row_id = block_id // 8 * 16 + block_id % 8
                mma_id = lane_id // 4
                dst_row_id = row_id + (mma_id % 2) * 8
                interleaved_lane_id = lane_id // 8 * 16 + (lane_id % 4) * 4
                col_id = partition_id * 32 + mma_id * 8 + lane_id % 4
                dst_col_id = partition_id * 32 + interleaved_lane_id
                first = row_id * cols // 2 + col_id
                second = (row_id + 8) * cols // 2 + col_id
                raw = src[first] | src[second] << 8 | src[first + 4] << 16 | src[second + 4] << 24
                word = 0
                for mask, shift in moves:
                    word |= (raw & mask) << shift if shift >= 0 else (raw & mask) >> -shift
                dst_id = dst_row_id * cols // 2 + dst_col_id
                for j in range(4):
                    dst[dst_id + j] = (word >> (8 * j)) & 0xFF
    return torch.tensor(dst, dtype=torch.uint8).view_as(weight)


def _random_bytes(*shape, seed):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_mxfp4_interleave_port_equals_the_kernel_loop():
    w = _random_bytes(2, 32, 64, seed=1)  # 32 rows of 128 inputs: two row groups, two partitions
    ported = interleave_fp4_for_sm90(w)
    for e in range(2):
        assert torch.equal(ported[e], _kernel_interleave_loop(w[e]))


def test_mxfp4_interleave_moves_every_bit_exactly_once():
    rows, half_k = 16, 64  # one row group, two partitions (the kernel-loop test covers more row groups)
    bits = rows * half_k * 8
    one_hot = torch.zeros(bits, rows * half_k, dtype=torch.uint8)  # "expert" i holds bit i only
    i = torch.arange(bits)
    one_hot[i, i // 8] = (1 << (i % 8)).to(torch.uint8)
    out = interleave_fp4_for_sm90(one_hot.view(bits, rows, half_k)).view(bits, -1)
    unpacked = (out.unsqueeze(-1).long() >> torch.arange(8)) & 1
    assert torch.equal(unpacked.sum(dim=(1, 2)), torch.ones(bits, dtype=torch.long))
    landed = unpacked.view(bits, -1).argmax(dim=1)
    assert torch.equal(landed.sort().values, torch.arange(bits))


def test_mxfp4_interleave_round_trips_through_the_twins_decode():
    w = _random_bytes(3, 48, 96, seed=2)
    interleaved = interleave_fp4_for_sm90(w)
    assert interleaved.shape == w.shape and (interleaved != w).float().mean() > 0.9
    assert torch.equal(deinterleave_fp4_for_sm90(interleaved), w)
    with pytest.raises(ValueError, match="rows % 16 and inputs % 64"):
        interleave_fp4_for_sm90(_random_bytes(1, 24, 32, seed=0))


def test_mxfp4_scale_fold_port_equals_its_formula():
    s = _random_bytes(2, 128, 12, seed=3)  # 128 rows, K = 384: two row blocks, three K128 blocks
    folded = fold_scales_for_sm90(s)
    assert folded.shape == (2, 2, 3, 16, 16) and folded.dtype == torch.uint8
    for e in range(2):
        for r in range(128):
            for c in range(12):
                # FlashInfer's reshape (rows/64, 4 slices, 16, K/128, 4 groups) permuted (0, 1, 4, 3, 2, 5)
                assert folded[e, r // 64, c // 4, r % 16, (r % 64) // 16 * 4 + c % 4] == s[e, r, c]
    assert torch.equal(unfold_scales_for_sm90(folded), s)
    for bad in ((1, 96, 8), (1, 64, 6)):
        with pytest.raises(ValueError, match="rows % 64 and inputs % 128"):
            fold_scales_for_sm90(_random_bytes(*bad, seed=0))


def test_mxfp4_processor_orders_rows_and_states_swiglu_oai():
    config = layer(activation=Activation.swiglu_oai(), bias=True)
    weights = ExpertWeights.random(config, mxfp4_w4a16(), seed=4)
    packed = FlashInferCutlassMxfp4Experts.weight_processor(weights, config, torch.device("cpu"))
    n = config.intermediate_size_per_partition
    assert torch.equal(deinterleave_fp4_for_sm90(packed["w31"])[:, :n], weights.w13[:, n:])  # up rows first
    assert torch.equal(unfold_scales_for_sm90(packed["w31_scale"])[:, n:], weights.w13_scale[:, :n])
    assert torch.equal(packed["w31_bias"][:, :n], weights.w13_bias[:, n:].to(torch.bfloat16))
    assert packed["w2_bias"].dtype == torch.bfloat16
    E = config.num_experts
    for name, value in (("swiglu_alpha", 1.702), ("swiglu_beta", 1.0), ("swiglu_limit", 7.0)):
        assert packed[name].dtype == torch.float32 and torch.equal(packed[name], torch.full((E,), value))
    silu = FlashInferCutlassMxfp4Experts.weight_processor(
        ExpertWeights.random(layer(), mxfp4_w4a16(), seed=4), layer(), torch.device("cpu"))
    assert "swiglu_alpha" not in silu.tensors and "w31_bias" not in silu.tensors


@pytest.mark.parametrize("m", [1, 37, 130])
@pytest.mark.parametrize("config", [layer(activation=Activation.swiglu_oai(), bias=True), layer(top_k=4)],
                         ids=["swiglu_oai-bias", "silu"])
def test_mxfp4_layout_through_the_twin(config, m):
    err, _ = run_against_reference(FlashInferCutlassMxfp4Experts, config, mxfp4_w4a16(), m=m, seed=m)
    assert err < 1e-2, err


def test_mxfp4_swiglu_oai_clamps_through_the_twin():
    config = layer(activation=Activation.swiglu_oai(), bias=True)
    weights = ExpertWeights.random(config, mxfp4_w4a16(), seed=5)
    weights = dataclasses.replace(weights, w13_scale=weights.w13_scale + 3)  # GEMM1 outputs x8: past the limit
    x = torch.randn(64, config.hidden_size, generator=torch.Generator().manual_seed(5))
    w13, _ = weights.narrow(0, 1).dequantize()
    assert ((x @ w13[0].T).abs() > 7.0).float().mean() > 0.2
    err, _ = run_against_reference(FlashInferCutlassMxfp4Experts, config, mxfp4_w4a16(), m=64, seed=5,
                                   weights=weights)
    assert err < 1e-2, err


def _supports(config, device, monkeypatch):
    # supports() first asks for an installed flashinfer; the record's own reasons are what is tested
    cls = FlashInferCutlassMxfp4Experts
    monkeypatch.setattr(cls, "capability", dataclasses.replace(cls.capability, requires=()))
    return cls.supports(config, mxfp4_w4a16(), device)


def test_mxfp4_refusals_say_why(monkeypatch):
    h100 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H100 80GB HBM3", (9, 0))
    gpt_oss_like = layer(E=32, K=512, N=512, top_k=4, activation=Activation.swiglu_oai(), bias=True)
    assert _supports(gpt_oss_like, h100, monkeypatch)
    assert _supports(layer(), h100, monkeypatch)
    refusals = {
        "activation dtype torch.float16 (supported: {torch.bfloat16})": (layer(dtype=torch.float16), h100),
        "hidden size 320 (must be a multiple of 128)": (layer(K=320), h100),
        "hidden size 2880 (must be a multiple of 128)": (layer(K=2880, N=2880), h100),
        "intermediate size 192 (must be a multiple of 128)": (layer(N=192), h100),
        "needs compute capability <= (9, 0), device has (10, 0)":
            (layer(), DeviceInfo(Platform.CUDA, 0, "NVIDIA B200", (10, 0))),
        "needs compute capability >= (9, 0), device has (8, 0)":
            (layer(), DeviceInfo(Platform.CUDA, 0, "NVIDIA A100", (8, 0))),
        "activation gelu": (layer(activation=Activation.gelu()), h100),
        "does not implement {clamped_silu}": (layer(activation=Activation.silu(clamp=7.0)), h100),
        "expert parallelism": (layer(parallel=ParallelConfig(ep_size=2, ep_rank=0)), h100),
    }
    for reason, (config, device) in refusals.items():
        support = _supports(config, device, monkeypatch)
        assert not support and reason in support.reason, (reason, support.reason)
    int4 = FlashInferCutlassMxfp4Experts.supports(layer(), int4_w4a16(32), h100)
    assert not int4 and ("int4" in int4.reason or "flashinfer" in int4.reason)


@pytest.mark.parametrize("cls, quant", [(FlashInferCutlassExperts, unquantized()),
                                        (FlashInferCutlassExperts, fp8_w8a8("block")),
                                        (FlashInferTrtllmBf16Experts, unquantized()),
                                        (FlashInferCutlassMxfp4Experts, mxfp4_w4a16())])
def test_llama4_weights_the_input(cls, quant):
    # The kernels weight each expert's output; Llama4's top-1 weight must scale the input instead.
    config = layer(top_k=1, routing=Routing.llama4())
    err, _ = run_against_reference(cls, config, quant, m=37, seed=6)
    assert err < (2e-2 if quant.weight.quantized else 1e-2), err


def test_mxfp4_capability_states_its_hardware():
    cap = FlashInferCutlassMxfp4Experts.capability
    assert cap.validated_on == () and cap.limitations[0].startswith("NOT validated on real hardware")
    assert (cap.min_capability, cap.max_capability) == ((9, 0), (9, 0)) and cap.dtypes == {torch.bfloat16}
    assert FlashInferCutlassMxfp4Experts.backend == FlashInferCutlassExperts.backend
