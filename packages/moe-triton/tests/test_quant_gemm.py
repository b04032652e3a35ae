"""The quantized GEMM kernels against their torch twin (`quant_gemm.quant_gemm_torch`): split-K,
swapped operands, narrow blocks, taken-in tails, every sink, the fused activation, and the Hopper
wgmma kernel (on a GPU; refused elsewhere).
"""

import dataclasses

import pytest
import torch
from _quant_support import (
    DEV,
    RUN_ON,
    garbage_buffers,
    gemm1_error,
    gemm1_operand,
    int4_bf16_layer,
    rel_l2,
    run_layer,
    wgmma_launch,
)

from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.quant import fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton._common.target import device_info, mma_capable, wgmma_capable
from moe_triton.align import align_block_size
from moe_triton.configs import GemmConfig, QuantKernelConfig
from moe_triton.quant_gemm import LastArrival, grouped_quant_gemm, quant_gemm_torch, zeroed_int32
from moe_triton.quant_gemm_details._layouts import GateUpInterleave
from moe_triton.quantized import GATE_UP_CHUNK, TritonFp8Experts, TritonMxfp4Experts, TritonWna16Experts


def test_zeroing_launch_clears_its_buffer(monkeypatch):
    """The zeroing before a split GEMM1 (a dependent launch, not a fill) clears every element of a
    buffer that held garbage, past the last whole block too."""
    monkeypatch.setattr(torch, "empty", lambda numel, dtype, device: torch.full((numel,), 0x5A5A5A5A, dtype=dtype,
                                                                                device=device))
    buf = zeroed_int32(2500, DEV)
    assert buf.shape == (2500,) and buf.dtype == torch.int32 and not buf.any()


def test_gemm1_with_the_activation_matches_twin():
    """The fused epilogue of one GEMM1 launch against the twin's pre-activation rows, de-interleaved
    and activated by the reference."""
    from moe_core.reference import apply_activation

    w = gemm1_operand(int4_w4a16(128), 256, seed=4)  # gated: rows interleaved by the processor
    act = Activation.gelu_tanh()
    M, topk = 5, 2
    ids = torch.randint(0, w.num_experts, (M, topk), dtype=torch.int32, device=DEV)
    x = torch.randn(M, w.k, dtype=torch.float16, device=DEV)
    launch = GemmConfig(16, 128, 1, 4, 2, True)
    sorted_ids, expert_ids, num_post = align_block_size(ids, launch.block_m, w.num_experts)
    out = torch.empty(M * topk, w.n // 2, dtype=torch.float32, device=DEV)
    grouped_quant_gemm(x, w, out, sorted_ids, expert_ids, num_post, M * topk, launch, a_rows_div=topk, activation=act,
             gate_up_chunk=GATE_UP_CHUNK)
    h = quant_gemm_torch(x, w, ids.flatten(), a_rows_div=topk)
    assert rel_l2(out, apply_activation(GateUpInterleave(GATE_UP_CHUNK).unswizzle(h), act)) < 1e-3
    with pytest.raises(ValueError, match="block_n divisible by 64"):
        grouped_quant_gemm(x, w, out, sorted_ids, expert_ids, num_post, M * topk, GemmConfig(16, 32, 1, 4, 2, True),
                 a_rows_div=topk, activation=act, gate_up_chunk=GATE_UP_CHUNK)
    with pytest.raises(ValueError, match="needs whole sums"):
        grouped_quant_gemm(x, w, out.new_zeros(M * topk, w.n), sorted_ids, expert_ids, num_post, M * topk,
                 dataclasses.replace(launch, split_k=2), a_rows_div=topk, activation=act, atomic=True,
                 gate_up_chunk=GATE_UP_CHUNK)


@pytest.mark.parametrize(("quant", "K", "split_k", "swap_ab", "block_n", "warps", "block_m"), [
    (int4_w4a16(32, zero_point=True), 256, 1, True, 64, 4, 16), (int4_w4a16(32, zero_point=True), 256, 2, True, 64, 4, 16),
    # 128-wide tiles in one scale group: scaled after the dots up to 16 x 128 outputs per tile, per weight above
    (int4_w4a16(128), 256, 1, True, 64, 4, 16), (int4_w4a16(128, zero_point=True), 256, 1, True, 64, 4, 32),
    (int4_w4a16(128, zero_point=True), 256, 1, True, 64, 4, 64),
    (int4_w4a16(128), 384, 4, True, 64, 4, 16),  # 3 K tiles in 4 splits: the last split is empty
    # splits of 3 and 2 K tiles scaled after their dots, each tile's scales loaded one tile ahead; per
    # channel, each split's sums scaled after its K loop (ROW_SCALE; int4's 16 x 128 tiles after their dots)
    (int4_w4a16(128), 640, 2, True, 64, 4, 16), (int8_w8a16(-1), 640, 2, True, 128, 4, 16),
    (int4_w4a16(-1), 256, 2, True, 64, 4, 32), (int4_w4a16(-1, zero_point=True), 256, 1, True, 128, 4, 16),
    (int4_w4a16(64), 256, 2, True, 512, 8, 16),  # wider than N: masked columns, as gpt-oss N=2880 has in 256 tiles
    # K = 192: grouped int4 pads it to two 128-wide quads tiles (as gpt-oss's 2880), per-channel int4
    # takes the halves layout's 64-wide tiles
    (int4_w4a16(64), 192, 1, True, 64, 4, 16), (int4_w4a16(64, zero_point=True), 192, 2, True, 128, 4, 16),
    (int4_w4a16(32, zero_point=True), 192, 1, True, 64, 4, 64), (int4_w4a16(-1), 192, 2, True, 64, 4, 16),
    (int4_w4a16(-1, zero_point=True), 192, 1, True, 128, 4, 32),
    # MXFP4 always takes the quads (K = 192 padded as int4's), quarter j in scale group j
    (mxfp4_w4a16(), 256, 1, True, 64, 4, 16), (mxfp4_w4a16(), 384, 4, True, 128, 4, 32),
    (mxfp4_w4a16(), 192, 2, True, 64, 8, 64),
    # int8 byte quads with K = 192 padded to two tiles: per channel (one scale row over the padded K,
    # scaled after the K loop), with zero points, and groups of 64
    (int8_w8a16(-1), 192, 1, True, 64, 4, 16), (int8_w8a16(-1), 192, 2, True, 128, 4, 64),
    (int8_w8a16(-1, zero_point=True), 192, 1, True, 64, 4, 32), (int8_w8a16(64, zero_point=True), 192, 2, True, 64, 4, 16),
])
def test_gemm_matches_twin(quant, K, split_k, swap_ab, block_n, warps, block_m):
    """GEMM1 kernel vs its twin on a layout-converted 4-bit or int8 operand: split-K (an empty split
    too), swapped operands, and scaled per weight, after the dots (`_heuristics.POST_SCALE_MAX_TILE`)
    or, per channel, after the K loop."""
    w = gemm1_operand(quant, K, seed=3)
    mxfp4, int8 = quant.weight.dtype.value == "fp4e2m1", quant.weight.dtype.value == "int8"
    assert w.quads == (mxfp4 or int8 or K % 128 == 0 or w.group < K)  # quads (padded), else int4 halves
    assert gemm1_error(w, GemmConfig(block_m, block_n, split_k, warps, 2, swap_ab)) < 1e-3


def _routed_counts_layer(counts, quant, launch: QuantKernelConfig, K=256, N=128, dtype=torch.float16, seed=3,
                         cls=TritonWna16Experts):
    """(layer output, fp32 reference) with top-1 routing that gives expert e exactly counts[e] tokens."""
    cfg = MoEConfig(num_experts=len(counts), top_k=1, hidden_size=K, intermediate_size=N, dtype=dtype)
    weights = ExpertWeights.random(cfg, quant, seed=seed, device=DEV)
    experts = cls(cfg, quant, RUN_ON)
    experts.config_override = launch
    experts.load_weights(weights)
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.cat([torch.full((n,), e, dtype=torch.int32) for e, n in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel(), generator=gen)].view(-1, 1).to(DEV)
    tw = (torch.rand(ids.shape, generator=gen) + 0.5).to(DEV)
    x = torch.randn(ids.shape[0], K, generator=gen).to(dtype).to(DEV)
    return experts.apply(x, tw, ids), reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))


@pytest.mark.parametrize(("quant", "swap_ab"), [(int4_w4a16(128), True), (int8_w8a16(-1), True),
                                               (fp8_w8a8("block"), False)])
def test_direct_blocks_of_many_pairs_per_expert(monkeypatch, quant, swap_ab):
    """A direct launch (no alignment, a block per pair) of many pairs per expert (20 of one expert, 1 and
    3 of two others, none of the fourth): as the reference, and as the aligned launch's blocks."""
    from moe_triton import quantized

    launch = QuantKernelConfig(GemmConfig(16, 64, 2, 4, 2, swap_ab), GemmConfig(16, 64, 1, 4, 2, swap_ab))
    cls = TritonFp8Experts if quant.weight.dtype.value == "fp8e4m3" else TritonWna16Experts
    counts = [20, 1, 0, 3]
    aligned, ref = _routed_counts_layer(counts, quant, launch, cls=cls)
    monkeypatch.setattr(quantized, "DIRECT_MAX_TOKENS", sum(counts))
    monkeypatch.setattr(quantized, "align_block_size", None)  # no alignment launch: calling it fails
    direct, _ = _routed_counts_layer(counts, quant, launch, cls=cls)
    assert rel_l2(direct, ref) < 2e-2
    torch.testing.assert_close(direct, aligned, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("quant", "block_m"), [(int4_w4a16(128, zero_point=True), 32), (int4_w4a16(64), 64),
                                                (mxfp4_w4a16(), 32)])
def test_narrow_blocks_match_reference(quant, block_m):
    """tl.dot kernel: a block with at most half its pairs valid runs its dots over that half (experts
    with half a block, one pair more, one pair, a whole block, one more and one and a half put
    blocks on both sides of that boundary): as the reference, and as whole blocks."""
    half = block_m // 2
    counts = [half, half + 1, 1, block_m, 0, block_m + 1, block_m + half, half - 1]
    whole = GemmConfig(block_m, 64, 1, 4, 2, swap_ab=True)
    cls = TritonWna16Experts if quant.weight.dtype.value == "int4" else TritonMxfp4Experts
    out, ref = _routed_counts_layer(counts, quant, QuantKernelConfig(whole, whole), cls=cls)
    narrow = dataclasses.replace(whole, narrow=True)
    narrowed, _ = _routed_counts_layer(counts, quant, QuantKernelConfig(narrow, narrow), cls=cls)
    assert rel_l2(narrowed, ref) < 1e-2
    torch.testing.assert_close(narrowed, out, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("cls", "quant", "swap_ab"), [(TritonFp8Experts, fp8_w8a8("block"), False),
                                                   (TritonWna16Experts, int4_w4a16(128), True)])
@pytest.mark.parametrize("group_m", [2, 3, 4])
def test_grouped_m_blocks_match_the_plain_launch(cls, quant, swap_ab, group_m):
    """GemmConfig.group_m renumbers the programs only. Every expert's count is one more than whole
    blocks, so all ten launched blocks hold pairs and the last group (3: one block, 4: two) is short
    and real: every (block, N tile) must run exactly once, as in the plain launch."""
    counts = [17, 33, 1, 49]
    plain = GemmConfig(16, 64, 1, 4, 2, swap_ab)
    grouped = dataclasses.replace(plain, group_m=group_m)
    out, ref = _routed_counts_layer(counts, quant, QuantKernelConfig(plain, plain), dtype=torch.bfloat16, cls=cls)
    out_grouped, _ = _routed_counts_layer(counts, quant, QuantKernelConfig(grouped, grouped), dtype=torch.bfloat16,
                                          cls=cls)
    assert rel_l2(out_grouped, ref) < 2e-2
    torch.testing.assert_close(out_grouped, out, rtol=0, atol=0)


@pytest.mark.parametrize(("cls", "quant", "swap_ab", "counts"), [
    (TritonFp8Experts, fp8_w8a8("block"), False, [1, 0, 0, 0]),  # one token: a direct launch
    (TritonWna16Experts, int4_w4a16(128), True, [2, 3, 0, 1]),  # 6 tokens: GEMM2 sums by last arrival
])
def test_grouped_m_blocks_in_m_first_launches(cls, quant, swap_ab, counts):
    """Direct and last-arrival launches put M blocks first by construction and keep that order with
    group_m: the layer runs, equal to the plain launch."""
    plain = GemmConfig(16, 64, 1, 4, 2, swap_ab)
    grouped = dataclasses.replace(plain, group_m=2)
    out, ref = _routed_counts_layer(counts, quant, QuantKernelConfig(plain, plain), dtype=torch.bfloat16, cls=cls)
    out_grouped, _ = _routed_counts_layer(counts, quant, QuantKernelConfig(grouped, grouped), dtype=torch.bfloat16,
                                          cls=cls)
    assert rel_l2(out_grouped, ref) < 2e-2
    torch.testing.assert_close(out_grouped, out, rtol=0, atol=0)


def test_group_m_limits():
    """1 is the plain order (the default, and the only one of the wgmma kernel); 0 means nothing."""
    assert GemmConfig(16, 64, 1, 4, 2).group_m == wgmma_launch(128, 256, 3).group_m == 1
    for bad in (dict(group_m=0), dict(group_m=2, wgmma=True)):
        with pytest.raises(ValueError, match=r"group_m is >= 1, and above 1 an option of the tl\.dot kernel"):
            dataclasses.replace(wgmma_launch(128, 256, 3), **{"wgmma": False, **bad})


def test_register_cap_limits_and_serialization():
    """max_registers: 0 (the compiler's choice, omitted from a file) or 32..255 on the tl.dot and mma
    kernels; the wgmma kernel plans its own registers. A capped launch runs (the cap is ptxas's, unseen by the
    interpreter) and its entry round-trips through a file's dict."""
    capped = GemmConfig(16, 64, 2, 4, 2, True, max_registers=168)
    launch = QuantKernelConfig(GemmConfig(16, 64, 2, 4, 2, True), capped)
    assert "max_registers" not in launch.to_dict()["gemm1"] and launch.to_dict()["gemm2"]["max_registers"] == 168
    assert QuantKernelConfig.from_dict(launch.to_dict()) == launch
    for bad in (dict(max_registers=16), dict(max_registers=256), dict(max_registers=168, wgmma=True)):
        with pytest.raises(ValueError, match=r"max_registers is 0 or 32\.\.255, an option of the tl\.dot and mma"):
            dataclasses.replace(wgmma_launch(128, 256, 3), **{"wgmma": False, **bad})
    out, ref = _routed_counts_layer([2, 1, 0, 1], int4_w4a16(128), launch, dtype=torch.bfloat16)
    assert rel_l2(out, ref) < 2e-2


def _layers_with_and_without(counts, quant, launch: GemmConfig, K: int, **change):
    """(output with `change` made to both GEMMs' launch, output of `launch` itself, fp32 reference)
    of a layer whose routing gives expert e exactly counts[e] tokens."""
    cls = TritonMxfp4Experts if quant.weight.dtype.value == "fp4e2m1" else TritonWna16Experts
    out, ref = _routed_counts_layer(counts, quant, QuantKernelConfig(launch, launch), K=K, cls=cls)
    changed = dataclasses.replace(launch, **change)
    out_changed, _ = _routed_counts_layer(counts, quant, QuantKernelConfig(changed, changed), K=K, cls=cls)
    return out_changed, out, ref


@pytest.mark.parametrize(("quant", "K", "split_k", "block_n", "tail"), [
    (int4_w4a16(128), 640, 2, 64, 0),  # scaled after the tile's dot, splits of 3 and 2 K tiles
    (int4_w4a16(32, zero_point=True), 256, 1, 64, 0),  # a scale group per quarter
    (int4_w4a16(64), 192, 2, 128, 0),  # K padded to whole tiles: the tile's last columns masked
    (int8_w8a16(-1), 192, 1, 64, 0), (int8_w8a16(32), 256, 1, 64, 16),  # byte quads, with a taken-in tail
    (mxfp4_w4a16(), 384, 2, 64, 0), (mxfp4_w4a16(), 192, 1, 64, 16),
])
def test_one_dot_tiles_match_the_quarters(quant, K, split_k, block_n, tail):
    """GemmConfig.one_dot: each quads K tile's four quarters joined in k order and multiplied by one
    dot, as the twin and as the four dots of the quarters (aligned launches, and a layer whose full
    blocks take in their experts' last pairs)."""
    one_dot = GemmConfig(16, block_n, split_k, 4, 2, True, one_dot=True)
    assert gemm1_error(gemm1_operand(quant, K, seed=5), one_dot) < 1e-3
    block_m = 32
    counts = [block_m + 1, block_m + 5, 3, 2 * block_m + tail] if tail else [block_m + 1, 5, 0, 17]
    quarters = GemmConfig(block_m, block_n, split_k, 4, 2, True, tail=tail)
    out_joined, out, ref = _layers_with_and_without(counts, quant, quarters, K, one_dot=True)
    assert rel_l2(out_joined, ref) < 1e-2
    torch.testing.assert_close(out_joined, out, rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match=r"one_dot is an option of the tl\.dot kernel"):
        dataclasses.replace(wgmma_launch(128, 256, 3), one_dot=True)


@pytest.mark.parametrize(("quant", "block_m", "row_scale", "post_scale"), [
    (int8_w8a16(-1), 16, True, 0), (int8_w8a16(-1), 32, True, 0),  # int8 per channel: after the K loop
    (int4_w4a16(-1), 16, False, 2),  # per-channel int4's 16 x 128 tiles: after each tile's dots
    (int4_w4a16(-1), 32, True, 0),
    (int4_w4a16(128), 16, False, 2), (int4_w4a16(128), 32, False, 0),  # groups: per tile, or per weight
])
def test_where_the_tl_dot_kernel_scales(monkeypatch, quant, block_m, row_scale, post_scale):
    """Which scaling a tl.dot launch takes: per-channel rows once after the K loop (ROW_SCALE), except
    per-channel int4's 16 x 128 tiles, which keep grouped int4's POST_SCALE."""
    from moe_triton import quant_gemm

    launched = {}

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.update(kwargs)

    monkeypatch.setattr(quant_gemm, "_moe_wgemm_kernel", Recorder())
    w = gemm1_operand(quant, 256, seed=13)
    assert w.quads
    gemm1_error(w, GemmConfig(block_m, 128, 1, 4, 2, True))
    assert (launched["ROW_SCALE"], launched["POST_SCALE"]) == (row_scale, post_scale)


@pytest.mark.parametrize(("quant", "K", "split_k", "one_dot"), [
    (int4_w4a16(64), 192, 1, False),  # a whole tile, then two quarters below K and two past it
    (int4_w4a16(64), 192, 2, True),  # the partial tile alone in the second split
    (mxfp4_w4a16(), 160, 2, False),  # one quarter below K
    (mxfp4_w4a16(), 96, 1, True),  # K below one tile: no whole tile
    (int8_w8a16(-1), 160, 1, False),  # per channel: scaled after the dots
])
def test_tl_dot_reads_no_activation_column_past_k(quant, K, split_k, one_dot):
    """With K padded to whole tiles, the last tile's activation columns past K read as zeros: NaN
    there (the tokens are a view of longer rows) leaves the output as the twin's."""
    w = gemm1_operand(quant, K, seed=9)
    assert w.k == K and w.k % w.block_k
    assert gemm1_error(w, GemmConfig(16, 64, split_k, 4, 2, True, one_dot=one_dot), past_k=float("nan")) < 1e-3


@pytest.mark.parametrize(("quant", "K", "block_m", "block_n"), [
    (int4_w4a16(64, zero_point=True), 192, 16, 128),  # two scale groups per K tile, K padded
    (int4_w4a16(32, scale_dtype="fp16"), 256, 32, 64),  # a group per quarter, fp16 scales
])
def test_scale_rows_read_in_pairs_or_one_by_one(quant, K, block_m, block_n):
    """int4 quads tiles with groups below the K tile, narrower than two 16-bit scales per thread, read
    their scale rows as int32 words of two (`SCALE_PAIRS`, where `WeightOperand.scale_rows_in_pairs`),
    or one by one from rows that do not allow it (here starting 2 bytes past a 4-byte boundary): the
    same outputs, as the twin's. int8 and int4 groups of 128 or more keep one by one."""
    from moe_triton.quant_gemm import _scale_pairs

    w = gemm1_operand(quant, K, seed=11)
    shifted = torch.empty(w.scale.numel() + 1, dtype=w.scale.dtype, device=DEV)[1:].view(w.scale.shape)
    shifted.copy_(w.scale)
    apart = dataclasses.replace(w, scale=shifted)
    launch = GemmConfig(block_m, block_n, 1, 4, 2, True)
    assert _scale_pairs(w, launch) and not _scale_pairs(apart, launch)
    for other in (int8_w8a16(32), int4_w4a16(128)):
        assert not _scale_pairs(gemm1_operand(other, 256, seed=11), launch)
    gen = torch.Generator().manual_seed(12)
    M, topk = 5, 2
    ids = torch.randint(0, w.num_experts, (M, topk), generator=gen, dtype=torch.int32).to(DEV)
    x = torch.randn(M, w.k, generator=gen).to(torch.float16).to(DEV)
    sorted_ids, expert_ids, num_post = align_block_size(ids, block_m, w.num_experts)
    paired, one_by_one = (torch.zeros(M * topk, w.n, dtype=torch.float32, device=DEV) for _ in range(2))
    for operand, out in ((w, paired), (apart, one_by_one)):
        grouped_quant_gemm(x, operand, out, sorted_ids, expert_ids, num_post, M * topk, launch, a_rows_div=topk,
                           atomic=True)
    assert torch.equal(paired, one_by_one)
    assert rel_l2(paired, quant_gemm_torch(x, w, ids.flatten(), a_rows_div=topk)) < 1e-3


@pytest.mark.parametrize(("quant", "K", "block_m", "tail", "narrow"), [
    (int4_w4a16(128, zero_point=True), 256, 32, 16, False),
    (int4_w4a16(64), 192, 64, 32, False),  # quarters of different scale groups, K padded to whole tiles
    (int4_w4a16(128), 256, 64, 16, True),
    (mxfp4_w4a16(), 192, 32, 16, True),
    (int8_w8a16(32), 256, 32, 16, True),  # byte quads; groups below the tile: scaled per weight with or without tails
    (int8_w8a16(64, zero_point=True), 256, 64, 32, False),
    # per channel: the block's and its tail's sums scaled after the K loop
    (int8_w8a16(-1, zero_point=True), 192, 32, 16, True), (int4_w4a16(-1), 256, 32, 16, False),
])
def test_tl_dot_tail_blocks_match_reference(quant, K, block_m, tail, narrow):
    """tl.dot kernel: a full block takes in its expert's last block when that holds at most `tail`
    pairs (experts with 1, tail and tail + 1 pairs past one or two full blocks, a lone short
    block, a lone full one, an empty one): as the reference, and as the launch without tails (with
    `narrow`, the blocks not taken in that hold at most half a block run narrow)."""
    counts = [block_m + 1, block_m + tail, block_m + tail + 1, 0, 2 * block_m + tail, 5, block_m, 2 * block_m + 1]
    plain = GemmConfig(block_m, 64, 1, 4, 2, swap_ab=True, narrow=narrow)
    taken, out, ref = _layers_with_and_without(counts, quant, plain, K, tail=tail)
    assert rel_l2(taken, ref) < 1e-2
    torch.testing.assert_close(taken, out, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("sink", ["atomic", "last_arrival"])
def test_tl_dot_tail_rows_reach_every_sink(sink):
    """A taken-in tail's rows go through the block's epilogue: split-K sums added atomically, or
    finished by their last contributor (two K-splits each), as the twin."""
    w = gemm1_operand(int4_w4a16(64, zero_point=True), 192, seed=7)
    counts = [48, 49, 1, 80]  # 32 + 16, one more, a lone pair, 64 + 16
    gen = torch.Generator().manual_seed(8)
    ids = torch.cat([torch.full((n,), e, dtype=torch.int32) for e, n in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel(), generator=gen)].to(DEV)
    P = ids.numel()
    x = torch.randn(P, w.k, generator=gen).to(torch.float16).to(DEV)
    sorted_ids, expert_ids, num_post = align_block_size(ids.view(-1, 1), 32, w.num_experts)
    launch = GemmConfig(32, 64, 2, 4, 2, swap_ab=True, tail=16)
    sums = torch.zeros(P, w.n, dtype=torch.float32, device=DEV)
    if sink == "atomic":
        grouped_quant_gemm(x, w, sums, sorted_ids, expert_ids, num_post, P, launch, atomic=True)
        out = sums
    else:
        out = torch.empty(P, w.n, dtype=torch.float16, device=DEV)
        arrivals = zeroed_int32(P * -(-w.n // launch.block_n), DEV)
        grouped_quant_gemm(x, w, sums, sorted_ids, expert_ids, num_post, P, launch, last_arrival=LastArrival(out, arrivals))
    assert rel_l2(out, quant_gemm_torch(x, w, ids)) < 2e-3


def test_tl_dot_tail_refuses_other_weights():
    w = gemm1_operand(int4_w4a16(-1), 192, seed=1)  # per channel, K = 192: the halves layout
    ids = torch.zeros(40, 1, dtype=torch.int32, device=DEV)
    sorted_ids, expert_ids, num_post = align_block_size(ids, 32, w.num_experts)
    out = torch.zeros(40, w.n, dtype=torch.float32, device=DEV)
    with pytest.raises(ValueError, match=r"taken-in tails \(GemmConfig.tail\) are an option of weights in a quads "
                                         r"layout, got INT4 torch.uint8"):
        grouped_quant_gemm(torch.randn(40, 192, device=DEV).half(), w, out, sorted_ids, expert_ids, num_post, 40,
                 GemmConfig(32, 64, 1, 4, 2, swap_ab=True, tail=16), atomic=True)


@pytest.mark.parametrize("kernel", ["tl.dot", "wgmma", "mma"])
def test_mxfp4_scales_above_two_take_two_factors(kernel):
    """An MXFP4 tensor with an e8m0 scale above 2^1 (here w2's, up to 2^4) cannot fold 2^126 into one
    bf16 factor: the processor marks it, and its GEMM scales each weight by two factors, exactly as
    the reference (w13 keeps the folded scale); on a Hopper GPU on the wgmma kernel too, and on an
    NVIDIA GPU on the mma kernel (two tokens: its decode-size launches)."""
    if kernel == "wgmma" and not wgmma_capable(DEV):
        pytest.skip("the wgmma kernel needs an NVIDIA Hopper GPU")
    if kernel == "mma" and not mma_capable(device_info(DEV)):
        pytest.skip("the mma kernel needs an NVIDIA GPU of sm_80 or later, compiled")
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, dtype=torch.bfloat16)
    quant = mxfp4_w4a16()
    weights = ExpertWeights.random(cfg, quant, seed=6, device=DEV)
    big = weights.w2_scale.clone()
    big[:, ::3, 1::2] = torch.randint(129, 132, big[:, ::3, 1::2].shape, dtype=torch.uint8)
    weights = dataclasses.replace(weights, w2_scale=big)
    experts = TritonMxfp4Experts(cfg, quant, RUN_ON)
    experts.load_weights(weights)
    assert experts._operand("w13", 256, 256).folded_scale and not experts._operand("w2", 256, 128).folded_scale
    if kernel == "wgmma":
        experts.config_override = QuantKernelConfig(wgmma_launch(64, 128, 3), wgmma_launch(64, 128, 3))
    if kernel == "mma":
        experts.config_override = QuantKernelConfig(mma_launch(64, 1), mma_launch(64, 1))
    tokens = 2 if kernel == "mma" else 24
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(tokens, 256, generator=gen).to(torch.bfloat16).to(DEV)
    tw, ids = route_torch(torch.randn(tokens, 4, generator=gen).to(DEV), cfg.routing, 2)
    ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert rel_l2(experts.apply(x, tw, ids), ref) < 1e-2


def test_wgmma_gemm_is_refused_off_hopper():
    """On CPU (and any GPU but sm_90) a forced wgmma launch fails with the reason."""
    if wgmma_capable(DEV):
        pytest.skip("this GPU runs the wgmma kernel")
    experts, _, x, tw, ids = int4_bf16_layer(3)
    experts.config_override = QuantKernelConfig(wgmma_launch(64, 128, 3), wgmma_launch(64, 128, 3))
    with pytest.raises(ValueError, match="needs an NVIDIA Hopper GPU"):
        experts.apply(x, tw, ids)


@pytest.mark.device("cuda")
@pytest.mark.parametrize(("quant", "dtype", "K", "N", "activation", "bias", "M", "launch"), [
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 512,
                 QuantKernelConfig(wgmma_launch(64, 128, 4), wgmma_launch(64, 128, 4)), id="g128-silu-64x128"),
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 2048,
                 QuantKernelConfig(wgmma_launch(128, 256, 3), wgmma_launch(128, 256, 3)), id="g128-silu-128x256"),
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 700,
                 QuantKernelConfig(wgmma_launch(128, 256, 4), wgmma_launch(128, 128, 4)), id="g128-128x256-128x128"),
    pytest.param(int4_w4a16(64, zero_point=True), torch.bfloat16, 2880, 2880, Activation.swiglu_oai(), True, 300,
                 QuantKernelConfig(wgmma_launch(128, 128, 3), wgmma_launch(128, 256, 3)), id="g64-zp-bias-k-tail"),
    pytest.param(int4_w4a16(32), torch.float16, 1024, 512, Activation.gelu(), False, 300,
                 QuantKernelConfig(wgmma_launch(64, 256, 4, split=2), wgmma_launch(64, 128, 3, split=2)), id="g32-fp16-split"),
    pytest.param(int4_w4a16(-1, zero_point=True), torch.float16, 1024, 512, Activation.relu2(), False, 200,
                 QuantKernelConfig(wgmma_launch(16, 128, 3), wgmma_launch(16, 256, 3)), id="channel-zp-relu2"),
    pytest.param(int4_w4a16(-1), torch.bfloat16, 2048, 768, Activation.silu(), False, 600,
                 QuantKernelConfig(dataclasses.replace(wgmma_launch(128, 256, 4), tail=16),
                                   wgmma_launch(128, 128, 4, split=2)), id="channel-tail-split"),
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 400,
                 QuantKernelConfig(wgmma_launch(64, 128, 4), GemmConfig(64, 256, 1, 4, 3, True)), id="gemm1-only"),
    # the epilogue's three sigmoid activations: SiLU above, SwiGLU (gpt-oss) below, GELU-tanh here
    pytest.param(int4_w4a16(128), torch.bfloat16, 1024, 512, Activation.gelu_tanh(), False, 600,
                 QuantKernelConfig(dataclasses.replace(wgmma_launch(128, 256, 3), tail=16), wgmma_launch(128, 256, 3)),
                 id="gelu-tanh-tail"),
    # MXFP4 (gpt-oss's shape: K padded to whole tiles, clamped SwiGLU with biases), quarter j in scale group j
    pytest.param(mxfp4_w4a16(), torch.bfloat16, 2880, 2880, Activation.swiglu_oai(), True, 300,
                 QuantKernelConfig(wgmma_launch(128, 256, 3), wgmma_launch(128, 256, 3)), id="mxfp4-gpt-oss-folded"),
    pytest.param(mxfp4_w4a16(), torch.bfloat16, 1024, 512, Activation.silu(), False, 300,
                 QuantKernelConfig(dataclasses.replace(wgmma_launch(128, 256, 3), tail=16),
                                   wgmma_launch(128, 128, 4, split=2)), id="mxfp4-tail-split"),
    pytest.param(mxfp4_w4a16(), torch.float16, 1024, 512, Activation.gelu(), False, 200,
                 QuantKernelConfig(wgmma_launch(64, 256, 3), wgmma_launch(64, 128, 3)), id="mxfp4-fp16"),
    # int8 in int32 words (byte quads): per-channel scales (the common checkpoint), groups with zero
    # points, fp16, a split and a taken-in tail
    pytest.param(int8_w8a16(-1), torch.bfloat16, 2048, 768, Activation.silu(), False, 2048,
                 QuantKernelConfig(wgmma_launch(128, 256, 3), wgmma_launch(128, 256, 3)), id="int8-channel-128x256"),
    pytest.param(int8_w8a16(-1), torch.bfloat16, 2048, 768, Activation.silu(), False, 512,
                 QuantKernelConfig(wgmma_launch(64, 128, 3), wgmma_launch(64, 256, 3, split=2)), id="int8-channel-split"),
    pytest.param(int8_w8a16(32, zero_point=True), torch.float16, 1024, 512, Activation.gelu(), False, 300,
                 QuantKernelConfig(dataclasses.replace(wgmma_launch(128, 128, 3), tail=16), wgmma_launch(128, 128, 3)),
                 id="int8-g32-zp-fp16-tail"),
    # gpt-oss's shape per channel: K padded to whole byte quads tiles, one scale row over them (ROW_SCALE)
    pytest.param(int8_w8a16(-1), torch.bfloat16, 2880, 2880, Activation.swiglu_oai(), True, 300,
                 QuantKernelConfig(wgmma_launch(128, 256, 3), wgmma_launch(128, 256, 3, split=2)),
                 id="int8-channel-gpt-oss-k-padded"),
])
def test_wgmma_gemm_on_gpu(quant, dtype, K, N, activation, bias, M, launch):
    cls = TritonMxfp4Experts if quant.weight.dtype.value == "fp4e2m1" else TritonWna16Experts
    out, ref = run_layer(cls, quant, activation, dtype, K=K, N=N, E=16, topk=4, M=M, bias=bias, override=launch)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.device("cuda")
def test_wgmma_narrow_and_full_blocks_on_gpu():
    """128-pair blocks run their MMAs over 64 rows when at most 64 are valid (an expert's last block):
    experts with exactly 64, 65, 128, 129 and 1 pairs put blocks on both sides of that boundary."""
    counts = [64, 65, 1, 128, 129, 0, 192, 63]
    launch = QuantKernelConfig(wgmma_launch(128, 256, 3), wgmma_launch(128, 128, 4))
    out, ref = _routed_counts_layer(counts, int4_w4a16(128), launch, K=1024, N=512, dtype=torch.bfloat16)
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.device("cuda")
@pytest.mark.parametrize("tail", [8, 16])
def test_wgmma_tail_blocks_on_gpu(tail):
    """A full block takes in its expert's last block when that holds at most `tail` pairs: experts
    with 1, tail and tail + 1 pairs past one or two full blocks, a lone short block, an expert with
    none between; as the reference and as the launch without it."""
    counts = [129, 128 + tail, 129 + tail, 0, 256 + tail, 5, 128, 257, 128 + tail // 2]
    plain = QuantKernelConfig(wgmma_launch(128, 256, 3), wgmma_launch(128, 128, 4))
    taking = QuantKernelConfig(dataclasses.replace(plain.gemm1, tail=tail), dataclasses.replace(plain.gemm2, tail=tail))
    out, ref = _routed_counts_layer(counts, int4_w4a16(128), taking, K=1024, N=512, dtype=torch.bfloat16)
    assert rel_l2(out, ref) < 1e-2
    whole, _ = _routed_counts_layer(counts, int4_w4a16(128), plain, K=1024, N=512, dtype=torch.bfloat16)
    torch.testing.assert_close(out, whole, rtol=1e-3, atol=1e-3)


@pytest.mark.device("cuda")
def test_wgmma_gemm_with_expert_parallel_on_gpu():
    out, ref = run_layer(TritonWna16Experts, int4_w4a16(128), Activation.silu(), torch.bfloat16, K=1024, N=512, E=16,
                    topk=4, M=300, parallel=ParallelConfig(ep_size=2, ep_rank=1),
                    override=QuantKernelConfig(wgmma_launch(64, 128, 3), wgmma_launch(64, 128, 3)))
    assert rel_l2(out, ref) < 1e-2


def mma_launch(block_n: int, split: int, warps: int = 4) -> GemmConfig:
    return GemmConfig(16, block_n, split, warps, 1, swap_ab=True, mma=True)


def test_mma_config_limits():
    """GemmConfig.mma: 16 rows per warp at least, and none of the other kernels' options but a register
    cap; its own options (own_route, scales_in_tile) on it only. Back on the tl.dot kernel (`on_tl_dot`)
    a tile drops them and the cap set for the mma build; a tl.dot tile keeps its own cap."""
    mma_launch(64, 4)
    with pytest.raises(ValueError, match="multiple of 16 x num_warps"):
        mma_launch(64, 4, warps=8)
    for other in (dict(one_dot=True), dict(wgmma=True), dict(tail=16, block_m=32)):
        with pytest.raises(ValueError, match="the mma kernel takes none of"):
            dataclasses.replace(mma_launch(64, 2), **other)
    dataclasses.replace(mma_launch(64, 2), own_route=True, scales_in_tile=True, max_registers=96)
    for option in (dict(own_route=True), dict(scales_in_tile=True)):
        with pytest.raises(ValueError, match="own_route and scales_in_tile are options of the mma kernel"):
            GemmConfig(16, 64, 2, 4, 3, swap_ab=True, **option)
    capped = dataclasses.replace(mma_launch(64, 2), own_route=True, max_registers=96)
    assert capped.on_tl_dot() == GemmConfig(16, 64, 2, 4, 1, swap_ab=True)
    tl_dot = GemmConfig(16, 64, 2, 4, 3, swap_ab=True, max_registers=168)
    assert tl_dot.on_tl_dot() == tl_dot


@pytest.mark.parametrize(("routing", "bias", "parallel", "ranks"), [
    (Routing.softmax_topk(True), False, None, True),
    (Routing.softmax_topk(False), False, None, True),
    (Routing.sigmoid_topk(True), False, None, False),  # sigmoid saturates: equal scores the logits rank apart
    (Routing.deepseek_v3(num_expert_groups=2, topk_groups=1), True, None, False),
    (Routing.softmax_topk(True), False, ParallelConfig(ep_size=2, ep_rank=0), False),
])
def test_gemm1_ranks_its_pairs_experts_only_where_the_logits_rank_them(routing, bias, parallel, ranks):
    """`GemmConfig.own_route` takes effect where the routing's top-k are the logits' (a softmax over
    ungrouped experts, no correction bias) and every expert is this rank's."""
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128, dtype=torch.bfloat16,
                    routing=routing, parallel=parallel or ParallelConfig())
    experts = TritonWna16Experts(cfg, int4_w4a16(128), RUN_ON)
    assert (not bias and experts._ranks_by_logit) is ranks


def test_mma_gemm_is_refused_where_it_cannot_run():
    """A forced mma launch fails with the reason: on CPU (the interpreter) for want of a GPU, anywhere for
    weights it does not take (int8 in groups of 96: byte quads, but no scale group the kernel indexes;
    fp8) and for a split of more K tiles than its programs unroll."""
    experts, _, x, tw, ids = int4_bf16_layer(3)
    experts.config_override = QuantKernelConfig(mma_launch(64, 2), mma_launch(64, 2))
    if DEV.type != "cuda":
        with pytest.raises(ValueError, match="needs an NVIDIA GPU of sm_80 or later"):
            experts.apply(x[:1], tw[:1], ids[:1])
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=384, intermediate_size=384, dtype=torch.bfloat16)
    x384 = torch.randn(1, 384, dtype=torch.bfloat16, device=DEV)
    for cls, quant in ((TritonWna16Experts, int8_w8a16(96)), (TritonFp8Experts, fp8_w8a8())):
        layer = cls(cfg, quant, RUN_ON)
        layer.load_weights(ExpertWeights.random(cfg, quant, seed=3, device=DEV))
        layer.config_override = experts.config_override
        with pytest.raises(ValueError, match=r"needs .*int4, int8 or MXFP4 weights in a quads layout"):
            layer.apply(x384, tw[:1], ids[:1])
    wide = MoEConfig(num_experts=4, top_k=2, hidden_size=2048, intermediate_size=128, dtype=torch.bfloat16)
    layer = TritonWna16Experts(wide, int4_w4a16(128), RUN_ON)
    layer.load_weights(ExpertWeights.random(wide, int4_w4a16(128), seed=3, device=DEV))
    layer.config_override = QuantKernelConfig(mma_launch(64, 1), mma_launch(64, 1))
    x2048 = torch.randn(1, 2048, dtype=torch.bfloat16, device=DEV)
    ids01 = torch.tensor([[0, 1]], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=r"at most 8 K tiles per split, got 16 \(16 tiles in 1 splits\)"):
        layer.apply(x2048, torch.full((1, 2), 0.5, device=DEV), ids01)


@pytest.mark.parametrize(("quant", "hidden"), [
    pytest.param(int4_w4a16(128), 1152, id="int4-g128"),
    pytest.param(int4_w4a16(64, zero_point=True), 2880, id="int4-g64-zp"),
    pytest.param(int4_w4a16(-1), 2880, id="int4-channel-k-padded"),
    pytest.param(int8_w8a16(-1), 2880, id="int8-channel-k-padded"),
    pytest.param(int8_w8a16(128), 1152, id="int8-g128"),
    pytest.param(int8_w8a16(96), 2880, id="int8-g96"),
    pytest.param(mxfp4_w4a16(), 2880, id="mxfp4"),
    pytest.param(fp8_w8a8(), 2880, id="fp8"),
])
def test_layer_and_launcher_agree_on_what_the_mma_kernel_takes(quant, hidden, monkeypatch):
    """The layer decides from its quantization key (before any weights) whether an entry's mma GEMM
    runs (`_mma_serves`); the launcher checks the operand it gets (`quant_gemm.mma_takes`): for both
    GEMMs (GEMM1's K = hidden, padded to whole tiles where 128 does not divide it; GEMM2's 384) they agree."""
    from moe_triton import quantized
    from moe_triton.quant_gemm import mma_takes

    monkeypatch.setattr(quantized, "mma_capable", lambda device: True)
    cls = {"fp4e2m1": TritonMxfp4Experts, "fp8e4m3": TritonFp8Experts}.get(quant.weight.dtype.value, TritonWna16Experts)
    cfg = MoEConfig(num_experts=2, top_k=1, hidden_size=hidden, intermediate_size=384, dtype=torch.bfloat16)
    layer = cls(cfg, quant, RUN_ON)
    layer.load_weights(ExpertWeights.random(cfg, quant, seed=0, device=DEV))
    for name, rows, cols in (("w13", cfg.w13_rows, hidden), ("w2", hidden, 384)):
        w = layer._operand(name, rows, cols)
        assert layer._mma_serves(cols) == mma_takes(w.wtype, w.quads, w.block_k, w.group), name


@pytest.mark.parametrize("quant", [int4_w4a16(64, zero_point=True), mxfp4_w4a16(), int8_w8a16(-1)],
                         ids=["int4-g64-zp", "mxfp4", "int8-channel"])
def test_mma_scale_rows_copied_only_in_whole_pieces(quant):
    """The mma kernel copies a tile's scale rows with its words (`STAGED_SCALES`) only where N and the
    scale strides are multiples of 16 elements (`WeightOperand.scale_rows_in_pieces`: 16-byte pieces
    Triton can prove aligned), as every layer's operands are (gpt-oss-120b's shapes here); rows strided
    otherwise (a launcher's caller may pass any) are loaded in the tile. A per-channel row is read once
    either way."""
    cls = TritonMxfp4Experts if quant.weight.dtype is mxfp4_w4a16().weight.dtype else TritonWna16Experts
    cfg = MoEConfig(num_experts=2, top_k=1, hidden_size=2880, intermediate_size=2880, dtype=torch.bfloat16)
    layer = cls(cfg, quant, RUN_ON)
    layer.load_weights(ExpertWeights.random(cfg, quant, seed=0, device=DEV))
    for w in (layer._operand("w13", cfg.w13_rows, 2880), layer._operand("w2", 2880, 2880)):
        assert w.scale_rows_in_pieces
        # The same scales in rows padded by 8 elements: strides no longer multiples of 16.
        padded = torch.zeros(*w.scale.shape[:2], w.scale.shape[2] + 8, dtype=w.scale.dtype, device=w.scale.device)
        padded[..., :w.n] = w.scale
        strided = dataclasses.replace(w, scale=padded[..., :w.n], zero=None)
        per_channel = w.scale.shape[1] == 1
        assert strided.scale_rows_in_pieces is per_channel


@pytest.mark.device("cuda")
@pytest.mark.parametrize(("quant", "dtype", "K", "N", "activation", "bias", "M", "launch", "parallel"), [
    # int8 byte quads: per channel (qwen3-30b-a3b's one-token shapes), zero points in groups of 128 at
    # two tokens, per channel with K padded and a ragged N in fp16, aligned blocks
    pytest.param(int8_w8a16(-1), torch.bfloat16, 2048, 768, Activation.silu(), False, 1,
                 QuantKernelConfig(mma_launch(64, 4), mma_launch(128, 3, warps=8)), None, id="int8-channel-1"),
    pytest.param(int8_w8a16(128, zero_point=True), torch.bfloat16, 1024, 512, Activation.silu(), False, 2,
                 QuantKernelConfig(mma_launch(64, 2), mma_launch(64, 2)), None, id="int8-g128-zp-2"),
    pytest.param(int8_w8a16(-1), torch.float16, 2880, 2880, Activation.swiglu_oai(), True, 1,
                 QuantKernelConfig(mma_launch(64, 3), mma_launch(128, 4)), None, id="int8-channel-fp16-k-tail"),
    pytest.param(int8_w8a16(-1), torch.bfloat16, 2048, 768, Activation.silu(), False, 8,
                 QuantKernelConfig(mma_launch(128, 2), mma_launch(64, 3)), None, id="int8-blocks-8"),
    # MXFP4: gpt-oss's shapes (biases, SwiGLU, K padded, N ragged) direct and over blocks, fp16
    pytest.param(mxfp4_w4a16(), torch.bfloat16, 2880, 2880, Activation.swiglu_oai(), True, 1,
                 QuantKernelConfig(mma_launch(64, 3), mma_launch(128, 4)), None, id="mxfp4-gpt-oss-1"),
    pytest.param(mxfp4_w4a16(), torch.bfloat16, 2880, 2880, Activation.swiglu_oai(), True, 2,
                 QuantKernelConfig(mma_launch(128, 4, warps=8), mma_launch(64, 6)), None, id="mxfp4-gpt-oss-2"),
    pytest.param(mxfp4_w4a16(), torch.float16, 2048, 768, Activation.silu(), False, 8,
                 QuantKernelConfig(mma_launch(128, 2), mma_launch(64, 3)), None, id="mxfp4-fp16-blocks-8"),
    # qwen3-30b-a3b's one-token shapes: GEMM1 4 tiles per split, GEMM2 2 (weights asked for before its wait)
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 1,
                 QuantKernelConfig(mma_launch(64, 4), mma_launch(128, 3, warps=8)), None, id="g128-silu-1"),
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 2,
                 QuantKernelConfig(mma_launch(128, 2), mma_launch(64, 6)), None, id="g128-silu-2"),
    # gpt-oss's: zero points in groups of 64, biases, K padded to whole tiles, GEMM2's N (2880) not a multiple of 128
    pytest.param(int4_w4a16(64, zero_point=True), torch.bfloat16, 2880, 2880, Activation.swiglu_oai(), True, 2,
                 QuantKernelConfig(mma_launch(64, 3), mma_launch(128, 4)), None, id="g64-zp-bias-k-tail"),
    # groups of 32 in fp16; one split (GEMM1 still finishes by last arrival); per-channel zero points
    pytest.param(int4_w4a16(32), torch.float16, 1024, 512, Activation.gelu(), False, 1,
                 QuantKernelConfig(mma_launch(64, 1), mma_launch(64, 2)), None, id="g32-fp16-one-split"),
    pytest.param(int4_w4a16(-1, zero_point=True), torch.float16, 1024, 512, Activation.silu(), False, 2,
                 QuantKernelConfig(mma_launch(128, 2, warps=8), mma_launch(64, 1)), None, id="channel-zp"),
    # another rank's experts: pairs counted, not multiplied
    pytest.param(int4_w4a16(128), torch.bfloat16, 1024, 512, Activation.silu(), False, 2,
                 QuantKernelConfig(mma_launch(64, 2), mma_launch(64, 2)), ParallelConfig(ep_size=2, ep_rank=1),
                 id="expert-parallel"),
    # aligned blocks of 16 and 32 pairs (several per expert, padding columns), last arrivals of a vector of rows
    pytest.param(int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 8,
                 QuantKernelConfig(mma_launch(128, 2), mma_launch(64, 3)), None, id="blocks-g128-8"),
    pytest.param(int4_w4a16(64, zero_point=True), torch.bfloat16, 2880, 2880, Activation.swiglu_oai(), True, 7,
                 QuantKernelConfig(dataclasses.replace(mma_launch(64, 3), block_m=32),
                                   dataclasses.replace(mma_launch(128, 4, warps=8), block_m=32)),
                 None, id="blocks-g64-zp-bias-k-tail"),
    pytest.param(int4_w4a16(128), torch.bfloat16, 1024, 512, Activation.silu(), False, 8,
                 QuantKernelConfig(mma_launch(64, 1), mma_launch(64, 2)), ParallelConfig(ep_size=2, ep_rank=0),
                 id="blocks-expert-parallel"),
])
def test_mma_gemm_on_gpu(quant, dtype, K, N, activation, bias, M, launch, parallel):
    """Decode-size launches on the mma kernel (direct up to 2 tokens, aligned blocks above), against
    the reference, as close to it as the tl.dot kernel's launch of the same shapes (which rounds each
    scaled weight to 16 bits, where this kernel scales the fp32 sums of int4 and int8)."""
    cls = TritonMxfp4Experts if quant.weight.dtype is mxfp4_w4a16().weight.dtype else TritonWna16Experts
    out, ref = run_layer(cls, quant, activation, dtype, K=K, N=N, E=16, topk=4, M=M, bias=bias,
                         override=launch, parallel=parallel)
    plain = QuantKernelConfig(*(dataclasses.replace(g, mma=False, num_stages=2) for g in (launch.gemm1, launch.gemm2)))
    tl_dot, _ = run_layer(cls, quant, activation, dtype, K=K, N=N, E=16, topk=4, M=M, bias=bias,
                          override=plain, parallel=parallel)
    assert rel_l2(out, ref) < 1e-2 and rel_l2(out, ref) < 1.25 * rel_l2(tl_dot, ref)


@pytest.mark.device("cuda")
@pytest.mark.parametrize("quant, K, N, activation, bias, M, launch", [
    pytest.param(int4_w4a16(64, zero_point=True), 2880, 2880, Activation.swiglu_oai(), True, 1,
                 QuantKernelConfig(mma_launch(64, 3), mma_launch(128, 4)), id="g64-zp-bias-k-tail"),
    pytest.param(int4_w4a16(32), 1024, 512, Activation.silu(), False, 2,
                 QuantKernelConfig(mma_launch(64, 1), mma_launch(64, 2)), id="g32"),
    pytest.param(int8_w8a16(-1), 2048, 768, Activation.silu(), False, 1,
                 QuantKernelConfig(mma_launch(64, 4), mma_launch(128, 3, warps=8)), id="int8-channel"),
    pytest.param(mxfp4_w4a16(), 2880, 2880, Activation.swiglu_oai(), True, 1,
                 QuantKernelConfig(mma_launch(64, 3), mma_launch(128, 4)), id="mxfp4-gpt-oss"),
    pytest.param(int4_w4a16(128), 2048, 768, Activation.silu(), False, 8,
                 QuantKernelConfig(mma_launch(128, 2), mma_launch(64, 3)), id="blocks-g128"),
])
def test_mma_gemm_scales_copied_with_the_words_or_loaded_in_the_tile_on_gpu(quant, K, N, activation, bias, M, launch):
    """The mma kernel's two ways to its scale rows (zero points, MXFP4's exponent words): copied with
    each K tile's words into the ring (where rows split into 16-byte pieces; a per-channel row read
    once) and loaded in the tile (`GemmConfig.scales_in_tile`): each against the reference, and
    against each other (the same products; the split-K sums' order may differ)."""
    cls = TritonMxfp4Experts if quant.weight.dtype is mxfp4_w4a16().weight.dtype else TritonWna16Experts
    outs = {}
    for in_tile in (False, True):
        override = QuantKernelConfig(*(dataclasses.replace(g, scales_in_tile=in_tile) for g in (launch.gemm1, launch.gemm2)))
        outs[in_tile], ref = run_layer(cls, quant, activation, torch.bfloat16, K=K, N=N, E=16, topk=4, M=M, bias=bias,
                                       override=override)
        assert rel_l2(outs[in_tile], ref) < 1e-2, in_tile
    assert rel_l2(outs[False], outs[True]) < 1e-5


@pytest.mark.device("cuda")
@pytest.mark.parametrize("quant", [mxfp4_w4a16(), int4_w4a16(64, zero_point=True)], ids=["mxfp4", "int4-g64-zp"])
def test_mma_gemm_under_a_register_cap_on_gpu(quant):
    """The mma kernel under a register cap (`GemmConfig.max_registers`, ptxas's maxnreg), at gpt-oss-120b's
    one-token shapes with GEMM1 on 128 rows in three splits: a cap that fits the build and one that
    spills give the reference's output and the uncapped launch's sums."""
    cls = TritonMxfp4Experts if quant.weight.dtype is mxfp4_w4a16().weight.dtype else TritonWna16Experts
    outs = {}
    for cap in (0, 96, 64):
        launch = QuantKernelConfig(*(dataclasses.replace(g, max_registers=cap) for g in (mma_launch(128, 3),
                                                                                         mma_launch(128, 4))))
        outs[cap], ref = run_layer(cls, quant, Activation.swiglu_oai(), torch.bfloat16, K=2880, N=2880, E=16, topk=4,
                                   M=1, bias=True, override=launch)
        assert rel_l2(outs[cap], ref) < 1e-2, cap
    assert rel_l2(outs[96], outs[0]) < 1e-5 and rel_l2(outs[64], outs[0]) < 1e-5


@pytest.mark.device("cuda")
def test_mma_gemm1_blocks_past_the_call_clear_their_side_slice_on_gpu(monkeypatch):
    """An aligned mma GEMM1 adding split-K sums (above LAST_ARRIVAL_MAX_TOKENS tokens: atomics, N tiles first
    on the grid) clears GEMM2's sums on the side, a slice per program in grid order: the programs of blocks
    past the call's padded pairs, which have nothing to multiply, clear theirs too (every new buffer holds
    garbage here: a slice left out shows in the output)."""
    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=2048, intermediate_size=768, dtype=torch.bfloat16)
    quant = int4_w4a16(128)
    weights = ExpertWeights.random(cfg, quant, seed=9, device=DEV)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    experts.load_weights(weights)
    experts.config_override = QuantKernelConfig(mma_launch(128, 2), mma_launch(64, 2))
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(16, 2048, generator=gen).to(torch.bfloat16).to(DEV)
    tw, ids = route_torch(torch.randn(16, 16, generator=gen).to(DEV), cfg.routing, cfg.top_k)
    garbage_buffers(monkeypatch)
    out = experts.apply(x, tw, ids)
    monkeypatch.undo()
    assert rel_l2(out, reference_moe(x, weights, cfg, tw, ids, quant)) < 1e-2


@pytest.mark.device("cuda")
def test_mma_gemm_top1_store_on_gpu():
    """Top-1 routing: GEMM2's one contribution per output row is stored (no atomics), GEMM1's gated
    activation still finishes by last arrival."""
    out, ref = run_layer(TritonWna16Experts, int4_w4a16(128), Activation.silu(), torch.bfloat16, K=1024, N=512, E=8,
                         topk=1, M=1, override=QuantKernelConfig(mma_launch(64, 1), mma_launch(64, 1)))
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.device("cuda")
def test_mma_gemm1_ranks_its_pairs_experts_as_the_routing_on_gpu():
    """GEMM1 on the mma kernel given the router logits (`direct_quant_gemm`'s own_route) ranks each pair's
    expert as the routing launch chose it, ties and infinite logits included: it writes what it writes
    from the routing's ids."""
    from moe_triton.quant_gemm import direct_quant_gemm
    from moe_triton.routing import route

    if not mma_capable(device_info(DEV)):
        pytest.skip("the mma kernel needs an NVIDIA GPU of sm_80 or later, compiled")
    quant = int4_w4a16(128)
    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=1024, intermediate_size=512, dtype=torch.bfloat16)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, quant, seed=3, device=DEV))
    w13 = experts._operand("w13", cfg.w13_rows, cfg.hidden_size)
    gen = torch.Generator(device=DEV).manual_seed(4)
    x = torch.randn(5, 1024, generator=gen, device=DEV).to(torch.bfloat16)
    inf = float("inf")
    logits = torch.stack([
        torch.randn(16, generator=gen, device=DEV),
        torch.randint(-2, 2, (16,), generator=gen, device=DEV).float(),  # four values: ties
        torch.tensor([-inf, 3, -inf, -inf, 1] + [-inf] * 11, device=DEV),  # fewer possible experts than 4
        torch.tensor([0, inf, -1, inf] + [-2] * 12, device=DEV),
        torch.tensor([0, -200, -150, -300, -120, -250, -180, -90] * 2, device=DEV),  # probabilities underflow
    ]).to(torch.bfloat16)
    _, ids = route(logits, cfg.routing, 4)
    sums = {}
    for own in (None, logits):
        sums[own is None] = torch.zeros(20, cfg.w13_rows, dtype=torch.float32, device=DEV)
        direct_quant_gemm(x, w13, sums[own is None], ids, None, mma_launch(64, 2), a_rows_div=4, atomic=True,
                          own_route=own)
    torch.testing.assert_close(sums[False], sums[True], rtol=1e-5, atol=1e-4)


@pytest.mark.device("cuda")
@pytest.mark.parametrize("tokens", [1, 2])
def test_mma_layer_from_logits_on_gpu(tokens):
    """FusedMoE's call (`apply_monolithic`: the routing launch, then GEMM1 with `own_route`, which ranks
    its pairs' experts itself at one token) on the mma kernel against the reference, and against the
    same layer routed apart (`apply`)."""
    if not mma_capable(device_info(DEV)):
        pytest.skip("the mma kernel needs an NVIDIA GPU of sm_80 or later, compiled")
    quant = int4_w4a16(128)
    cfg = MoEConfig(num_experts=32, top_k=8, hidden_size=1024, intermediate_size=512, dtype=torch.bfloat16,
                    routing=Routing.softmax_topk(True))
    weights = ExpertWeights.random(cfg, quant, seed=5, device=DEV)
    experts = TritonWna16Experts(cfg, quant, RUN_ON)
    experts.load_weights(weights)
    experts.config_override = QuantKernelConfig(dataclasses.replace(mma_launch(64, 2), own_route=True),
                                                mma_launch(128, 4))
    gen = torch.Generator(device=DEV).manual_seed(6)
    x = torch.randn(tokens, 1024, generator=gen, device=DEV).to(torch.bfloat16)
    logits = torch.randn(tokens, 32, generator=gen, device=DEV)
    out = experts.apply_monolithic(x, logits, None)
    tw, ids = route_torch(logits, cfg.routing, cfg.top_k)
    apart = experts.apply(x, tw, ids)
    ref = reference_moe(x, weights, cfg, tw, ids, quant)
    assert rel_l2(out, ref) < 1e-2 and rel_l2(out, apart) < 1e-3


@pytest.mark.parametrize(("cls", "quant"), [(TritonWna16Experts, int4_w4a16(64)), (TritonMxfp4Experts, mxfp4_w4a16()),
                                           (TritonWna16Experts, int8_w8a16(-1))])  # GEMM1's K = 128: byte quads
def test_swapped_weights_refuse_unswapped(cls, quant):
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64, dtype=torch.float16)
    experts = cls(cfg, quant, RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, quant, seed=1, device=DEV))
    experts.config_override = QuantKernelConfig(GemmConfig(16, 64, 1, 4, 2), GemmConfig(16, 64, 1, 4, 2))
    x = torch.randn(3, 128, dtype=torch.float16, device=DEV)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="4-bit weights and int8 quads run swapped only"):
        experts.apply(x, torch.rand(3, 2, device=DEV), ids)
