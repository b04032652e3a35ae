"""Expert placement, the expert-parallel modes and their validation, dispatch payloads, and what
`moe explain` says about them; the multi-process runs are in integration/test_expert_parallel*.py."""

from __future__ import annotations

import json

import pytest
import torch

from moe_core import ExpertWeights, FusedMoE, MoEConfig, ParallelConfig, unquantized
from moe_core.cli import main
from moe_core.config import ExpertPlacement
from moe_core.parallel import (
    AllToAll,
    Replicate,
    balanced_placement,
    expert_loads,
    local_weights,
    payload_roundtrip,
    resolve_parallel,
)


def test_contiguous_placement_is_the_block_layout():
    p = ExpertPlacement.contiguous(10, 4)
    assert p.ranks == ((0, 1, 2), (3, 4, 5), (6, 7), (8, 9)) and not p.has_replicas
    for r in range(4):
        assert ParallelConfig(ep_size=4, ep_rank=r).local_expert_range(10) == range(p.ranks[r][0], p.ranks[r][-1] + 1)
    assert p.describe().splitlines()[1] == "rank 1: 3 experts 3-5"


def test_a_custom_placement_drives_expert_map_and_local_weights():
    placement = ExpertPlacement(6, ((4, 0, 2), (1, 3, 5)))
    parallel = ParallelConfig(ep_size=2, ep_rank=0, placement=placement)
    assert parallel.local_experts(6) == (4, 0, 2)
    assert parallel.expert_map(6).tolist() == [1, -1, 2, -1, 0, -1]
    with pytest.raises(ValueError, match=r"rank 0 holds experts 4,0,2, not a contiguous range; use local_experts"):
        parallel.local_expert_range(6)
    config = MoEConfig(6, 2, 32, 16, parallel=parallel)
    assert config.num_local_experts == 3
    full = ExpertWeights.random(MoEConfig(6, 2, 32, 16), unquantized(), seed=1)
    mine = local_weights(full, config)
    mine.validate(config)
    assert torch.equal(mine.w13, full.w13[[4, 0, 2]]) and torch.equal(mine.w2, full.w2[[4, 0, 2]])
    block = MoEConfig(6, 2, 32, 16, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    assert local_weights(full, block).w13.data_ptr() == full.w13[3].data_ptr()  # a view, no copy
    with pytest.raises(ValueError, match=r"expected the whole layer's weights \(6 experts\), got 3"):
        local_weights(mine, config)


@pytest.mark.parametrize("make, match", [
    (lambda: ExpertPlacement(4, ((0, 1), (2,))), r"every expert placed; missing 3"),
    (lambda: ExpertPlacement(4, ((0, 1, 1), (2, 3))), r"ranks\[0\].*distinct expert ids"),
    (lambda: ExpertPlacement(4, ((0, 1, 4), (2, 3))), r"ranks\[0\].*expert ids in \[0, 4\)"),
    (lambda: ExpertPlacement(4, ((0, 1, 2, 3), ())), r"ranks\[1\].*at least one expert per rank"),
    (lambda: ParallelConfig(ep_size=3, placement=ExpertPlacement.contiguous(4, 2)),
     r"placement=.*an ExpertPlacement of ep_size=3 ranks"),
    (lambda: ParallelConfig(ep_size=2, placement=ExpertPlacement.contiguous(4, 2)).expert_map(8),
     r"placement.num_experts=4 is invalid: expected the layer's num_experts=8"),
    (lambda: balanced_placement([1, 2, 3, 4], 2, redundant=3), r"redundant=3 is invalid"),
    (lambda: balanced_placement([1, -2, 3], 2), r"loads must be a non-empty sequence of finite values >= 0"),
    (lambda: balanced_placement([1, 2, 3], 4), r"num_ranks=4 is invalid: expected an int in \[1, 3\]"),
    (lambda: AllToAll(payload=torch.float16), r"AllToAll.payload=torch.float16 is invalid"),
])
def test_placement_and_mode_errors_name_what_is_accepted(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_balanced_placement_evens_the_load_and_replicates_hot_experts():
    loads = [100, 1, 1, 1, 50, 2, 2, 3, 40, 5, 5, 5, 1, 1, 1, 1]
    p = balanced_placement(loads, 4)
    per_rank = [sum(loads[e] for e in held) for held in p.ranks]
    assert max(per_rank) == 103  # optimal: the hot expert fills its rank's 4 slots with three of load 1
    assert all(len(held) == 4 for held in p.ranks) and p == balanced_placement(loads, 4)
    r = balanced_placement(loads, 4, redundant=2)
    assert [len(r.replicas(e)) for e in (0, 4)] == [3, 1] and r.num_slots == 18
    assert len({rank for rank, _ in r.replicas(0)}) == 3  # copies on distinct ranks
    share = [sum(loads[e] / len(r.replicas(e)) for e in held) for held in r.ranks]
    assert max(share) < 0.75 * max(per_rank)  # 74.3: the three copies of expert 0 carry 33.3 each
    assert expert_loads(torch.tensor([[0, 2], [2, 3]]), 5) == [1, 0, 2, 1, 0]


def test_resolve_parallel_says_which_mode_and_why():
    one = MoEConfig(8, 2, 32, 16)
    assert resolve_parallel(one, None, False, "X").mode is None
    two = MoEConfig(8, 2, 32, 16, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    default = resolve_parallel(two, None, False, "X")
    assert isinstance(default.mode, Replicate) and "default for ep_size > 1" in default.reason
    a2a = resolve_parallel(two, AllToAll(torch.float8_e4m3fn), True, "TritonWna16Experts")
    assert "its modular apply() runs the received rows" in a2a.reason
    assert a2a.to_dict()["payload"] == "float8_e4m3fn" and "rank 1: 4 experts 4-7" in a2a.explain()
    replicas = ParallelConfig(ep_size=2, placement=balanced_placement([9, 1, 1, 1, 1, 1, 1, 1], 2, 1))
    with_replicas = MoEConfig(8, 2, 32, 16, parallel=replicas)
    assert resolve_parallel(with_replicas, AllToAll(), False, "X").placement.has_replicas
    for parallel, config, group, match in [
        (AllToAll(), one, None, r"needs expert parallelism: ParallelConfig.ep_size is 1"),
        ("all_to_all", two, None, r"FusedMoE\(parallel='all_to_all'\) is invalid: expected None"),
        (AllToAll(), two, "partial", r"ep_group='partial' .* is a replicate-mode option"),
        (None, with_replicas, None, r"replicate mode would count them once per copy"),
    ]:
        with pytest.raises(ValueError, match=match):
            resolve_parallel(config, parallel, False, "X", group)


def test_all_to_all_layer_needs_an_initialized_group():
    config = MoEConfig(8, 2, 32, 16, parallel=ParallelConfig(ep_size=2, ep_rank=0))
    with pytest.raises(ValueError, match=r"ParallelConfig\(ep_size=2\) needs torch.distributed initialized"):
        FusedMoE(config, None, "cpu", "reference", parallel=AllToAll())


def test_payload_round_trips():
    x = torch.randn(5, 64).bfloat16()
    assert payload_roundtrip(x, None) is x and torch.equal(payload_roundtrip(x, torch.bfloat16), x)
    x[2] = 0  # an all-zero row keeps a finite scale
    y = payload_roundtrip(x, torch.float8_e4m3fn)
    assert y.dtype == x.dtype and torch.equal(y[2], x[2])
    assert float((y.float() - x.float()).norm() / x.float().norm()) < 0.05
    x32 = torch.randn(3, 16)
    assert torch.equal(payload_roundtrip(x32, torch.bfloat16), x32.bfloat16().float())


def test_explain_reports_mode_and_placement(tmp_path, capsys):
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps([9, 1, 1, 1, 8, 2, 2, 2]))
    argv = ["explain", "--preset", "tiny", "--device", "cpu", "--backend", "reference", "--ep-size", "2",
            "--ep-rank", "1"]
    assert main([*argv, "--parallel", "all_to_all", "--payload", "fp8", "--placement", "balanced",
                 "--expert-loads", str(loads), "--redundant", "2"]) == 0
    out = capsys.readouterr().out
    assert "parallel: all_to_all (float8_e4m3fn payload, exact splits): chosen (parallel=AllToAll)" in out
    assert "placement (this process: rank 1):" in out and "replicated experts: 0,4" in out
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["parallel"]
    assert report["mode"] == "replicate" and report["placement"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert main([*argv, "--payload", "bf16"]) == 2
    assert "--payload and --fixed-slots need --parallel all_to_all" in capsys.readouterr().err


def test_a_tensor_parallel_layer_returns_a_partial_sum_only_on_request():
    """tp_size > 1 in one process: the layer's output is one rank's share of the intermediate columns,
    which it does not reduce; without ep_group='partial' it refuses, with it the shares sum to the whole."""
    import torch

    from moe_core import ExpertWeights, FusedMoE, MoEConfig, Routing
    from moe_core.config import ParallelConfig

    def config(**parallel) -> MoEConfig:
        return MoEConfig(num_experts=4, top_k=2, hidden_size=32, intermediate_size=16, dtype=torch.float32,
                         routing=Routing.softmax_topk(True), parallel=ParallelConfig(**parallel))

    with pytest.raises(ValueError, match=r"tp_size=2: this rank holds 8 of the 16 .*ep_group='partial'"):
        FusedMoE(config(tp_size=2), prefer="reference")
    whole = FusedMoE(config(), prefer="reference")
    weights = ExpertWeights.random(whole.config, whole.quant, seed=3)
    whole.load_weights(weights)
    x, logits = torch.randn(5, 32), torch.randn(5, 4)
    total = torch.zeros(5, 32)
    for rank in range(2):
        share = FusedMoE(config(tp_size=2, tp_rank=rank), prefer="reference", ep_group="partial")
        assert "partial sum" in share.parallel_plan.explain()
        cols = slice(rank * 8, (rank + 1) * 8)
        w13 = torch.cat([weights.w13[:, :16][:, cols], weights.w13[:, 16:][:, cols]], 1)
        share.load_weights(ExpertWeights.from_float(w13, weights.w2[:, :, cols], share.quant, dtype=torch.float32))
        total += share(x, logits)
    torch.testing.assert_close(total, whole(x, logits), rtol=1e-5, atol=1e-5)


def test_contiguous_placement_is_one_checked_instance_per_size():
    """Layers read their placement on every call (`num_local_experts`): each size is built and
    checked once, and bad sizes are still refused."""
    placement = ExpertPlacement.contiguous(128, 4)
    assert ExpertPlacement.contiguous(128, 4) is placement
    assert placement.ranks[1] == tuple(range(32, 64))
    assert ParallelConfig(ep_size=4, ep_rank=1).local_experts(128) is placement.ranks[1]
    for experts, ranks in ((128.0, 4), (True, 1), (0, 1), (4, 8)):
        with pytest.raises(ValueError, match=r"ExpertPlacement\.contiguous"):
            ExpertPlacement.contiguous(experts, ranks)
