"""Act-order (GPTQ desc_act) WNA16 weights on the Triton experts against moe-core's fp32 reference:
one grouping per expert, and gate and up rows grouped apart (GPTQ producers calibrate each Linear
on its own), through both GEMM1 paths, the one-token direct launches, K-splits, expert parallelism,
biases and weights on the input. On a machine without a GPU the kernels run under TRITON_INTERPRET=1.
"""

import pytest
import torch
from _quant_support import DEV, DEVICE, RUN_ON, rel_l2

from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.quant import MoEQuantConfig, int4_w4a16, int8_w8a16
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton.act_order import permute_pair_rows, permute_pair_rows_torch
from moe_triton.configs import GemmConfig, QuantKernelConfig
from moe_triton.quantized import TritonWna16Experts


def act_order_weights(cfg: MoEConfig, quant: MoEQuantConfig, seed: int, halves_apart: bool) -> ExpertWeights:
    """Act-order weights of `cfg`'s shape, each expert's groups in shuffled positions; `halves_apart`:
    gate and up rows each with their own permutation (w13_g_idx [E, 2, K])."""
    gen = torch.Generator().manual_seed(seed)
    E, K, N, g = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size_per_partition, quant.weight.group_size

    def groupings(k: int, count: int) -> torch.Tensor:
        return (torch.stack([torch.randperm(k, generator=gen) for _ in range(count)]) // g).int()

    g13 = groupings(K, 2 * E).view(E, 2, K) if halves_apart else groupings(K, E)
    w13 = torch.randn(E, cfg.w13_rows, K, generator=gen) * K ** -0.5
    w2 = torch.randn(E, K, N, generator=gen) * N ** -0.5
    b13 = (torch.randn(E, cfg.w13_rows, generator=gen) * 0.1).to(cfg.dtype) if cfg.has_bias else None
    b2 = (torch.randn(E, K, generator=gen) * 0.1).to(cfg.dtype) if cfg.has_bias else None
    weights = ExpertWeights.from_float(w13, w2, quant, b13, b2, g_idx=(g13, groupings(N, E)), dtype=cfg.dtype)
    weights.validate(cfg, quant)
    return weights.to(DEV)


def run(quant, halves_apart: bool, dtype=torch.float16, activation=None, K=256, N=128, E=4, topk=2, M=7,
        bias=False, parallel=None, routing=None, override=None, seed=0):
    cfg = MoEConfig(num_experts=E, top_k=topk, hidden_size=K, intermediate_size=N,
                    activation=activation or Activation.silu(), routing=routing or Routing.softmax_topk(True),
                    dtype=dtype, parallel=parallel or ParallelConfig(), has_bias=bias)
    assert TritonWna16Experts.supports(cfg, quant, DEVICE), TritonWna16Experts.supports(cfg, quant, DEVICE).reason
    weights = act_order_weights(cfg, quant, seed, halves_apart)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    experts.config_override = override
    experts.load_weights(weights)
    perm = experts._packed()["w13_perm"]
    assert perm.shape == ((cfg.num_local_experts, 2, K) if halves_apart else (cfg.num_local_experts, K))
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(M, K, generator=gen).to(dtype).to(DEV)
    tw, ids = route_torch(torch.randn(M, E, generator=gen).to(DEV), cfg.routing, topk)
    out = experts.apply(x, tw, ids)
    ref = reference_moe(x, weights, cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert out.shape == (M, K) and out.dtype == dtype
    return out, ref


HALVES = [pytest.param(False, id="one-grouping"), pytest.param(True, id="gate-up-apart")]


_GATED_CASES = [
    (int4_w4a16(128, act_order=True), Activation.silu(), torch.float16),  # int4 quads
    (int4_w4a16(64, zero_point=True, act_order=True), Activation.gelu(), torch.bfloat16),
    (int4_w4a16(32, act_order=True), Activation.swiglu_oai(), torch.float16),
    (int8_w8a16(32, zero_point=True, act_order=True), Activation.silu(), torch.float16),
]


# A non-gated w13 has one half, so one grouping only.
@pytest.mark.parametrize(("quant", "activation", "dtype", "halves_apart"), [
    *((*case, halves_apart) for case in _GATED_CASES for halves_apart in (False, True)),
    (int4_w4a16(64, act_order=True), Activation.relu2(), torch.float16, False),
])
@pytest.mark.parametrize("M", [7, 1])  # 1: the direct launches, without alignment
def test_act_order_matches_reference(quant, activation, dtype, halves_apart, M):
    out, ref = run(quant, halves_apart, dtype, activation, M=M)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("halves_apart", HALVES)
@pytest.mark.parametrize("M", [5, 1])
def test_act_order_bias_expert_map_and_weight_on_input(halves_apart, M):
    out, ref = run(int4_w4a16(64, act_order=True), halves_apart, activation=Activation.swiglu_oai(), bias=True,
                   E=6, topk=3, M=M, parallel=ParallelConfig(ep_size=2, ep_rank=1))
    assert rel_l2(out, ref) < 1e-2
    out, ref = run(int4_w4a16(128, act_order=True), halves_apart, topk=1, M=M, routing=Routing.llama4())
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("halves_apart", HALVES)
@pytest.mark.parametrize(("M", "splits"), [(1, (2, 1)), (3, (2, 2)), (9, (2, 1))])
def test_act_order_split_gemm1(halves_apart, M, splits):
    """K-splits of GEMM1: last-arrival sums (one grouping, up to 8 tokens), atomic fp32 sums and the
    activation launch (gate and up apart, or more tokens)."""
    launch = QuantKernelConfig(GemmConfig(16, 64, splits[0], 4, 2, True), GemmConfig(16, 64, splits[1], 4, 2, True))
    out, ref = run(int4_w4a16(128, act_order=True), halves_apart, K=512, E=6, topk=3, M=M, bias=True,
                   parallel=ParallelConfig(ep_size=2, ep_rank=0), override=launch)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize("halves_apart", HALVES)
def test_act_order_routed_by_the_experts(halves_apart):
    """FusedMoE's call (`apply_monolithic`): gate and up apart, GEMM1 needs no last-arrival sums."""
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, dtype=torch.float16)
    quant = int4_w4a16(128, act_order=True)
    weights = act_order_weights(cfg, quant, seed=3, halves_apart=halves_apart)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    experts.load_weights(weights)
    experts.config_override = QuantKernelConfig(GemmConfig(16, 64, 2, 4, 2, True), GemmConfig(16, 64, 1, 4, 2, True))
    assert (experts._gemm1_sums_numel(1) == 0) == halves_apart
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, 256, generator=gen).to(torch.float16).to(DEV)
    logits = torch.randn(1, 4, generator=gen).to(DEV)
    tw, ids = route_torch(logits, cfg.routing, cfg.top_k)
    ref = reference_moe(x, weights, cfg, tw, ids, quant)
    assert rel_l2(experts.apply_monolithic(x, logits, None), ref) < 1e-2


def test_halves_that_agree_take_one_grouping():
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, dtype=torch.float16)
    quant = int4_w4a16(128, act_order=True)
    shared = act_order_weights(cfg, quant, seed=5, halves_apart=False)
    per_half = ExpertWeights(**{**shared.__dict__, "w13_g_idx": shared.w13_g_idx.unsqueeze(1).expand(-1, 2, -1)})
    packed = [TritonWna16Experts.weight_processor(w, cfg, DEV).tensors for w in (shared, per_half)]
    assert packed[0].keys() == packed[1].keys() and all(torch.equal(packed[0][k], packed[1][k]) for k in packed[0])
    assert packed[0]["w13_perm"].shape == (4, 256)


def test_uneven_groups_are_refused_at_load():
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, dtype=torch.float16)
    quant = int4_w4a16(128, act_order=True)
    weights = act_order_weights(cfg, quant, seed=6, halves_apart=True)
    uneven = weights.w13_g_idx.clone()
    uneven[:, 1, :3] = 0  # up's group 0 now holds more than 128 channels
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    with pytest.raises(ValueError, match="w13_g_idx: every scale group must hold exactly 128 input channels"):
        experts.load_weights(ExpertWeights(**{**weights.__dict__, "w13_g_idx": uneven}))


@pytest.mark.parametrize("pairs_per_row", [1, 3])
def test_permute_pair_rows_matches_its_twin(pairs_per_row):
    gen = torch.Generator().manual_seed(7)
    M, K, E = 5, 1100, 4  # K past one 1024-wide block
    x = torch.randn(M, K, generator=gen).to(torch.float16).to(DEV)
    perm = torch.stack([torch.randperm(K, generator=gen) for _ in range(E)]).to(torch.int32).to(DEV)
    expert = torch.randint(-1, E, (M * pairs_per_row,), generator=gen, dtype=torch.int32).to(DEV)
    out = permute_pair_rows(x, perm, expert, pairs_per_row)
    assert torch.equal(out, permute_pair_rows_torch(x, perm, expert, pairs_per_row))
    p = int((expert >= 0).nonzero()[0])
    assert torch.equal(out[p], x[p // pairs_per_row, perm[expert[p]].long()])
    assert not out[expert < 0].any()
