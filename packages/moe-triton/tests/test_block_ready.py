"""GEMM2 waiting for its own block of GEMM1's rows (`GemmConfig.block_ready`, `quant_gemm.BlockReady`):
GEMM1's counts per block, the layer against moe-core's fp32 reference with the option on, and the
refusals. Under the CPU interpreter the launches run one after the other, so the waits pass at once:
what these tests pin down is that GEMM1 counts every block GEMM2 will wait for, and no more."""

import dataclasses

import pytest
import torch
from _quant_support import DEV, RUN_ON, refuse_zeroing_launches, rel_l2, run_layer

from moe_core.config import Activation, MoEConfig, ParallelConfig
from moe_core.quant import int4_w4a16, int8_w8a16, mxfp4_w4a16
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton import quantized
from moe_triton.align import align_block_size
from moe_triton.configs import GemmConfig, QuantKernelConfig
from moe_triton.quant_gemm import BlockReady, block_count, grouped_quant_gemm, programs_per_block
from moe_triton.quantized import TritonMxfp4Experts, TritonWna16Experts


def _launch(split1: int = 1, split2: int = 1, block_m: int = 16, tail: int = 0, **gemm1) -> QuantKernelConfig:
    g1 = GemmConfig(block_m, 64, split1, 4, 2, True, tail=tail, **gemm1)
    g2 = GemmConfig(block_m, 64, split2, 4, 2, True, tail=tail, block_ready=True)
    return QuantKernelConfig(g1, g2)


@pytest.mark.parametrize(("block_m", "tail", "split"), [(16, 0, 1), (16, 0, 2), (32, 16, 1)])
def test_gemm1_counts_each_block_it_stores(block_m, tail, split):
    """Every block GEMM1 stores counts its programs (N tiles x K-splits), whichever program computed
    it (with tails, the block before takes in an expert's last few pairs); blocks past the padded
    total and another rank's experts count nothing; the last counter, the elements zeroed on the side."""
    cfg = MoEConfig(num_experts=6, top_k=3, hidden_size=256, intermediate_size=128, dtype=torch.float16,
                    parallel=ParallelConfig(ep_size=2, ep_rank=1))
    quant = int4_w4a16(64)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, quant, seed=3, device=DEV))
    w13 = experts._operand("w13", cfg.w13_rows, cfg.hidden_size)
    M, topk = 40, 3
    gen = torch.Generator().manual_seed(4)
    # Expert 3 takes 36 pairs (whole blocks and a short last one), the others (0-2 another rank's) fewer.
    others = torch.tensor([0, 1, 2, 4, 5])
    ids = torch.stack([torch.cat([torch.tensor([3]), others[torch.randperm(5, generator=gen)[:2]]]) if t < 36
                       else torch.randperm(6, generator=gen)[:3] for t in range(M)]).to(torch.int32).to(DEV)
    sorted_ids, expert_ids, num_post = align_block_size(ids, block_m, cfg.num_experts, experts.expert_map)
    gemm1 = GemmConfig(block_m, 64, split, 4, 2, True, tail=tail)
    blocks = block_count(M * topk, block_m, cfg.num_experts, direct=False)
    if tail:  # GEMM1 takes in a block: expert 3's last, of at most `tail` pairs, after a full one
        valid = [(sorted_ids[b * block_m:(b + 1) * block_m] < M * topk).sum().item() for b in range(blocks)]
        assert any(expert_ids[b] == expert_ids[b - 1] >= 0 and valid[b] <= tail for b in range(1, blocks))
    counts = torch.zeros(blocks + 1, dtype=torch.int32, device=DEV)
    side = torch.full((1000,), -1, dtype=torch.int32, device=DEV)
    sums = torch.zeros(M * topk, cfg.w13_rows, dtype=torch.float32, device=DEV)
    x = torch.randn(M, cfg.hidden_size, generator=gen).to(torch.float16).to(DEV)
    grouped_quant_gemm(x, w13, sums, sorted_ids, expert_ids, num_post, M * topk, gemm1, a_rows_div=topk,
                       atomic=split > 1, zero_side=side, ready=BlockReady(counts, wait=False))
    live = (torch.arange(blocks, device=DEV) * block_m < num_post) & (expert_ids[:blocks] >= 0)
    expected = torch.where(live, programs_per_block(w13, gemm1), 0)
    assert live.any() and not live.all()
    assert counts[:blocks].tolist() == expected.tolist()
    assert counts[blocks].item() == side.numel() and not side.any()


@pytest.mark.parametrize(("cls", "quant"), [(TritonWna16Experts, int4_w4a16(64)), (TritonWna16Experts, int8_w8a16(-1)),
                                           (TritonMxfp4Experts, mxfp4_w4a16())])
@pytest.mark.parametrize(("M", "launch"), [
    (1, _launch(2, 2)),  # direct launches: GEMM1 finished by last arrival, GEMM2's sums zeroed on its side
    (5, _launch(1, 2)),  # aligned, GEMM2's top-k sums finished by last arrival
    (8, _launch(2, 1, block_m=32, tail=16)),  # GEMM1 split and finished by last arrival; tails taken in
    (12, _launch(1, 2)),  # aligned, GEMM2's atomic sums cast after it
])
def test_layer_with_block_ready(monkeypatch, cls, quant, M, launch):
    """The layer with GEMM2 waiting per block matches the reference, another rank's experts among
    the choices; GEMM1 counts and GEMM2 waits on the same counters."""
    readies = []

    def spy_on(name: str):
        launch = getattr(quantized, name)

        def spy(*args, **kwargs):
            readies.append(kwargs.get("ready"))
            return launch(*args, **kwargs)
        return spy

    for name in ("grouped_quant_gemm", "direct_quant_gemm"):
        monkeypatch.setattr(quantized, name, spy_on(name))
    out, ref = run_layer(cls, quant, Activation.silu(), torch.bfloat16, K=256, N=128, E=6, topk=3, M=M, bias=True,
                         parallel=ParallelConfig(ep_size=2, ep_rank=1), override=launch)
    assert rel_l2(out, ref) < 1e-2
    count, wait = readies
    assert not count.wait and wait.wait and count.counts is wait.counts
    assert wait.per_block == 4 * launch.gemm1.split_k  # GEMM1's 256 rows in tiles of 64
    # GEMM2's fp32 sums [M, 256] zeroed by GEMM1 on the side, up to 8 tokens with an arrival count per 64 columns.
    assert wait.zeroed == M * 256 + (M * 4 if M <= quantized.LAST_ARRIVAL_MAX_TOKENS else 0)


def test_routing_launch_clears_the_block_counters(monkeypatch):
    """FusedMoE's call (`apply_monolithic`): the routing launch clears the counters with GEMM1's split
    sums (no zeroing launch of their own, made to fail here, though every new buffer holds garbage):
    after the call they hold exactly GEMM1's counts."""
    cfg = MoEConfig(num_experts=6, top_k=3, hidden_size=256, intermediate_size=128, dtype=torch.bfloat16)
    quant = int4_w4a16(128)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    weights = ExpertWeights.random(cfg, quant, seed=5, device=DEV)
    experts.load_weights(weights)
    experts.config_override = _launch(2, 2)
    M = 5
    assert experts._ready_numel(M) == block_count(M * 3, 16, 6, direct=False) + 1
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(M, 256, generator=gen).to(torch.bfloat16).to(DEV)
    logits = torch.randn(M, 6, generator=gen).to(DEV)

    cleared = []
    routing = quantized.route

    def route(*args, zero=None, **kwargs):
        cleared.append(zero)
        return routing(*args, zero=zero, **kwargs)

    monkeypatch.setattr(quantized, "route", route)
    refuse_zeroing_launches(monkeypatch)
    out = experts.apply_monolithic(x, logits, None)
    monkeypatch.undo()
    tw, ids = route_torch(logits, cfg.routing, cfg.top_k)
    assert rel_l2(out, reference_moe(x, weights.to(DEV), cfg, tw, ids, quant)) < 1e-2
    blocks = experts._ready_numel(M) - 1
    counts = cleared[0][experts._gemm1_sums_numel(M):].tolist()
    live = sum(-(-n // 16) for n in torch.bincount(ids.flatten(), minlength=6).tolist())  # blocks of 16 pairs
    per_block = 4 * 2  # GEMM1: 256 rows in tiles of 64, 2 K-splits
    assert sorted(counts[:blocks]) == [0] * (blocks - live) + [per_block] * live
    assert counts[blocks] == M * 256 + M * 4  # GEMM2's sums and arrival counts zeroed by GEMM1 on the side


def test_block_ready_where_it_changes_nothing():
    """Where a launch sits between the GEMMs (GEMM1's atomic split sums past LAST_ARRIVAL_MAX_TOKENS tokens,
    quantized by the activation launch) the option is idle: no counters."""
    cfg = MoEConfig(num_experts=6, top_k=3, hidden_size=256, intermediate_size=128, dtype=torch.bfloat16)
    experts = TritonWna16Experts(cfg, int4_w4a16(128), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, int4_w4a16(128), seed=5, device=DEV))
    experts.config_override = _launch(2, 1)
    assert experts._ready_numel(quantized.LAST_ARRIVAL_MAX_TOKENS) > 0
    assert experts._ready_numel(quantized.LAST_ARRIVAL_MAX_TOKENS + 1) == 0
    experts.config_override = _launch(1, 1)
    assert experts._ready_numel(quantized.LAST_ARRIVAL_MAX_TOKENS + 1) > 0


def test_block_ready_refusals():
    tl_dot = GemmConfig(16, 64, 1, 4, 2, True)
    waits = dataclasses.replace(tl_dot, block_ready=True)
    with pytest.raises(ValueError, match="block_ready is GEMM2's"):
        QuantKernelConfig(waits, tl_dot)
    with pytest.raises(ValueError, match="block_ready is GEMM2's"):
        QuantKernelConfig(GemmConfig(16, 64, 1, 4, 2, True, mma=True), waits)
    with pytest.raises(ValueError, match=r"block_ready is an option of the tl\.dot kernel"):
        GemmConfig(16, 64, 1, 4, 2, True, mma=True, block_ready=True)
    assert "block-ready" in str(QuantKernelConfig(tl_dot, waits))
    assert QuantKernelConfig.from_dict(QuantKernelConfig(tl_dot, waits).to_dict()).gemm2.block_ready
    w = _small_operand()
    x = torch.randn(2, w.k, dtype=torch.float16, device=DEV)
    ids = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32, device=DEV)
    sorted_ids, expert_ids, num_post = align_block_size(ids, 16, w.num_experts)
    out = torch.zeros(4, w.n, dtype=torch.float16, device=DEV)
    small = torch.zeros(2, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=r"BlockReady counts must be contiguous int32 >= 4 blocks \+ 1"):
        grouped_quant_gemm(x, w, out, sorted_ids, expert_ids, num_post, 4, tl_dot, a_rows_div=2,
                           ready=BlockReady(small, wait=False))
    counts = torch.zeros(8, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="cannot zero on the side"):
        grouped_quant_gemm(x, w, out, sorted_ids, expert_ids, num_post, 4, tl_dot, a_rows_div=2,
                           ready=BlockReady(counts, wait=True), zero_side=counts)


def _small_operand():
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128, dtype=torch.float16)
    experts = TritonWna16Experts(cfg, int4_w4a16(128), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, int4_w4a16(128), seed=1, device=DEV))
    return experts._operand("w13", cfg.w13_rows, cfg.hidden_size)


@pytest.mark.device("cuda")
@pytest.mark.parametrize(("cls", "quant"), [(TritonWna16Experts, int4_w4a16(128)), (TritonMxfp4Experts, mxfp4_w4a16())])
def test_block_ready_layer_on_gpu(cls, quant):
    """On the GPU, where GEMM2 starts while GEMM1 still runs (dependent launches) and so truly waits per
    block: FusedMoE with the option at 1-40 tokens, each call's counters cleared again (eager calls,
    then replays of one CUDA graph on new inputs), matches the reference every time."""
    from moe_core import FusedMoE

    cfg = MoEConfig(num_experts=64, top_k=8, hidden_size=1024, intermediate_size=512, dtype=torch.bfloat16)
    weights = ExpertWeights.random(cfg, quant, seed=7, device=DEV)
    gen = torch.Generator().manual_seed(8)
    for M, launch in ((1, _launch(2, 2)), (5, _launch(1, 2)), (8, _launch(2, 1)), (12, _launch(1, 2)),
                      (40, _launch(1, 1, block_m=32, tail=16))):
        layer = FusedMoE(cfg, quant, device="cuda", prefer="triton", cuda_graphs=False)
        layer.load_weights(weights)
        layer.experts.config_override = launch
        x = torch.empty(M, cfg.hidden_size, dtype=torch.bfloat16, device=DEV)
        logits = torch.empty(M, cfg.num_experts, device=DEV)

        def draw(x=x, logits=logits):
            """New inputs in place; their reference output."""
            x.copy_(torch.randn(x.shape, generator=gen).to(torch.bfloat16))
            logits.copy_(torch.randn(logits.shape, generator=gen))
            tw, ids = route_torch(logits, cfg.routing, cfg.top_k)
            return reference_moe(x, weights, cfg, tw, ids, quant)

        for _ in range(3):
            ref = draw()
            assert rel_l2(layer(x, logits), ref) < 1e-2, M
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(x, logits)
        for _ in range(3):
            ref = draw()
            graph.replay()
            assert rel_l2(out, ref) < 1e-2, M
