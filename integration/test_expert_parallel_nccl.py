"""All-to-all expert parallelism over NCCL on 2+ GPUs (device-marked: the CUDA runners run it).

Same check as the gloo test (each rank's rows equal the single-process layer's rows) on the
backend the oracle picks on the GPU, plus the fixed-slot variant captured in a CUDA graph and
replayed on new inputs, which must equal the eager call, and both variants compiled
(`torch.compile(fullgraph=True)`; the fixed-slot one in mode "reduce-overhead" too), equal to
eager. bf16 layers: partial sums are rounded per rank before the fp32 combine, so rows agree to
bf16 rounding (relative L2 < 1e-2).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_core import ExpertWeights, FusedMoE, MoEConfig, ParallelConfig, Routing
from moe_core.parallel import AllToAll, balanced_placement, local_weights, payload_roundtrip
from moe_core.quant import unquantized

E, K, N, TOP_K = 16, 256, 128, 4
ROUTING = Routing.deepseek_v3(4, 2, 2.5)
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _layers(rank: int, world: int, dev: torch.device, mode: AllToAll, redundant: int):
    full = MoEConfig(E, TOP_K, K, N, routing=ROUTING)
    weights = ExpertWeights.random(full, unquantized(), seed=3, device=dev)
    bias = torch.randn(E, generator=torch.Generator().manual_seed(5)).mul(0.1).to(dev)
    placement = balanced_placement(list(range(E, 0, -1)), world, redundant) if redundant else None
    config = MoEConfig(E, TOP_K, K, N, routing=ROUTING,
                       parallel=ParallelConfig(ep_size=world, ep_rank=rank, placement=placement))
    layer = FusedMoE(config, unquantized(), dev, parallel=mode)
    layer.load_weights(local_weights(weights, config), correction_bias=bias)
    single = FusedMoE(full, unquantized(), dev)
    single.load_weights(weights, correction_bias=bias)
    return layer, single


def _tokens(counts: list[int], dev: torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(counts), K, generator=gen).bfloat16()
    return x.to(dev), torch.randn(sum(counts), E, generator=gen).to(dev)


def _graph_replay_matches(rank: int, world: int, dev: torch.device) -> None:
    """Fixed slots at a bucket of 8 tokens per rank: captured once, replayed on other tokens."""
    layer, single = _layers(rank, world, dev, AllToAll(fixed_slots=True), 0)
    bucket = [8] * world
    static_x, static_logits = (t[8 * rank:8 * rank + 8].clone() for t in _tokens(bucket, dev, seed=8))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream: kernels compiled, tables on the device
        for _ in range(2):
            layer(static_x, static_logits)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = layer(static_x, static_logits)
    x, logits = _tokens(bucket, dev, seed=9)
    static_x.copy_(x[8 * rank:8 * rank + 8])
    static_logits.copy_(logits[8 * rank:8 * rank + 8])
    graph.replay()
    torch.cuda.synchronize()
    eager = layer(static_x, static_logits)
    assert torch.equal(static_out, eager), f"rank {rank}: graph replay differs from the eager call"
    want = single(x, logits)[8 * rank:8 * rank + 8]
    assert _rel(static_out, want) < 1e-2, f"rank {rank} graph replay: {_rel(static_out, want):.2e}"


def _compiled_matches_eager(rank: int, world: int, dev: torch.device) -> None:
    """Both all-to-all forms compile with fullgraph (the exchange inside the layer's custom op) and
    give the eager rows, three calls each; the fixed-slot form also under inductor's CUDA graphs
    ("reduce-overhead": warmed up, recorded, replayed). The exact-split form reads its split counts on
    the host, so no CUDA graph can hold it: compiled without graphs only."""
    x, logits = _tokens([8] * world, dev, seed=10)
    mine = slice(8 * rank, 8 * rank + 8)
    for mode, compile_modes in ((AllToAll(fixed_slots=True), ("default", "reduce-overhead")),
                                (AllToAll(), ("default",))):
        layer, _ = _layers(rank, world, dev, mode, 0)
        eager = layer(x[mine], logits[mine])
        for compile_mode in compile_modes:
            torch._dynamo.reset()
            compiled = torch.compile(layer, fullgraph=True, mode=compile_mode)
            for call in range(3):
                out = compiled(x[mine], logits[mine])
                assert torch.equal(out, eager), f"rank {rank} {mode} {compile_mode}, call {call}: differs from eager"


def _rank_main(rank: int, world: int, init_file: str) -> None:
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        counts = [13 if r % 2 == 0 else 0 for r in range(world)]  # odd ranks have no tokens of their own
        for mode, redundant in ((AllToAll(), 0), (AllToAll(), 2), (AllToAll(torch.float8_e4m3fn), 0)):
            layer, single = _layers(rank, world, dev, mode, redundant)
            x, logits = _tokens(counts, dev, seed=7)
            start = sum(counts[:rank])
            out = layer(x[start:start + counts[rank]], logits[start:start + counts[rank]])
            want = single(payload_roundtrip(x, mode.payload), logits)[start:start + counts[rank]]
            assert out.shape == want.shape
            if counts[rank]:
                assert _rel(out, want) < 1e-2, f"rank {rank} {mode} redundant={redundant}: {_rel(out, want):.2e}"

        _graph_replay_matches(rank, world, dev)
        _compiled_matches_eager(rank, world, dev)
        torch.cuda.synchronize()  # the graphs are gone: destroying the group with one alive hangs
    finally:
        dist.destroy_process_group()


@pytest.mark.device("cuda")
def test_nccl_all_to_all_graph_captured_and_compiled(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    os.environ.update(NCCL_ENV)
    mp.spawn(_rank_main, args=(2, str(tmp_path / "init")), nprocs=2, join=True)
