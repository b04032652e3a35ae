"""The grouped-GEMM classes' real path on the CPU (torch._grouped_mm runs there), fp8 through its twin."""

from __future__ import annotations

import pytest
import torch
from _cuda_helpers import layer, run_against_reference

from moe_core.config import Activation, ParallelConfig, Routing
from moe_core.quant import fp8_w8a8, unquantized
from moe_cuda.dispatch import permute_by_expert
from moe_cuda.grouped_mm import TorchFp8GroupedMmExperts, TorchGroupedMmExperts

CASES = {
    "silu": layer(),
    "gelu-fp32": layer(dtype=torch.float32, activation=Activation.gelu()),
    "swiglu_oai-bias": layer(activation=Activation.swiglu_oai(), bias=True),
    "relu2": layer(activation=Activation.relu2()),
    "deepseek": layer(routing=Routing.deepseek_v3(4, 2, 2.5)),
    "llama4": layer(routing=Routing.llama4(), top_k=1),
    "expert-parallel": layer(parallel=ParallelConfig(ep_size=3, ep_rank=1), bias=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_grouped_mm_matches_reference_on_cpu(name):
    config = CASES[name]
    err, _ = run_against_reference(TorchGroupedMmExperts, config, unquantized())
    assert err < (1e-4 if config.dtype == torch.float32 else 1e-2), err


@pytest.mark.parametrize("parallel", [ParallelConfig(), ParallelConfig(ep_size=2, ep_rank=1)])
def test_fp8_channel_pipeline_matches_reference_through_the_twin(parallel):
    err, _ = run_against_reference(TorchFp8GroupedMmExperts, layer(parallel=parallel), fp8_w8a8("channel"))
    assert err < 2e-2, err


def test_permutation_is_sorted_pad_free_and_puts_other_ranks_last():
    ids = torch.tensor([[3, 0], [1, 3], [0, 2]])
    weights = torch.rand(3, 2)
    expert_map = torch.tensor([-1, 0, 1, 2])  # rank owning experts 1..3
    perm = permute_by_expert(weights, ids, 3, expert_map)
    assert perm.expert.tolist() == [0, 1, 2, 2, 3, 3]  # local 0 = expert 1, ..., 3 = owned elsewhere
    assert perm.pair.tolist() == [2, 5, 0, 3, 1, 4] and perm.token.tolist() == [1, 2, 0, 1, 0, 2]
    assert perm.offsets.tolist() == [1, 2, 4] and perm.offsets.dtype == torch.int32
    assert perm.local.tolist() == [True] * 4 + [False] * 2
    assert torch.equal(perm.weight, weights.reshape(-1)[[2, 5, 0, 3, 1, 4]])
    assert perm.slot.tolist() == [2, -1, 0, 3, -1, 1]  # each (token, choice)'s sorted row; -1: elsewhere


def test_refusals_name_the_limit():
    from moe_core.backends import DeviceInfo, Platform

    h100 = DeviceInfo(Platform.CUDA, 0, "H100", (9, 0))
    a100 = DeviceInfo(Platform.CUDA, 0, "A100", (8, 0))
    assert TorchGroupedMmExperts.supports(layer(), unquantized(), h100)
    assert "compute capability" in TorchGroupedMmExperts.supports(layer(), unquantized(), a100).reason
    assert "dtype" in TorchGroupedMmExperts.supports(layer(dtype=torch.float16), unquantized(), h100).reason
    assert "block" in TorchFp8GroupedMmExperts.supports(layer(), fp8_w8a8("block"), h100).reason
