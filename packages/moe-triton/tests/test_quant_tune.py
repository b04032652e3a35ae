"""The quantized tuner (`moe_triton.tune`, int4 and MXFP4): its candidate lists and the search, with a fake timer.
"""

import dataclasses

import pytest
import torch
from _quant_support import DEV, RUN_ON

from moe_core.config import MoEConfig
from moe_core.quant import int4_w4a16, int8_w8a16, mxfp4_w4a16
from moe_core.weights.canonical import ExpertWeights
from moe_triton import configs
from moe_triton.configs import GemmConfig, QuantKernelConfig
from moe_triton.quantized import (
    BORROWED_MAX_STAGES,
    LAST_ARRIVAL_MAX_TOKENS,
    TritonMxfp4Experts,
    TritonWna16Experts,
    borrowed_as_served,
)
from moe_triton.tune import (
    PER_GEMM_SPLITS,
    PREFETCH_TILES,
    _tune_quant_layer,
    as_mma,
    per_gemm_grid,
    quant_candidates,
    wgmma_grid,
)


@pytest.mark.parametrize("int8", [False, True])
def test_wgmma_grid_fits_hopper_shared_memory(int8):
    """int4's ring per stage: the activations, the quads' words, a scale row; int8's words are twice
    as wide, so its 256-wide tiles are capped (INT8_WGMMA_STAGES; test_quant_compile builds them)."""
    grid = wgmma_grid(int8=int8)
    assert len(grid) == len(wgmma_grid()) - (2 if int8 else 0)  # 64x256 and 128x256 repeat at 4 and 3
    assert max(c.gemm1.num_stages for c in grid.values()) == 6  # 32x128 keeps int4's depth
    for name, cand in grid.items():
        t = cand.gemm1
        assert cand.gemm2 == t and t.wgmma
        words = t.block_n * 128 if int8 else t.block_n * 32 * 2
        ring = t.num_stages * (t.block_m * 128 * 2 + words + t.block_n * 2)
        assert ring <= 227 * 1024, name


def test_quant_candidates_are_distinct_neighbours():
    base = QuantKernelConfig(GemmConfig(16, 128, 4, 4, 4, True), GemmConfig(16, 64, 8, 4, 4, True))
    cands = quant_candidates(base)
    assert next(iter(cands.items())) == ("heuristic", base)
    assert len(set(cands.values())) == len(cands)
    assert "block_m/2" not in cands  # 8 rows per block is not a valid MMA tile
    assert cands["split*2"] == QuantKernelConfig(dataclasses.replace(base.gemm1, split_k=8),
                                                 dataclasses.replace(base.gemm2, split_k=16))
    assert cands["stages-1"] == QuantKernelConfig(dataclasses.replace(base.gemm1, num_stages=3),
                                                  dataclasses.replace(base.gemm2, num_stages=3))
    assert all(c.gemm1.swap_ab and c.gemm2.swap_ab for c in cands.values())  # int4 runs swapped only
    assert "narrow" not in cands  # narrow blocks have 32 pairs or more
    wider = quant_candidates(QuantKernelConfig(dataclasses.replace(base.gemm1, block_m=32),
                                               dataclasses.replace(base.gemm2, block_m=32)))
    assert wider["narrow"].gemm2 == dataclasses.replace(base.gemm2, block_m=32, narrow=True)
    assert "swap_ab" not in cands  # only where the weights run either way (fp8)
    assert cands["one_dot"] == QuantKernelConfig(dataclasses.replace(base.gemm1, one_dot=True),
                                                 dataclasses.replace(base.gemm2, one_dot=True))
    fp8 = quant_candidates(QuantKernelConfig(GemmConfig(16, 128, 4, 4, 3, True), GemmConfig(16, 64, 1, 4, 3)),
                           swap_optional=True)
    assert fp8["swap_ab"] == QuantKernelConfig(GemmConfig(16, 128, 4, 4, 3), GemmConfig(16, 64, 1, 4, 3, True))
    assert "one_dot" not in fp8  # fp8 codes are no quads


def _tuner_experts() -> TritonWna16Experts:
    """A small fp16 int4 (group 64) layer with random weights, for the tuner's search."""
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64, dtype=torch.float16)
    experts = TritonWna16Experts(cfg, int4_w4a16(64), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, int4_w4a16(64), seed=9, device=DEV))
    return experts


def test_int4_tuner_keeps_the_fastest_candidate():
    """The search and its record, with a stand-in timer (the real one replays CUDA graphs)."""
    experts = _tuner_experts()
    runs = []
    base = experts.heuristic_config(3)

    def timer(layer, rep_ms):
        out = layer()  # the candidate really runs
        assert torch.isfinite(out).all()
        cand = experts.config_override
        runs.append(cand)
        # More splits help most, one stage fewer a little: found only from the first step's winner.
        return (2.0 - 1.0 * (cand.gemm1.split_k > base.gemm1.split_k)
                - 0.5 * (cand.gemm1.num_stages < base.gemm1.num_stages))

    table, measured = _tune_quant_layer(experts, [3], 5, lambda s: None, timer=timer)
    first = quant_candidates(base)
    second = [c for c in quant_candidates(first["split*2"]).values() if c not in first.values()]
    assert runs == list(first.values()) + second and experts.config_override is None
    best = QuantKernelConfig(dataclasses.replace(first["split*2"].gemm1, num_stages=base.gemm1.num_stages - 1),
                             dataclasses.replace(first["split*2"].gemm2, num_stages=base.gemm2.num_stages - 1))
    assert table[3] == best and measured["3"]["best"] == "split*2+stages-1"
    assert measured["3"]["layer_us"]["heuristic"] == 2.0 and measured["3"]["layer_us"]["split*2"] == 1.0
    assert "shipped" not in measured["3"]  # no file holds this shape


@pytest.mark.parametrize("shipped_as", ["split*2", "shipped"])
def test_int4_tuner_records_the_shipped_configuration(monkeypatch, shipped_as):
    """The shipped configuration is timed once: under its own name, or under the candidate it equals."""
    import moe_triton.quantized as quantized

    experts = _tuner_experts()
    base = experts.heuristic_config(3)
    split = quant_candidates(base)["split*2"]
    shipped = split if shipped_as == "split*2" else dataclasses.replace(
        base, gemm2=dataclasses.replace(base.gemm2, block_n=base.gemm2.block_n // 2))
    monkeypatch.setattr(quantized, "lookup_exact", lambda key, m: configs.Lookup(shipped, "tuned", "a file"))
    times = {}

    def timer(layer, rep_ms):
        times[experts.config_override] = 2.0 - (experts.config_override == shipped)
        return times[experts.config_override]

    logged = []
    table, measured = _tune_quant_layer(experts, [3], 5, logged.append, timer=timer)
    assert list(times.values()).count(1.0) == 1 and table[3] == shipped
    assert measured["3"]["shipped"] == shipped_as and measured["3"]["best"] == shipped_as
    assert f"shipped ({shipped_as}) 1.0" in logged[-1]


def test_per_gemm_grid_changes_one_gemm_at_a_time():
    base = QuantKernelConfig(GemmConfig(16, 128, 4, 4, 3, True), GemmConfig(16, 256, 1, 8, 4, True))
    grid = per_gemm_grid(base)
    # split x block_n x warps per GEMM (the base once per GEMM), and each GEMM's one_dot flipped
    assert len(grid) == 2 * len(PER_GEMM_SPLITS) * 3 * 2 - 2 + 2 and base not in grid.values()
    assert grid["gemm2:one_dot=True"] == dataclasses.replace(base, gemm2=dataclasses.replace(base.gemm2, one_dot=True))
    assert "gemm1:one_dot=True" not in per_gemm_grid(base, one_dot=False)  # fp8 codes are no quads
    assert {c.gemm1.split_k for c in grid.values()} == set(PER_GEMM_SPLITS)
    assert len(set(grid.values())) == len(grid)
    for name, cand in grid.items():
        changed, kept = ("gemm1", "gemm2") if name.startswith("gemm1:") else ("gemm2", "gemm1")
        assert getattr(cand, kept) == getattr(base, kept)
        tile, was = getattr(cand, changed), getattr(base, changed)
        assert (tile.block_m, tile.num_stages, tile.swap_ab) == (was.block_m, was.num_stages, was.swap_ab)


def test_per_gemm_grid_flips_each_gemm_onto_the_mma_kernel():
    """With mma (quads at decode sizes) each GEMM, and each tile of its grid, also runs on the other of
    the tl.dot and mma kernels: its shape kept, warps cut to 16 rows each, the tl.dot kernel's options
    dropped; a tile that comes out the same (64 rows: 4 warps from 8) is timed once."""
    base = QuantKernelConfig(GemmConfig(16, 64, 4, 8, 3, True, one_dot=True), GemmConfig(16, 128, 2, 4, 3, True, group_m=16))
    grid, plain = per_gemm_grid(base, mma=True), per_gemm_grid(base)
    assert all(grid[name] == cand for name, cand in plain.items()) and len(set(grid.values())) == len(grid)
    flipped = {name: cand for name, cand in grid.items() if name.endswith(",mma=True")}
    for name, cand in flipped.items():
        gemm = name.partition(":")[0]
        assert getattr(cand, gemm) == as_mma(getattr(plain[name.removesuffix(",mma=True")], gemm)), name
    assert grid["gemm1:split=2,block_n=64,warps=4,mma=True"].gemm1 == GemmConfig(16, 64, 2, 4, 3, True, mma=True)
    assert "gemm1:split=2,block_n=64,warps=8,mma=True" not in grid  # the same tile as 4 warps
    on = grid["gemm1:mma=True"].gemm1
    assert on == GemmConfig(16, 64, 4, 4, 3, True, mma=True) == as_mma(base.gemm1)
    assert grid["gemm2:mma=True"].gemm2 == GemmConfig(16, 128, 2, 4, 3, True, mma=True)
    assert grid["gemm1:mma=True"].gemm2 == base.gemm2
    back = per_gemm_grid(dataclasses.replace(base, gemm1=on), mma=True)
    assert back["gemm1:mma=False"].gemm1 == GemmConfig(16, 64, 4, 4, 3, True)
    assert "gemm1:one_dot=True" not in back  # one_dot is the tl.dot kernel's
    # At one token an mma GEMM1's own routing is flipped too; leaving the mma kernel drops it.
    assert "gemm1:own_route=True" not in back
    one = per_gemm_grid(dataclasses.replace(base, gemm1=on), mma=True, own_route=True)
    assert one["gemm1:own_route=True"].gemm1 == dataclasses.replace(on, own_route=True)
    own = dataclasses.replace(on, own_route=True)
    assert per_gemm_grid(dataclasses.replace(base, gemm1=own), mma=True)["gemm1:mma=False"].gemm1 == back[
        "gemm1:mma=False"].gemm1
    # An mma GEMM's scale rows loaded in the tile (or copied with its words) is flipped; a tl.dot one has none.
    assert back["gemm1:scales_in_tile=True"].gemm1 == dataclasses.replace(on, scales_in_tile=True)
    assert "gemm2:scales_in_tile=True" not in back
    in_tile = dataclasses.replace(on, scales_in_tile=True)
    again = per_gemm_grid(dataclasses.replace(base, gemm1=in_tile), mma=True)
    assert again["gemm1:scales_in_tile=False"].gemm1 == on
    assert again["gemm1:mma=False"].gemm1 == back["gemm1:mma=False"].gemm1


def test_per_gemm_grid_flips_an_aligned_gemm2s_prefetch():
    """In aligned launches of a few tokens the grid tries a tl.dot GEMM2 asking L2 for its first tiles before
    its wait (and back); never GEMM1 (its experts come from the launch right before it) nor the mma kernel."""
    tile = GemmConfig(16, 128, 1, 4, 3, True)
    base = QuantKernelConfig(tile, tile)
    grid = per_gemm_grid(base, mma=True, prefetch=True)
    assert grid["gemm2:prefetch_tiles=2"] == QuantKernelConfig(tile, dataclasses.replace(tile, prefetch_tiles=PREFETCH_TILES))
    assert not any("prefetch" in k for k in per_gemm_grid(base, mma=True)) and "gemm1:prefetch_tiles=2" not in grid
    # the mma kernel takes none of it: flipping a prefetching GEMM2 onto it drops the prefetch
    assert grid["gemm2:mma=True"].gemm2.prefetch_tiles == 0
    on = QuantKernelConfig(tile, dataclasses.replace(tile, prefetch_tiles=2))
    back = per_gemm_grid(on, mma=True, prefetch=True)
    assert back["gemm2:prefetch_tiles=0"].gemm2 == tile and back["gemm2:mma=True"].gemm2.prefetch_tiles == 0


def test_per_gemm_grid_flips_gemm2_block_ready():
    """With 16-bit activations the grid tries GEMM2 waiting per block of GEMM1's rows (and back) where
    both GEMMs run on the tl.dot kernel; a GEMM1 moved onto the mma kernel (no counts) takes GEMM2's
    option off, as a GEMM2 moved there does."""
    tile = GemmConfig(16, 128, 1, 4, 3, True)
    base = QuantKernelConfig(tile, tile)
    ready = dataclasses.replace(tile, block_ready=True)
    grid = per_gemm_grid(base, mma=True, block_ready=True)
    assert grid["gemm2:block_ready=True"] == QuantKernelConfig(tile, ready)
    assert not any("block_ready" in k for k in per_gemm_grid(base, mma=True))
    back = per_gemm_grid(QuantKernelConfig(tile, ready), mma=True, block_ready=True)
    assert back["gemm2:block_ready=False"] == base
    assert back["gemm1:mma=True"].gemm2 == tile and back["gemm2:mma=True"].gemm2.block_ready is False
    assert back["gemm1:split=2,block_n=128,warps=4"].gemm2 == ready  # the other GEMM held as it is
    on_mma = QuantKernelConfig(as_mma(tile), tile)
    assert not any("block_ready" in k for k in per_gemm_grid(on_mma, mma=True, block_ready=True))


def test_per_gemm_search_times_both_gemms_fastest_tiles_together():
    """Each GEMM's grid is timed with the other held; where both GEMMs found a faster tile, the pair of
    them is timed too and kept when fastest."""
    experts = _tuner_experts()
    base = experts.heuristic_config(3)

    def timer(layer, rep_ms):
        cand = experts.config_override
        return (4.0 - 1.0 * (cand.gemm1.split_k == 3 and cand.gemm1.block_n == base.gemm1.block_n)
                - 1.5 * (cand.gemm2.split_k == 6 and cand.gemm2.block_n == base.gemm2.block_n))

    table, measured = _tune_quant_layer(experts, [3], 5, lambda s: None, timer=timer, per_gemm=True)
    g1 = dataclasses.replace(base.gemm1, split_k=3)
    g2 = dataclasses.replace(base.gemm2, split_k=6)
    warps = f"block_n={base.gemm1.block_n},warps={base.gemm1.num_warps}"
    assert table[3] == QuantKernelConfig(g1, g2)
    assert measured["3"]["best"] == (f"heuristic+gemm1:split=3,{warps}+"
                                     f"gemm2:split=6,block_n={base.gemm2.block_n},warps={base.gemm2.num_warps}")
    assert measured["3"]["layer_us"][measured["3"]["best"]] == 1.5


def test_int8_tuner_times_the_borrowed_shapes_and_its_own_wgmma_tiles(monkeypatch):
    """int8 on byte quads runs int4's kernels: the tuner times the int4 shape it borrows as served
    (at most BORROWED_MAX_STAGES deep) and int8's wgmma grid (rings as deep as they fit an sm_90
    block, deeper than the borrowed cap); the layer's own output is checked on the way."""
    import moe_triton.quantized as quantized

    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128, dtype=torch.float16)
    experts = TritonWna16Experts(cfg, int8_w8a16(), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, int8_w8a16(), seed=9, device=DEV))
    assert experts._operand("w13", cfg.w13_rows, cfg.hidden_size).quads
    base = experts.heuristic_config(3)
    lent = QuantKernelConfig(dataclasses.replace(base.gemm1, num_stages=5),
                             dataclasses.replace(base.gemm2, block_n=2 * base.gemm2.block_n, num_stages=6))
    monkeypatch.setattr(quantized, "lookup_exact", lambda key, m: configs.Lookup(lent, "borrowed", "an int4 file"))
    served = experts.file_config(3).config
    assert served.gemm1.num_stages == served.gemm2.num_stages == BORROWED_MAX_STAGES
    timed = []

    def timer(layer, rep_ms):
        if not experts.config_override.gemm1.wgmma:  # the interpreter cannot run the Gluon kernel
            assert torch.isfinite(layer()).all()
        timed.append(experts.config_override)
        return 1.0 if experts.config_override == served else 2.0

    many = LAST_ARRIVAL_MAX_TOKENS + 1
    table, measured = _tune_quant_layer(experts, [3, many], 5, lambda s: None, timer=timer, wgmma=True)
    assert table[3] == served and measured["3"]["shipped"] == "shipped"
    wgmma_timed = [c for c in timed if c.gemm1.wgmma]
    assert set(wgmma_timed) == set(wgmma_grid(int8=True).values())
    assert max(c.gemm1.num_stages for c in wgmma_timed) > BORROWED_MAX_STAGES


def test_int4_tuner_times_wgmma_tiles_only_where_the_layer_can_run_them():
    """Up to LAST_ARRIVAL_MAX_TOKENS tokens the layer's GEMMs are direct or finished by their last
    contributor, which the wgmma kernel refuses: its tiles are not candidates there."""
    experts = _tuner_experts()
    timed = []

    def timer(layer, rep_ms):
        timed.append(experts.config_override)
        return 1.0

    few, many = LAST_ARRIVAL_MAX_TOKENS, LAST_ARRIVAL_MAX_TOKENS + 1
    _, measured = _tune_quant_layer(experts, [few, many], 5, lambda s: None, timer=timer, wgmma=True)
    assert not any(k.startswith("wgmma:") for k in measured[str(few)]["layer_us"])
    assert {k for k in measured[str(many)]["layer_us"] if k.startswith("wgmma:")} == set(wgmma_grid())
    assert sum(c.gemm1.wgmma for c in timed) == len(wgmma_grid())


def test_int4_tuner_per_gemm_finds_a_one_gemm_change():
    """With --per-gemm a change to GEMM2 alone, which no both-GEMM neighbour makes, is found."""
    experts = _tuner_experts()
    base = experts.heuristic_config(1)

    def timer(layer, rep_ms):
        cand = experts.config_override
        return 2.0 - (cand.gemm2.block_n == 64 and cand.gemm2.split_k == 2 and cand.gemm1 == base.gemm1)

    table, measured = _tune_quant_layer(experts, [1], 5, lambda s: None, timer=timer, per_gemm=True)
    assert table[1] == QuantKernelConfig(base.gemm1, dataclasses.replace(base.gemm2, block_n=64, split_k=2))
    assert measured["1"]["best"] == f"heuristic+gemm2:split=2,block_n=64,warps={base.gemm2.num_warps}"


def test_mxfp4_tuner_times_the_borrowed_int4_configuration_as_served(monkeypatch):
    """MXFP4 without a file of its own borrows the int4 launch shape of its shape: the tuner times it
    as the layer serves it (`quantized.borrowed_as_served`: tl.dot GEMMs as lent, here six stages
    deep) under the shipped name."""
    import moe_triton.quantized as quantized

    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64, dtype=torch.float16)
    experts = TritonMxfp4Experts(cfg, mxfp4_w4a16(), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, mxfp4_w4a16(), seed=9, device=DEV))
    base = experts.heuristic_config(3)
    # Six stages: no neighbour of the heuristic or of the winner has as many.
    lent = QuantKernelConfig(dataclasses.replace(base.gemm1, num_stages=6),
                             dataclasses.replace(base.gemm2, block_n=2 * base.gemm2.block_n, num_stages=6))
    assert borrowed_as_served(lent) == lent
    monkeypatch.setattr(quantized, "lookup_exact", lambda key, m: configs.Lookup(lent, "borrowed", "an int4 file"))
    timed = []

    def timer(layer, rep_ms):
        out = layer()
        assert torch.isfinite(out).all()
        timed.append(experts.config_override)
        return 1.0 if experts.config_override == lent else 2.0

    table, measured = _tune_quant_layer(experts, [3], 5, lambda s: None, timer=timer)
    assert timed.count(lent) == 1 and table[3] == lent and measured["3"]["shipped"] == "shipped"


def test_mxfp4_tuner_times_the_int4_entry_with_its_mma_gemms(monkeypatch):
    """A borrowed int4 entry is served on the tl.dot kernel; the tuner also times the int4 entry of the
    shape as int4 runs it (`lender_config`: its mma GEMMs kept where the layer runs that kernel) under
    the name `lender`, and keeps it where it is fastest."""
    import moe_triton.quantized as quantized

    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64, dtype=torch.float16)
    experts = TritonMxfp4Experts(cfg, mxfp4_w4a16(), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, mxfp4_w4a16(), seed=9, device=DEV))
    base = experts.heuristic_config(1)
    lent = QuantKernelConfig(as_mma(base.gemm1), as_mma(dataclasses.replace(base.gemm2, split_k=2)))
    found = configs.Lookup(lent, "borrowed", "an int4 file")
    monkeypatch.setattr(quantized, "lookup_exact", lambda key, m: found)
    monkeypatch.setattr(quantized, "lender_lookup", lambda key, m: found)
    monkeypatch.setattr(experts, "_mma_serves", lambda cols: True)  # as on an NVIDIA GPU
    shipped = experts.file_config(1).config
    assert shipped == borrowed_as_served(lent) != lent
    timed = []

    def timer(layer, rep_ms):
        cand = experts.config_override
        if not (cand.gemm1.mma or cand.gemm2.mma):  # the interpreter cannot run the mma kernel
            assert torch.isfinite(layer()).all()
        timed.append(cand)
        return 1.0 if cand == lent else 2.0

    table, measured = _tune_quant_layer(experts, [1], 5, lambda s: None, timer=timer)
    assert timed.count(lent) == 1 and shipped in timed
    assert table[1] == lent and measured["1"]["best"] == "lender"


@pytest.mark.parametrize("std", [None, 0.1])
def test_tuner_routes_with_a_correction_bias_of_the_asked_spread(std):
    """A routing with a correction bias (DeepSeek-V3's) is tuned with a random one of the standard
    deviation asked for (default CORRECTION_BIAS: near-uniform loads); the layer gets it on every call."""
    from moe_core.config import Routing, Scoring
    from moe_triton.tune import CORRECTION_BIAS

    routing = Routing(scoring=Scoring.SIGMOID, num_expert_groups=2, topk_groups=1, has_correction_bias=True)
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64, dtype=torch.float16,
                    routing=routing)
    experts = TritonWna16Experts(cfg, int4_w4a16(64), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, int4_w4a16(64), seed=4, device=DEV))
    biases = []
    route = experts.apply_monolithic

    def apply_monolithic(x, logits, bias):
        biases.append(bias)
        return route(x, logits, bias)

    experts.apply_monolithic = apply_monolithic
    kwargs = {} if std is None else {"correction_bias": std}
    _tune_quant_layer(experts, [2], 5, lambda s: None, timer=lambda layer, rep_ms: float(layer().isfinite().all()),
                      **kwargs)
    expected = CORRECTION_BIAS if std is None else std
    assert biases and all(b is biases[0] for b in biases)
    assert biases[0].shape == (8,) and expected / 10 < biases[0].std().item() < expected * 10


def test_moe_tune_refuses_a_correction_bias_it_cannot_use(monkeypatch, capsys):
    from moe_triton import tune

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the checks come before any GPU work
    for argv, said in ((["--correction-bias", "0.1"], "the 16-bit search times each GEMM alone"),
                       (["--quant", "int8", "--correction-bias", "-1"], "a standard deviation, 0 or more")):
        with pytest.raises(SystemExit) as exit_info:
            tune.main(argv)
        assert exit_info.value.code == 2 and said in capsys.readouterr().err


def test_tuner_does_not_time_mma_gemms_its_kernel_refuses(monkeypatch):
    """The mma kernel unrolls at most MAX_TILES K tiles per split: candidates whose mma GEMM would take
    more (GEMM1 of K = 2048, 16 tiles, in one split) are left out and counted in the log, the others timed."""
    from moe_triton.quant_gemm_details._mma import MAX_TILES

    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=2048, intermediate_size=256, dtype=torch.float16)
    experts = TritonWna16Experts(cfg, int4_w4a16(128), RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, int4_w4a16(128), seed=5, device=DEV))
    monkeypatch.setattr(experts, "_mma_serves", lambda cols: True)  # as on an NVIDIA GPU
    timed, lines = [], []

    def timer(layer, rep_ms):
        timed.append(experts.config_override)
        return 1.0

    _tune_quant_layer(experts, [1], 5, lines.append, timer=timer, per_gemm=True)
    tiles = {"gemm1": 16, "gemm2": 2}
    mma_splits = {(name, g.split_k) for c in timed for name in tiles if (g := getattr(c, name)).mma}
    assert all(-(-tiles[name] // split) <= MAX_TILES.value for name, split in mma_splits)
    assert ("gemm1", 2) in mma_splits and ("gemm2", 1) in mma_splits
    assert any(f"candidates not timed (an mma GEMM over {MAX_TILES.value} K tiles per split)" in s for s in lines)
