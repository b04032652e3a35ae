"""Replicate-mode expert parallelism over torch.distributed (gloo): two ranks, each holding half the
experts and the same tokens, together reproduce the whole layer's output. All cases run in one
spawn (process start-up dominates on a 2-core machine); all-to-all mode is in
test_expert_parallel_all_to_all.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_core import ExpertWeights, FusedMoE, MoEConfig, ParallelConfig, Routing, reference_moe, route_torch
from moe_core.quant import int4_w4a16, unquantized

WORLD = 2
E, TOP_K, K, N, M = 10, 3, 128, 64, 13  # 10 experts over 2 ranks: 5 each


def _run_case(rank: int, prefer: str | None, scheme: str) -> None:
    quant = unquantized() if scheme == "bf16" else int4_w4a16(64)
    routing = Routing.deepseek_v3(2, 1, 2.5)  # exercises the correction bias across ranks too
    full = MoEConfig(E, TOP_K, K, N, routing=routing)
    weights = ExpertWeights.random(full, quant, seed=3)  # every rank draws the same layer
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(M, K, generator=gen).bfloat16()
    logits = torch.randn(M, E, generator=gen)
    bias = torch.randn(E, generator=gen) * 0.1

    config = MoEConfig(E, TOP_K, K, N, routing=routing, parallel=ParallelConfig(ep_size=WORLD, ep_rank=rank))
    local = config.parallel.local_expert_range(E)
    layer = FusedMoE(config, quant, "cpu", prefer)
    layer.load_weights(weights.narrow(local.start, len(local)), correction_bias=bias)
    out = layer(x, logits)

    tw, ids = route_torch(logits, routing, TOP_K, bias)
    ref = reference_moe(x, weights, full, tw, ids, quant)
    err = float((out.float() - ref).norm() / ref.norm())
    assert err < 1e-2, f"rank {rank}: relative L2 error {err:.2e} of the summed output"
    # Each rank alone computes only a share: the sum is what makes it whole.
    partial = FusedMoE(config, quant, "cpu", prefer, ep_group="partial")
    partial.load_weights(weights.narrow(local.start, len(local)), correction_bias=bias)
    share = partial(x, logits).float()
    assert float((share - ref).norm() / ref.norm()) > 0.1, "one rank's share already equals the layer"


def _rank_main(rank: int, init_file: str) -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores: spinning intra-op threads would starve them
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        for prefer, scheme in (("reference", "bf16"), (None, "bf16"), (None, "int4")):
            _run_case(rank, prefer, scheme)
        dist.barrier()  # no rank closes its connections while another still runs a collective
    finally:
        dist.destroy_process_group()


def test_two_ranks_sum_to_the_whole_layer(tmp_path):
    mp.spawn(_rank_main, args=(str(tmp_path / "init"),), nprocs=WORLD, join=True)


def test_expert_parallel_layer_needs_a_matching_group():
    config = MoEConfig(E, TOP_K, K, N, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    with pytest.raises(ValueError, match=r"ParallelConfig\(ep_size=2\) needs torch.distributed initialized"):
        FusedMoE(config, None, "cpu", "reference")
