"""The grouped-GEMM classes' real path on the CPU (torch._grouped_mm runs there), fp8 through its twin."""

from __future__ import annotations

import pytest
import torch
from _cuda_helpers import layer, run_against_reference

from moe_core.config import Activation, ParallelConfig, Routing
from moe_core.quant import fp8_w8a8, unquantized
from moe_cuda.dispatch import permute_by_expert, sort_by_expert
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


@pytest.mark.parametrize(("M", "top_k", "E", "owned"), [
    (1, 2, 8, None), (37, 2, 8, 5), (150, 2, 8, None), (700, 4, 32, 20), (1100, 4, 32, None)],
    ids=["one-token", "expert-parallel", "one-program", "chunks", "multi-launch"])
def test_the_one_launch_sort_equals_the_stable_argsort(M, top_k, E, owned):
    """`sort_by_expert` (moe-triton's alignment with one-row blocks: CUDA's path; the interpreter's on the
    CPU) against the torch argsort path of `permute_by_expert`, field by field."""
    gen = torch.Generator().manual_seed(M)
    ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(M)]).to(torch.int32)
    weights = torch.rand(M, top_k, generator=gen)
    expert_map, local = None, E
    if owned is not None:  # this rank owns experts 2 .. 2 + owned - 1
        expert_map = torch.full((E,), -1, dtype=torch.int32)
        expert_map[2:2 + owned] = torch.arange(owned, dtype=torch.int32)
        local = owned
    want = permute_by_expert(weights, ids, local, expert_map)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    local_ids = ids if expert_map is None else torch.where(expert_map[ids.long()] < 0, local, expert_map[ids.long()])
    order, experts, offsets, starts = sort_by_expert(local_ids.to(dev), local)
    assert torch.equal(order.cpu(), want.pair) and torch.equal(experts.cpu(), want.expert)
    assert torch.equal(offsets.cpu(), want.offsets) and torch.equal(starts.cpu(), want.starts)
    assert order.dtype == torch.int64 and offsets.dtype == torch.int32


def test_refusals_name_the_limit():
    from moe_core.backends import DeviceInfo, Platform

    h100 = DeviceInfo(Platform.CUDA, 0, "H100", (9, 0))
    a100 = DeviceInfo(Platform.CUDA, 0, "A100", (8, 0))
    assert TorchGroupedMmExperts.supports(layer(), unquantized(), h100)
    assert "compute capability" in TorchGroupedMmExperts.supports(layer(), unquantized(), a100).reason
    assert "dtype" in TorchGroupedMmExperts.supports(layer(dtype=torch.float16), unquantized(), h100).reason
    assert "block" in TorchFp8GroupedMmExperts.supports(layer(), fp8_w8a8("block"), h100).reason
