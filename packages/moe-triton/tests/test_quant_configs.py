"""Launch configurations of the quantized GEMM: the dataclasses' limits, tuned files of an exact
shape, another device's wgmma entries, the shipped int4 files, and MXFP4 taking int4's.
"""

import dataclasses

import pytest
import torch
from _quant_support import DEV, RUN_ON, gemm1_operand, int4_bf16_layer, rel_l2, wgmma_launch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import MoEConfig
from moe_core.presets import get_preset
from moe_core.quant import fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton import configs
from moe_triton._common.target import num_sms, wgmma_capable
from moe_triton.configs import ConfigKey, GemmConfig, QuantKernelConfig
from moe_triton.quant_gemm_details._heuristics import FP8_SWAP_MAX_BLOCK_M, GROUP_M_BLOCKS, pick_config
from moe_triton.quant_gemm_details._layouts import WeightOperand, WType
from moe_triton.quantized import TritonFp8Experts, TritonMxfp4Experts, TritonWna16Experts, borrowed_as_served
from moe_triton.tune import quant_candidates


def test_narrow_limits():
    with pytest.raises(ValueError, match=r"narrow is an option of the tl\.dot kernel with block_m >= 32"):
        GemmConfig(16, 64, 1, 4, 2, swap_ab=True, narrow=True)
    with pytest.raises(ValueError, match=r"narrow is an option of the tl\.dot kernel"):
        GemmConfig(128, 256, 1, 4, 3, swap_ab=True, wgmma=True, narrow=True)


def test_prefetch_tiles_limits():
    """GemmConfig.prefetch_tiles: 0..8 K tiles, the tl.dot kernel's, GEMM2's only."""
    tl_dot = GemmConfig(16, 128, 1, 4, 3, swap_ab=True)
    assert dataclasses.replace(tl_dot, prefetch_tiles=2).prefetch_tiles == 2
    for bad in (dict(prefetch_tiles=-1), dict(prefetch_tiles=9)):
        with pytest.raises(ValueError, match=r"prefetch_tiles is 0\.\.8, an option of the tl\.dot kernel"):
            dataclasses.replace(tl_dot, **bad)
    for other in (wgmma_launch(128, 256, 3), dataclasses.replace(tl_dot, mma=True)):
        with pytest.raises(ValueError, match=r"prefetch_tiles is 0\.\.8, an option of the tl\.dot kernel"):
            dataclasses.replace(other, prefetch_tiles=2)
    with pytest.raises(ValueError, match="prefetch_tiles is GEMM2's"):
        QuantKernelConfig(dataclasses.replace(tl_dot, prefetch_tiles=2), tl_dot)
    both = QuantKernelConfig(tl_dot, dataclasses.replace(tl_dot, prefetch_tiles=2))
    assert QuantKernelConfig.from_dict(both.to_dict()) == both and str(both).endswith("swap prefetch2")


def test_wgmma_config_limits():
    assert wgmma_launch(128, 256, 3).wgmma
    for bad in (dict(swap_ab=False), dict(block_m=256), dict(num_stages=2), dict(block_n=64),
                dict(num_warps=8)):
        with pytest.raises(ValueError, match="the wgmma kernel takes"):
            dataclasses.replace(wgmma_launch(128, 128, 3), **bad)


def test_tail_limits():
    assert dataclasses.replace(wgmma_launch(128, 256, 4), tail=16).tail == 16
    for bad in (dict(tail=4), dict(tail=8, block_m=64), dict(tail=32)):
        with pytest.raises(ValueError, match=r"tail \(8 or 16 pairs taken in by the block before\) is an option "
                                             r"of the wgmma kernel"):
            dataclasses.replace(wgmma_launch(128, 256, 4), **bad)
    assert GemmConfig(32, 128, 1, 4, 3, swap_ab=True, tail=16).tail == 16
    for bad in (dict(tail=8), dict(tail=32), dict(tail=16, block_m=16), dict(tail=16, swap_ab=False)):
        with pytest.raises(ValueError, match=r"tail \(16 or 32 pairs taken in by the block before\) is an option "
                                             r"of the swapped tl.dot kernel"):
            dataclasses.replace(GemmConfig(32, 128, 1, 4, 3, swap_ab=True), **bad)
    cands = quant_candidates(QuantKernelConfig(wgmma_launch(128, 256, 4), wgmma_launch(128, 256, 4)))
    assert cands["tail8"].gemm1.tail == cands["tail8"].gemm2.tail == 8 and cands["tail16"].gemm2.tail == 16
    assert "tail32" not in cands
    assert "tail8" not in quant_candidates(QuantKernelConfig(wgmma_launch(64, 256, 4), wgmma_launch(64, 256, 4)))
    tl_dot = GemmConfig(32, 256, 1, 4, 3, swap_ab=True)
    cands = quant_candidates(QuantKernelConfig(tl_dot, tl_dot))
    assert cands["tail16"].gemm1.tail == cands["tail16"].gemm2.tail == 16 and "tail8" not in cands
    assert "tail32" not in cands  # below block_m only
    wide = dataclasses.replace(tl_dot, block_m=64)
    assert quant_candidates(QuantKernelConfig(wide, wide))["tail32"].gemm2.tail == 32


def test_wgmma_entries_of_another_device_run_as_tl_dot(tmp_path, monkeypatch):
    """A tuned file from a Hopper GPU that asks for the wgmma kernel runs its GEMMs as tl.dot ones
    elsewhere, and the lookup says so."""
    if wgmma_capable(DEV):
        pytest.skip("this GPU runs the wgmma kernel")
    experts, weights, x, tw, ids = int4_bf16_layer(4)
    hopper_key = dataclasses.replace(experts.config_key, device="NVIDIA_H100_80GB_HBM3")
    tails = (dataclasses.replace(wgmma_launch(128, 256, 3), tail=8), dataclasses.replace(wgmma_launch(128, 128, 4), tail=16))
    configs.write_configs(hopper_key, {16: QuantKernelConfig(wgmma_launch(64, 128, 3), wgmma_launch(64, 128, 3)),
                                       64: QuantKernelConfig(*tails)}, tmp_path)
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    configs.reload()
    try:
        hit = experts.config_for(16)
        assert hit.source == "other-device" and hit.detail.endswith("wgmma off (not an sm_90 GPU)")
        assert hit.config == QuantKernelConfig(GemmConfig(64, 128, 1, 4, 3, True), GemmConfig(64, 128, 1, 4, 3, True))
        # An 8-pair tail (below the tl.dot kernel's 16) goes; a 16-pair one stays.
        as_tl_dot = experts.config_for(64).config
        assert as_tl_dot == QuantKernelConfig(GemmConfig(128, 256, 1, 4, 3, True),
                                              GemmConfig(128, 128, 1, 4, 4, True, tail=16))
        cfg = experts.config
        ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, experts.quant, cfg.expert_map(DEV))
        assert rel_l2(experts.apply(x, tw, ids), ref) < 1e-2
        experts.config_override = as_tl_dot  # the converted tiles run too
        assert rel_l2(experts.apply(x, tw, ids), ref) < 1e-2
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


def test_quant_config_records_and_exact_lookup(tmp_path, monkeypatch):
    g16 = GemmConfig(16, 64, 2, 4, 3, swap_ab=True)
    with pytest.raises(ValueError, match="powers of two"):
        GemmConfig(24, 64, 1, 4, 3)
    with pytest.raises(ValueError, match="share one block_m"):
        QuantKernelConfig(g16, GemmConfig(32, 64, 1, 4, 3))
    key = ConfigKey("wna16-int4-g128", 4, 64, 128, 2, "float16", "GPU_A")
    table = {1: QuantKernelConfig(g16, g16), 64: QuantKernelConfig(GemmConfig(32, 128, 1, 8, 4), GemmConfig(32, 64, 1, 4, 4))}
    configs.write_configs(key, table, tmp_path)
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    configs.reload()
    try:
        hit = configs.lookup_exact(key, 3)
        assert (hit.config, hit.source, hit.detail) == (table[1], "tuned", f"{key.file_name()} at M=1")
        other = configs.lookup_exact(dataclasses.replace(key, device="GPU_B"), 100)
        assert (other.config, other.source) == (table[64], "other-device")
        assert configs.lookup_exact(dataclasses.replace(key, hidden=256), 1) is None
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


def test_wna16_takes_a_tuned_file_of_its_shape(tmp_path, monkeypatch):
    """config_for: the heuristic without a file; a tuned file's entry once one exists (and the layer
    still matches the reference with it)."""
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128, dtype=torch.float16)
    q = int4_w4a16(64, zero_point=True)
    experts = TritonWna16Experts(cfg, q, RUN_ON)
    weights = ExpertWeights.random(cfg, q, seed=7, device=DEV)
    experts.load_weights(weights)
    assert experts.config_key.kernel == "wna16-int4-g64-zp"
    assert experts.config_for(5).source == "default"
    tuned = QuantKernelConfig(GemmConfig(32, 64, 2, 4, 2, swap_ab=True), GemmConfig(32, 32, 1, 4, 2, swap_ab=True))
    configs.write_configs(experts.config_key, {4: tuned}, tmp_path)
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    configs.reload()
    try:
        fresh = TritonWna16Experts(cfg, q, RUN_ON)
        fresh.load_weights(weights)
        hit = fresh.config_for(5)
        assert (hit.config, hit.source) == (tuned, "tuned")
        gen = torch.Generator().manual_seed(8)
        x = torch.randn(5, 128, generator=gen).to(torch.float16).to(DEV)
        tw, ids = route_torch(torch.randn(5, 4, generator=gen).to(DEV), cfg.routing, 2)
        ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, q, cfg.expert_map(DEV))
        assert rel_l2(fresh.apply(x, tw, ids), ref) < 1e-2
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


@pytest.mark.parametrize(("quant", "family"), [
    (fp8_w8a8("tensor", activation_scales="tensor"), "fp8-tensor"), (fp8_w8a8("channel"), "fp8-channel"),
    (fp8_w8a8("block"), "fp8-block")])
def test_fp8_takes_a_tuned_file_of_its_family(tmp_path, monkeypatch, quant, family):
    """fp8 layers have a tuned family per weight scale granularity (`moe tune --quant fp8-*` writes
    it): the heuristic without a file (none ships for this shape), the file's entry once one exists."""
    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=1024, intermediate_size=512, dtype=torch.bfloat16)
    device = DeviceInfo(Platform.CUDA, 0, "NVIDIA H100 80GB HBM3", (9, 0))
    experts = TritonFp8Experts(cfg, quant, device)
    assert experts.config_key.kernel == family and experts.config_key.device == "NVIDIA_H100_80GB_HBM3"
    assert configs.lookup_exact(experts.config_key, 8) is None  # so the heuristic serves it
    tuned = QuantKernelConfig(GemmConfig(16, 64, 2, 4, 3), GemmConfig(16, 128, 1, 4, 4))
    configs.write_configs(experts.config_key, {8: tuned}, tmp_path)
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    configs.reload()
    try:
        hit = TritonFp8Experts(cfg, quant, device)._find_config(8)
        assert (hit.config, hit.source) == (tuned, "tuned")
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"])
def test_shipped_fp8_block_configs_cover_the_presets(preset):
    """fp8 128x128-block layers of the presets that have them find launch shapes of their GPU at every
    benchmarked token count, H100 and H200. The H200 runs swapped wherever blocks hold at most
    FP8_SWAP_MAX_BLOCK_M pairs (measured faster there) and takes the H100's entries from 512 tokens."""
    cfg = get_preset(preset).config
    hits = {}
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        experts = TritonFp8Experts(cfg, fp8_w8a8("block"), DeviceInfo(Platform.CUDA, 0, gpu, (9, 0)))
        for m in (1, 8, 32, 128, 512, 2048, 8192):
            hit = hits[gpu, m] = configs.lookup_exact(experts.config_key, m)
            assert hit is not None and hit.source == "tuned" and f"at M={m}" in hit.detail, (gpu, m, hit)
    for m in (1, 8, 32, 128, 512, 2048, 8192):
        h200 = hits["NVIDIA H200", m].config
        assert all(g.swap_ab == (g.block_m <= FP8_SWAP_MAX_BLOCK_M) for g in (h200.gemm1, h200.gemm2)), m
        assert m < 512 or h200 == hits["NVIDIA H100 80GB HBM3", m].config, m
    assert hits["NVIDIA H200", 1].config.gemm1.swap_ab and not hits["NVIDIA H200", 8192].config.gemm1.swap_ab


@pytest.mark.parametrize(("gpu", "tag"), [("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
                                         ("NVIDIA H200", "NVIDIA_H200")])
@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"])
def test_shipped_int4_configs_cover_the_presets(preset, gpu, tag):
    """Each preset's int4 layer (its usual group size) finds launch shapes tuned on that GPU at every
    benchmarked token count."""

    p = get_preset(preset)
    cfg = p.config
    family = f"wna16-int4-g{p.int4_group_size}"
    key = ConfigKey(family, cfg.num_experts, cfg.intermediate_size, cfg.hidden_size, cfg.top_k, "bfloat16", tag)
    device = DeviceInfo(Platform.CUDA, 0, gpu, (9, 0))
    assert TritonWna16Experts(cfg, int4_w4a16(p.int4_group_size), device).config_key == key
    for m in (1, 8, 32, 128, 512, 2048, 8192):
        hit = configs.lookup_exact(key, m)
        assert (hit.source, hit.detail) == ("tuned", f"{key.file_name()} at M={m}")
        assert isinstance(hit.config, QuantKernelConfig)


def _waiting_for_all(config: QuantKernelConfig) -> QuantKernelConfig:
    """config with GEMM2 waiting for all of GEMM1: `GemmConfig.block_ready` ships per scheme where its A/B
    measured it faster (docs/design/triton-configs-and-tuning.md), apart from the launch shapes."""
    return dataclasses.replace(config, gemm2=dataclasses.replace(config.gemm2, block_ready=False))


# The token counts where the shipped MXFP4 files differ from the int4 shapes they otherwise copy
# (qwen3-235b-a22b on the H200: the int4 one-token entry from before int4's retune, faster for MXFP4;
# qwen3-30b-a3b, deepseek-v3 and mixtral-8x7b: searches of their own at one and eight tokens).
MXFP4_TUNED = {"NVIDIA_H100_80GB_HBM3": {"deepseek-v3": {512}, "gpt-oss-120b": {32, 2048}, "mixtral-8x7b": {128}},
               # (qwen3-30b-a3b's 8-token entry: int4's shape without its GEMM2's L2 prefetch, level for MXFP4)
               "NVIDIA_H200": {"qwen3-235b-a22b": {1}, "qwen3-30b-a3b": {1, 8}, "deepseek-v3": {1},
                               # (their 8-token entries, tuned apart, are now the int4 ones: int4's retune found
                               # mixtral-8x7b's too, and gpt-oss-120b's 128-row tiles once int4 read its scales in pairs)
                               # (gpt-oss-120b's 32: int4's 128-row entry, not timed for MXFP4)
                               "gpt-oss-120b": {1, 32}, "mixtral-8x7b": set()}}


@pytest.mark.parametrize(("gpu", "tag"), [("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
                                         ("NVIDIA H200", "NVIDIA_H200")])
@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"])
def test_mxfp4_borrows_the_int4_configs_of_its_shape(preset, gpu, tag):
    """Each preset's MXFP4 layer takes the int4 file of its shape on that GPU (gpt-oss's groups of 64, the
    others' 128), entry for entry, and says so, unless an MXFP4 file of that GPU ships (three H100 shapes,
    every preset's on the H200):
    then that one, whose entries are the int4 ones as MXFP4 serves them but where tuning found faster
    (GEMM2's block_ready aside).
    The H100's MXFP4 files do not reach the H200, whose own file borrows its int4 shapes."""
    p = get_preset(preset)
    cfg = p.config
    key = ConfigKey("mxfp4", cfg.num_experts, cfg.intermediate_size, cfg.hidden_size, cfg.top_k, "bfloat16", tag)
    assert TritonMxfp4Experts(cfg, mxfp4_w4a16(), DeviceInfo(Platform.CUDA, 0, gpu, (9, 0))).config_key == key
    int4_key = dataclasses.replace(key, kernel=f"wna16-int4-g{p.int4_group_size}")
    own = MXFP4_TUNED[tag].get(preset)
    for m in (1, 8, 32, 128, 512, 2048, 8192):
        hit, lender = configs.lookup_exact(key, m), configs.lookup_exact(int4_key, m)
        if own is None:
            assert (hit.source, hit.detail, hit.config) == ("borrowed", lender.detail, lender.config)
        else:
            assert hit.source == "tuned" and hit.detail == f"{key.file_name()} at M={m}"
            assert (_waiting_for_all(hit.config) == _waiting_for_all(borrowed_as_served(lender.config))) == (
                m not in own), m


# The token counts where a shipped H200 int8 file differs from the int4 shapes it otherwise serves.
INT8_TUNED_ON_H200 = {"deepseek-v3": {1, 2048}, "mixtral-8x7b": {1, 8}, "qwen3-30b-a3b": {1, 8}, "qwen3-235b-a22b": {1},
                      "gpt-oss-120b": {1, 8, 32, 2048}}


# gpt-oss-120b's K = N = 2880 is no multiple of 128: its int8 codes take byte quads with K padded to
# whole tiles, and borrow the int4 shapes all the same.
@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b"])
def test_int8_borrows_the_int4_configs_of_its_shape_three_stages_deep(preset, monkeypatch):
    """Symmetric int8 (per channel) on an H200 takes the int4 file of its shape, every GEMM at most
    BORROWED_MAX_STAGES deep (its words are twice int4's bytes per stage), as its layer serves it;
    a shape with an int8 file of its own differs from that only at the token counts it was tuned at
    (GEMM2's block_ready aside)."""
    from moe_triton import quantized
    from moe_triton.quantized import BORROWED_INT8_DOT_MAX_N, BORROWED_MAX_STAGES

    monkeypatch.setattr(quantized, "wgmma_capable", lambda device: True)  # as on the H200 it names

    p = get_preset(preset)
    cfg = p.config
    experts = TritonWna16Experts(cfg, int8_w8a16(-1), DeviceInfo(Platform.CUDA, 0, "NVIDIA H200", (9, 0)))
    assert experts.config_key.kernel == "wna16-int8-channel"
    int4_key = dataclasses.replace(experts.config_key, kernel=f"wna16-int4-g{p.int4_group_size}")
    own = INT8_TUNED_ON_H200.get(preset, set())
    for m in (1, 8, 32, 128, 512, 2048, 8192):
        lender, hit = configs.lookup_exact(int4_key, m), experts.file_config(m)
        as_served = _waiting_for_all(borrowed_as_served(lender.config, int8=True))
        if m in own:
            assert hit.source == "tuned" and _waiting_for_all(hit.config) != as_served, m
            continue
        assert hit.source == ("tuned" if own else "borrowed") and _waiting_for_all(hit.config) == as_served, m
        assert all(g.num_stages <= BORROWED_MAX_STAGES for g in (hit.config.gemm1, hit.config.gemm2)), m
        assert all(g.wgmma or g.block_m < 32 or g.block_n <= BORROWED_INT8_DOT_MAX_N
                   for g in (hit.config.gemm1, hit.config.gemm2)), m
    # int4's 32 x 256 tl.dot tiles at 512 tokens, served 128 wide (as int8 they spill); 16-pair ones
    # keep their width.
    for m in sorted({1, 512} - own):
        lent = configs.lookup_exact(int4_key, m).config.gemm1
        if not lent.wgmma and lent.block_n == 256:
            served = experts.file_config(m).config.gemm1
            assert served == dataclasses.replace(lent, block_n=128 if lent.block_m >= 32 else 256,
                                                 num_stages=min(lent.num_stages, BORROWED_MAX_STAGES)), m


def test_a_borrowed_entry_drops_the_lender_s_fused_decode_options(monkeypatch):
    """The one-launch path's options were measured for the lender's weights: a borrower runs the GEMMs."""
    from moe_triton.configs import FusedDecodeConfig

    lent = QuantKernelConfig(GemmConfig(16, 128, 2, 4, 5, swap_ab=True), GemmConfig(16, 128, 1, 4, 3, swap_ab=True),
                             FusedDecodeConfig(128, 4, 128))
    for int8 in (False, True):
        assert borrowed_as_served(lent, int8=int8).fused is None
    from moe_triton import quantized

    monkeypatch.setattr(quantized, "lookup_exact", lambda key, m: configs.Lookup(lent, "borrowed", "an int4 file"))
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128, dtype=torch.bfloat16)
    hit = TritonMxfp4Experts(cfg, mxfp4_w4a16(), DeviceInfo(Platform.CUDA, 0, "NVIDIA H200", (9, 0))).file_config(1)
    assert hit.config.fused is None
    assert hit.detail == "an int4 file, the lender's fused decode options dropped"  # its tl.dot GEMMs keep 5 stages


def test_mxfp4_file_of_its_own_wins(tmp_path, monkeypatch):
    """An MXFP4 file (a user's own tuning) is taken before the int4 file of the shape; another shape
    borrows nothing (the heuristic then), and int4 with zero points lends nothing."""
    p = get_preset("gpt-oss-120b")
    cfg = p.config
    key = ConfigKey("mxfp4", cfg.num_experts, cfg.intermediate_size, cfg.hidden_size, cfg.top_k, "bfloat16",
                    "NVIDIA_H200")
    own = QuantKernelConfig(GemmConfig(16, 64, 2, 4, 2, swap_ab=True), GemmConfig(16, 64, 2, 4, 2, swap_ab=True))
    configs.write_configs(key, {4: own}, tmp_path)
    configs.write_configs(dataclasses.replace(key, kernel="wna16-int4-g32-zp", hidden=256), {4: own}, tmp_path)
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    configs.reload()
    try:
        hit = configs.lookup_exact(key, 4)
        assert (hit.source, hit.config) == ("tuned", own)
        assert configs.lookup_exact(dataclasses.replace(key, hidden=256), 4) is None
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


@pytest.mark.parametrize("K", [256, 192])
def test_heuristic_treats_mxfp4_as_int4(K):
    """Without a file, MXFP4 takes the launch shapes `pick_config` gives int4 quads of its shape."""
    mxfp4, int4 = gemm1_operand(mxfp4_w4a16(), K, seed=1), gemm1_operand(int4_w4a16(64), K, seed=1)
    assert mxfp4.k_tiles == int4.k_tiles == 2
    for pairs in (2, 16, 64, 400, 4000):
        assert pick_config(pairs, 4, mxfp4, num_sms(DEV)) == pick_config(pairs, 4, int4, num_sms(DEV))


def test_borrowed_wgmma_launch_shapes_keep_three_stages_at_most(monkeypatch):
    """MXFP4's ring also holds its exponents: int4's four-stage 128 x 256 wgmma tiles (qwen3-235b-a22b
    at 2048 tokens) ran out of shared memory on an H100 by 1 KB, so a borrowed wgmma shape keeps three;
    a tl.dot one keeps its depth."""
    import moe_triton.quantized as quantized

    monkeypatch.setattr(quantized, "wgmma_capable", lambda device: True)
    cfg = get_preset("qwen3-235b-a22b").config
    device = DeviceInfo(Platform.CUDA, 0, "NVIDIA H100 80GB HBM3", (9, 0))
    lent = configs.lookup_exact(TritonWna16Experts(cfg, int4_w4a16(128), device).config_key, 2048)
    assert lent.config.gemm1.num_stages == 4 and lent.config.gemm1.wgmma
    hit = TritonMxfp4Experts(cfg, mxfp4_w4a16(), device)._find_config(2048)
    assert hit.source == "borrowed" and hit.detail.endswith("stages capped at 3")
    assert hit.config == QuantKernelConfig(*(dataclasses.replace(g, num_stages=3)
                                             for g in (lent.config.gemm1, lent.config.gemm2)))
    dot = QuantKernelConfig(GemmConfig(32, 256, 1, 4, 5, swap_ab=True), GemmConfig(32, 128, 1, 4, 4, swap_ab=True,
                                                                                    wgmma=True))
    assert quantized.borrowed_as_served(dot) == QuantKernelConfig(dot.gemm1, dataclasses.replace(dot.gemm2,
                                                                                                  num_stages=3))


def test_heuristic_groups_m_blocks_of_fp8_experts_larger_than_l2():
    """fp8 weights of 32 MiB or more per expert (mixtral-8x7b's GEMMs) launch M blocks in groups of 16
    once blocks hold 32+ pairs; smaller experts (deepseek-v3's 29 MB), 16-pair blocks and int8 do not."""
    def operand(wtype, n, k):
        meta = torch.empty(8, 0, device="meta")
        return WeightOperand(wtype, meta, meta, None, n, k, 0 if wtype is WType.FP8 else k, 128, 0)

    mixtral_w13, mixtral_w2 = operand(WType.FP8, 2 * 14336, 4096), operand(WType.FP8, 4096, 14336)
    for w in (mixtral_w13, mixtral_w2):
        assert pick_config(16, 8, w, 132).group_m == 1  # 2 pairs per expert: 16-pair blocks
        assert [pick_config(p, 8, w, 132).group_m for p in (256, 1024, 16384)] == [GROUP_M_BLOCKS] * 3
    assert pick_config(1024, 8, operand(WType.FP8, 2 * 2048, 7168), 132).group_m == 1
    assert pick_config(1024, 8, operand(WType.INT8, 2 * 14336, 4096), 132).group_m == 1


def test_heuristic_swaps_fp8_blocks_below_64_pairs():
    """fp8 blocks of up to 32 pairs with 128-wide K tiles run swapped (the weight tile on the fp8
    wgmma's 64-row side); 64-pair blocks fill that side with tokens and stay unswapped, as do 64-wide
    K tiles (gpt-oss's K = 2880); canonical int8 never swaps."""
    meta = torch.empty(8, 0, device="meta")
    fp8 = WeightOperand(WType.FP8, meta, meta, None, 2 * 768, 2048, 0, 128, 0)
    assert [(c.block_m, c.swap_ab) for c in (pick_config(p, 8, fp8, 132) for p in (8, 64, 256, 1024))] == [
        (16, True), (16, True), (32, True), (64, False)]
    narrow_k = WeightOperand(WType.FP8, meta, meta, None, 2 * 2880, 2880, 0, 64, 0)
    assert not pick_config(8, 8, narrow_k, 132).swap_ab
    int8 = WeightOperand(WType.INT8, meta, meta, None, 2 * 768, 2048, 2048, 128, 128)
    assert not pick_config(8, 8, int8, 132).swap_ab


def test_quant_config_text_names_each_gemms_kernel_and_options():
    """What `moe explain` and the benchmarks print of a launch shape: every field a file may set."""
    cfg = QuantKernelConfig(GemmConfig(16, 64, 4, 4, 3, swap_ab=True, mma=True),
                            GemmConfig(16, 128, 4, 4, 3, swap_ab=True, one_dot=True, max_registers=168, group_m=16))
    assert str(cfg) == "BM16 | gemm1 64 split4 w4 s3 swap mma | gemm2 128 split4 w4 s3 swap group16 one-dot regs168"


# Per scheme, preset and token count, the GEMMs the shipped H200 entry serving it runs on the mma kernel.
_BOTH = {"gemm1", "gemm2"}
MMA_ON_H200 = {
    ("int4", "qwen3-30b-a3b"): {1: _BOTH, 2: _BOTH, 3: _BOTH, 4: _BOTH},
    ("int4", "qwen3-235b-a22b"): {1: _BOTH, 2: _BOTH, 3: _BOTH, 4: _BOTH},
    ("int4", "gpt-oss-120b"): {1: _BOTH, 2: _BOTH},
    ("int4", "deepseek-v3"): {1: {"gemm2"}, 2: {"gemm2"}, 3: {"gemm2"}},
    ("int8", "qwen3-30b-a3b"): {1: _BOTH, 2: _BOTH},
    ("int8", "gpt-oss-120b"): {1: {"gemm2"}, 2: {"gemm2"}},
    ("mxfp4", "qwen3-30b-a3b"): {1: _BOTH, 2: _BOTH, 3: _BOTH},
    ("mxfp4", "qwen3-235b-a22b"): {1: _BOTH, 2: _BOTH, 3: _BOTH, 4: _BOTH},
    ("mxfp4", "gpt-oss-120b"): {1: _BOTH, 2: _BOTH, 3: {"gemm2"}},
    ("mxfp4", "deepseek-v3"): {1: {"gemm2"}, 2: {"gemm2"}, 3: {"gemm2"}},
}


@pytest.mark.parametrize("scheme", ["int4", "int8", "mxfp4"])
@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"])
def test_mma_entries_run_where_their_kernel_does(scheme, preset, monkeypatch):
    """The shipped H200 files ask for the mma kernel at 1-4 tokens where it measured faster (not at 5,
    which an entry keyed 5 keeps on the tl.dot kernel where one keyed 4 would take it); a layer on
    an NVIDIA GPU runs them so; an act-order one, one without a GPU (the interpreter) or a layer
    borrowing an int4 file (int8, MXFP4) on the tl.dot kernel, and the lookup says so."""
    from moe_triton import quantized
    from moe_triton._common import target

    monkeypatch.setattr(target, "interpreting", lambda: False)  # as compiled on the H200 it names
    monkeypatch.setattr(quantized, "wgmma_capable", lambda device: True)
    p = get_preset(preset)
    cfg = p.config
    h200 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H200", (9, 0))
    quants = {"int4": lambda **kw: int4_w4a16(p.int4_group_size, **kw), "int8": lambda: int8_w8a16(-1),
              "mxfp4": mxfp4_w4a16}
    cls = TritonMxfp4Experts if scheme == "mxfp4" else TritonWna16Experts
    layer = cls(cfg, quants[scheme](), h200)
    expected = MMA_ON_H200.get((scheme, preset), {})
    for m in (1, 2, 3, 4, 5, 8, 32, 128, 512, 2048, 8192):
        raw, hit = configs.lookup_exact(layer.config_key, m), layer.file_config(m)
        if hit.source != "borrowed":
            assert hit.config == raw.config
        assert {g for g in ("gemm1", "gemm2") if getattr(hit.config, g).mma} == expected.get(m, set()), m
    if not expected:
        return
    first = min(expected)
    monkeypatch.setattr(target, "interpreting", lambda: True)
    hit = layer.file_config(first)
    assert not (hit.config.gemm1.mma or hit.config.gemm2.mma) and "mma off" in hit.detail
    if scheme == "int4":  # (act-order int8 has grouped scales: another file)
        monkeypatch.setattr(target, "interpreting", lambda: False)
        hit = cls(cfg, quants[scheme](act_order=True), h200).file_config(first)
        assert not (hit.config.gemm1.mma or hit.config.gemm2.mma) and "mma off" in hit.detail
        lent = configs.lookup_exact(layer.config_key, first).config
        assert not any(g.mma for g in (borrowed_as_served(lent).gemm1, borrowed_as_served(lent, int8=True).gemm2))


def test_lender_config_keeps_the_int4_entrys_mma_gemms_where_the_layer_runs_them(monkeypatch):
    """MXFP4 and int8 layers serve a borrowed int4 entry on the tl.dot kernel (`borrowed_as_served`);
    `lender_config`, which `moe tune` times beside their own entries, is the int4 entry of their shape
    as int4 runs it, mma GEMMs kept where the layer runs that kernel and on the tl.dot kernel where it
    does not (said in the detail); a lending family has none."""
    from moe_triton import quantized
    from moe_triton._common import target

    monkeypatch.setattr(target, "interpreting", lambda: False)  # as compiled on the H200 it names
    monkeypatch.setattr(quantized, "wgmma_capable", lambda device: True)
    p = get_preset("gpt-oss-120b")
    h200 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H200", (9, 0))
    int4 = TritonWna16Experts(p.config, int4_w4a16(p.int4_group_size), h200)
    assert int4.lender_config(1) is None
    entry = configs.lookup_exact(int4.config_key, 1).config
    assert entry.gemm1.mma and entry.gemm2.mma
    borrowers = (TritonMxfp4Experts(p.config, mxfp4_w4a16(), h200), TritonWna16Experts(p.config, int8_w8a16(-1), h200))
    for layer in borrowers:
        lent = layer.lender_config(1)
        assert (lent.source, lent.config) == ("borrowed", entry) and lent.detail.startswith("wna16-int4-g64,")
    monkeypatch.setattr(target, "interpreting", lambda: True)
    for layer in borrowers:
        lent = layer.lender_config(1)
        assert lent.config == QuantKernelConfig(entry.gemm1.on_tl_dot(), entry.gemm2.on_tl_dot()), layer
        assert lent.detail.endswith("without act-order on NVIDIA sm_80 or later)")
