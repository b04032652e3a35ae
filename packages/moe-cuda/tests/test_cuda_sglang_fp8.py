"""SglangFp8BlockExperts on the CPU, through the operator's torch twin, and its argument builder."""

from __future__ import annotations

import pytest
import torch
from _cuda_helpers import layer, run_against_reference

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, ParallelConfig
from moe_core.quant import fp8_w8a8
from moe_core.weights.canonical import ExpertWeights
from moe_cuda.dispatch import permute_by_expert
from moe_cuda.sglang_fp8 import SglangFp8BlockExperts, blockwise_gemm_args
from moe_cuda.vendor import SGLANG_SM90_LIBRARY


@pytest.mark.parametrize("config", [
    layer(),
    layer(dtype=torch.float16, activation=Activation.swiglu_oai(), bias=True),
    layer(parallel=ParallelConfig(ep_size=3, ep_rank=2)),
], ids=["bf16-silu", "fp16-swiglu_oai-bias", "expert-parallel"])
def test_block_fp8_path_matches_reference_through_the_twin(config):
    err, _ = run_against_reference(SglangFp8BlockExperts, config, fp8_w8a8("block"))
    assert err < 2e-2, err


@pytest.mark.parametrize("config", [layer(), layer(bias=True, activation=Activation.swiglu_oai(),
                                                    parallel=ParallelConfig(ep_size=2, ep_rank=1))],
                         ids=["silu", "bias-expert-parallel"])
def test_gemm1_quantizes_tokens_before_the_gather_bit_for_bit(config):
    """GEMM1 quantizes each token once and gathers its codes and scales for its pairs: the same bits as
    quantizing every gathered pair row (the generic path), for fewer rows quantized."""
    quant = fp8_w8a8("block")
    experts = SglangFp8BlockExperts(config, quant, DeviceInfo(Platform.CPU))
    experts.load_weights(ExpertWeights.random(config, quant, seed=2))
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(19, config.hidden_size, generator=gen).to(config.dtype)
    ids = torch.randint(0, config.num_experts, (19, config.top_k), generator=gen)
    perm = permute_by_expert(torch.rand(19, config.top_k, generator=gen), ids, config.num_local_experts,
                             config.expert_map(torch.device("cpu")))
    packed = experts._packed()
    ours = experts._gemm1(x, packed, perm)
    per_pair = super(SglangFp8BlockExperts, experts)._gemm1(x, packed, perm)
    assert torch.equal(ours[perm.local], per_pair[perm.local])


def test_argument_builder():
    counts = torch.tensor([3, 0, 5], dtype=torch.int32)
    args = blockwise_gemm_args(counts, torch.tensor([0, 3, 3], dtype=torch.int32), n=256, k=384)
    assert args.problem_sizes.tolist() == [[3, 256, 384], [0, 256, 384], [5, 256, 384]]
    assert args.problem_sizes.dtype == torch.int32 and args.expert_offsets.tolist() == [0, 3, 3]
    assert args.stride_a.tolist() == [384] * 3 and args.stride_c.tolist() == [256] * 3
    assert args.stride_a.dtype == args.stride_b.dtype == args.stride_c.dtype == torch.int64
    assert all(p.shape == (3,) and p.dtype == torch.int64 for p in args.pointers)
    assert all(t.shape == (3, 5) and t.dtype == torch.int32 for t in args.layouts)


def test_gemm_bookkeeping_made_under_inference_mode_is_updated_outside_it():
    """A layer first called under torch.inference_mode() (a benchmark, an engine's warm-up) and then
    outside it (generate under no_grad) updates the same cached bookkeeping in place."""
    experts = SglangFp8BlockExperts(layer(), fp8_w8a8("block"), DeviceInfo(Platform.CPU))
    E = experts.config.num_local_experts
    gen = torch.Generator().manual_seed(0)

    def perm(tokens: int):
        ids = torch.randint(0, E, (tokens, 2), generator=gen)
        return permute_by_expert(torch.rand(tokens, 2, generator=gen), ids, E, None)

    with torch.inference_mode():
        first = experts._bookkeeping("w13", perm(5), n=256, k=384)
    later = perm(9)
    assert experts._bookkeeping("w13", later, n=256, k=384) is first
    assert torch.equal(first.problem_sizes[:, 0], later.counts) and torch.equal(first.expert_offsets, later.starts)


def test_group_quantization_round_trips_within_fp8_precision():
    x = torch.randn(5, 256) * torch.logspace(-3, 3, 256)
    codes, scale = SglangFp8BlockExperts._quantize(x)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (5, 2)
    back = (codes.float().view(5, 2, 128) * scale[..., None]).view(5, 256)
    assert float((back - x).norm() / x.norm()) < 0.04


def test_refusals(monkeypatch, tmp_path):
    h200 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H200", (9, 0))
    b200 = DeviceInfo(Platform.CUDA, 0, "NVIDIA B200", (10, 0))
    monkeypatch.setenv(SGLANG_SM90_LIBRARY.env_var, str(tmp_path / "absent.so"))
    assert "MOE_CUDA_SGLANG_LIB" in SglangFp8BlockExperts.supports(layer(), fp8_w8a8("block"), h200).reason
    assert "compute capability" in SglangFp8BlockExperts.supports(layer(), fp8_w8a8("block"), b200).reason
    assert "channel" in SglangFp8BlockExperts.supports(layer(), fp8_w8a8("channel"), h200).reason
    assert "intermediate size 192" in SglangFp8BlockExperts.supports(layer(N=192), fp8_w8a8("block"), h200).reason
