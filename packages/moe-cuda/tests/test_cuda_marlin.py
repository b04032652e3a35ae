"""MarlinExperts on the CPU: processor, block alignment and kernel arguments, run through the torch twin
of the kernel (`marlin_twin`) against moe-core's fp32 reference. The kernel itself runs only on a GPU."""

from __future__ import annotations

import pytest
import torch
from _cuda_helpers import CPU, layer, run_against_reference

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, ParallelConfig, Routing
from moe_core.quant import (
    FP8_BLOCK128_WEIGHT,
    FP8_CHANNEL_WEIGHT,
    FP8_TENSOR_WEIGHT,
    MoEQuantConfig,
    fp8_w8a8,
    int4_w4a16,
    int8_w8a16,
    mxfp4_w4a16,
    unquantized,
)
from moe_cuda.marlin import (
    FLOAT4_E2M1F,
    FLOAT8_E4M3FN,
    UINT4,
    UINT4B8,
    UINT8B128,
    MarlinExperts,
    align_blocks,
    block_size_m,
)
from moe_cuda.vendor import MARLIN_LIBRARY

CASES = {
    "int4-g32": (layer(), int4_w4a16(32)),
    "int4-g64-fp16": (layer(dtype=torch.float16), int4_w4a16(64)),
    "int4-g128-zp": (layer(), int4_w4a16(128, zero_point=True)),
    "int4-channel": (layer(), int4_w4a16(-1)),
    "int4-g64-actorder": (layer(), int4_w4a16(64, act_order=True)),
    "int4-g128-ep-bias": (layer(bias=True, parallel=ParallelConfig(ep_size=2, ep_rank=1)), int4_w4a16(128)),
    "int8-channel": (layer(), int8_w8a16(-1)),
    "int8-g128-actorder": (layer(), int8_w8a16(128, act_order=True)),
    "fp8-tensor-weight-only": (layer(), MoEQuantConfig(FP8_TENSOR_WEIGHT)),
    "fp8-channel-weight-only-fp16": (layer(dtype=torch.float16), MoEQuantConfig(FP8_CHANNEL_WEIGHT)),
    "fp8-block-weight-only": (layer(K=256, N=256), MoEQuantConfig(FP8_BLOCK128_WEIGHT)),
    "mxfp4-swiglu_oai-bias": (layer(activation=Activation.swiglu_oai(), bias=True), mxfp4_w4a16()),
    "int4-llama4": (layer(routing=Routing.llama4(), top_k=1), int4_w4a16(128)),
    "int4-relu2-deepseek": (layer(activation=Activation.relu2(), routing=Routing.deepseek_v3(4, 2, 2.5)),
                            int4_w4a16(64)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_marlin_path_matches_reference_through_the_twin(name):
    config, quant = CASES[name]
    err, _ = run_against_reference(MarlinExperts, config, quant)
    assert err < (5e-3 if config.dtype == torch.float16 else 1e-2), err


def test_processor_is_pure():
    config, quant = CASES["int4-g128-zp"]
    from moe_core.weights.canonical import ExpertWeights

    weights = ExpertWeights.random(config, quant, seed=4)
    before = {k: v.clone() for k, v in weights.tensors().items()}
    a = MarlinExperts.weight_processor(weights, config, torch.device("cpu"))
    b = MarlinExperts.weight_processor(weights, config, torch.device("cpu"))
    assert a.tensors.keys() == b.tensors.keys()
    assert all(torch.equal(a[k], b[k]) for k in a.tensors)
    assert all(torch.equal(before[k], v) for k, v in weights.tensors().items())
    assert a["w13"].shape == (8, 256 // 16, 256 * 4 // 2) and a["w13_zero"].shape == (8, 2, 256 // 8)


@pytest.mark.parametrize("expert_map", [None, torch.tensor([-1, 0, 1, -1, 2])])
@pytest.mark.parametrize("block", [8, 16])
def test_align_blocks_covers_each_local_pair_once_in_whole_blocks(expert_map, block):
    gen = torch.Generator().manual_seed(block)
    topk_ids = torch.stack([torch.randperm(5, generator=gen)[:3] for _ in range(11)])
    local = 3 if expert_map is not None else 5
    b = align_blocks(topk_ids, block, local, expert_map)
    pairs = topk_ids.numel()
    used = int(b.num_tokens_post_padded)
    assert used % block == 0 and b.sorted_ids.dtype == b.expert_ids.dtype == torch.int32
    ids = topk_ids.reshape(-1)
    mapped = expert_map[ids] if expert_map is not None else ids
    want = sorted(i for i in range(pairs) if mapped[i] >= 0)
    rows = b.sorted_ids[:used].tolist()
    assert sorted(r for r in rows if r < pairs) == want
    assert all(r == pairs for r in b.sorted_ids[used:].tolist())
    for blk in range(used // block):
        real = [r for r in rows[blk * block:(blk + 1) * block] if r < pairs]
        assert real, "a block in use holds at least one pair"
        assert all(int(mapped[r]) == int(b.expert_ids[blk]) for r in real)
        assert real == sorted(real)  # token order within an expert


def test_block_size_follows_tokens_per_expert():
    assert block_size_m(1, 8, 128) == 8
    assert block_size_m(64, 8, 128) == 8
    assert block_size_m(256, 8, 128) == 32
    assert block_size_m(8192, 8, 128) == 64


def test_weight_type_ids_are_vllms():
    assert (UINT4.type_id, UINT4B8.type_id, UINT8B128.type_id) == (1125899906843648, 1125899907892224,
                                                                    1125899923621888)
    assert (FLOAT8_E4M3FN.type_id, FLOAT4_E2M1F.type_id) == (2814749767172868, 562949953487106)


H200 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H200", (9, 0))


def test_refusals_are_specific(monkeypatch, tmp_path):
    lib = tmp_path / "_moe_C_stable_libtorch.abi3.so"
    lib.write_bytes(b"")
    monkeypatch.setenv(MARLIN_LIBRARY.env_var, str(lib))
    assert MarlinExperts.supports(layer(), int4_w4a16(128), H200)
    gpt_oss = layer(K=2880, N=2880, activation=Activation.swiglu_oai(), bias=True)
    assert "hidden size 2880" in MarlinExperts.supports(gpt_oss, int4_w4a16(64), H200).reason
    assert "group size 256" in MarlinExperts.supports(layer(), int4_w4a16(256), H200).reason
    assert "act-order" in MarlinExperts.supports(layer(), int4_w4a16(64, zero_point=True, act_order=True),
                                                 H200).reason or \
        "zero points" in MarlinExperts.supports(layer(), int4_w4a16(64, zero_point=True, act_order=True),
                                                H200).reason
    assert "activations fp8" in MarlinExperts.supports(layer(), fp8_w8a8("channel"), H200).reason
    assert "dtype" in MarlinExperts.supports(layer(dtype=torch.float32), int4_w4a16(128), H200).reason
    assert "unquantized" in MarlinExperts.supports(layer(), unquantized(), H200).reason
    assert not MarlinExperts.supports(layer(), int4_w4a16(128), CPU)


def halves_grouped_apart(config, quant, seed=1):
    """Act-order weights whose up rows take another grouping than the gate rows (GPTQ calibrating the
    two Linears apart): canonical w13_g_idx [E, 2, K] with halves that differ."""
    import dataclasses

    from moe_core.weights import ExpertWeights

    weights = ExpertWeights.random(config, quant, seed=seed)
    g_idx = weights.w13_g_idx
    apart = dataclasses.replace(weights, w13_g_idx=torch.stack([g_idx, g_idx.flip(-1)], 1))
    apart.validate(config, quant)
    return weights, apart


@pytest.mark.parametrize("bias", [False, True])
def test_act_order_halves_grouped_apart_run_gemm1_as_two_gemms(bias):
    """Marlin sorts a GEMM's input channels once for all its rows: halves grouped apart pack as two
    GEMMs (w13_gate, w13_up) and match the reference; halves that agree pack as one."""
    import dataclasses

    config, quant = layer(bias=bias), int4_w4a16(64, act_order=True)
    weights, apart = halves_grouped_apart(config, quant)
    packed = MarlinExperts.weight_processor(apart, config, torch.device("cpu")).tensors
    assert {"w13_gate", "w13_up", "w13_gate_perm", "w13_up_perm"} <= packed.keys() and "w13" not in packed
    assert not torch.equal(packed["w13_gate_perm"], packed["w13_up_perm"])
    err, _ = run_against_reference(MarlinExperts, config, quant, weights=apart)
    assert err < 1e-2, err
    agree = dataclasses.replace(weights, w13_g_idx=torch.stack([weights.w13_g_idx] * 2, 1))
    packed = MarlinExperts.weight_processor(agree, config, torch.device("cpu")).tensors
    shared = MarlinExperts.weight_processor(weights, config, torch.device("cpu")).tensors
    assert packed.keys() == shared.keys() and all(torch.equal(packed[k], shared[k]) for k in shared)


def test_missing_library_is_a_refusal_with_the_remedy(monkeypatch, tmp_path):
    monkeypatch.setenv(MARLIN_LIBRARY.env_var, str(tmp_path / "absent.so"))
    reason = MarlinExperts.supports(layer(), int4_w4a16(128), H200).reason
    assert "MOE_CUDA_MARLIN_LIB" in reason and "not a file" in reason
    monkeypatch.delenv(MARLIN_LIBRARY.env_var)
    reason = MarlinExperts.supports(layer(), int4_w4a16(128), H200).reason
    if MARLIN_LIBRARY.locate() is None:
        assert "vllm==0.26.0 --no-deps" in reason and "MOE_CUDA_MARLIN_LIB" in reason
