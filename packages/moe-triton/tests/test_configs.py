"""The tuned-config database (`moe_triton.configs`): tile limits, lookup fallbacks, the writer,
and the shipped files.
"""

import dataclasses
import json

import pytest
import torch
from _experts_support import WGMMA_TILE, tiny

from moe_core.backends import DeviceInfo, Platform
from moe_core.presets import get_preset
from moe_core.quant import unquantized
from moe_triton import configs
from moe_triton.configs import ConfigKey, KernelConfig, TileConfig
from moe_triton.experts import TritonExperts


def test_config_lookup_sources(tmp_path, monkeypatch):
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    configs.reload()
    key = ConfigKey("bf16", 128, 768, 2048, 8, "bfloat16", "GPU_A")
    small = KernelConfig(16, TileConfig(64, 128, 1, 4, 3), TileConfig(64, 128, 1, 4, 4))
    big = KernelConfig(64, TileConfig(128, 64, 8, 8, 3), TileConfig(128, 64, 8, 8, 4))
    configs.write_configs(key, {1: small, 512: big}, tmp_path)
    configs.reload()
    try:
        got = configs.lookup(key, 2)
        assert (got.config, got.source) == (small, "tuned") and "M=1" in got.detail
        assert configs.lookup(key, 400).config == big
        near = configs.lookup(ConfigKey("bf16", 128, 1536, 4096, 8, "bfloat16", "GPU_A"), 1)
        assert (near.config, near.source) == (small, "nearest-shape") and key.file_name() in near.detail
        other = configs.lookup(ConfigKey("bf16", 128, 768, 2048, 8, "bfloat16", "GPU_B"), 1)
        assert other.source == "other-device"
        assert configs.lookup(ConfigKey("bf16", 3, 1000, 100, 2, "bfloat16", "GPU_B"), 1).source == "default"
        assert configs.lookup(ConfigKey("fp8", 128, 768, 2048, 8, "bfloat16", "GPU_A"), 1).source == "default"
        data = json.loads((tmp_path / key.file_name()).read_text())
        assert data["key"]["device"] == "GPU_A"
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


def test_wgmma_tiles_are_validated():
    with pytest.raises(ValueError, match="block_k 64"):
        TileConfig(128, 128, 1, 8, 4, wgmma=True)
    with pytest.raises(ValueError, match="num_warps 8"):
        TileConfig(128, 64, 1, 4, 4, wgmma=True)
    with pytest.raises(ValueError, match="neither direct nor tma"):
        TileConfig(128, 64, 1, 8, 4, tma=True, wgmma=True)
    with pytest.raises(ValueError, match="64 or 128 rows"):
        KernelConfig(32, TileConfig(64, 64, 1, 8, 4, wgmma=True), TileConfig(64, 64, 8, 4, 3))
    assert "wgmma 128x64 g1 s4" in str(KernelConfig(128, TileConfig(128, 64, 1, 8, 4, wgmma=True), WGMMA_TILE))
    assert "wgmma 128x64 g1 s4 persistent" in str(
        KernelConfig(128, TileConfig(128, 64, 1, 8, 4, wgmma=True, persistent=True), WGMMA_TILE))
    with pytest.raises(ValueError, match="persistent is an option of the wgmma kernel"):
        TileConfig(128, 64, 1, 8, 4, persistent=True)
    with pytest.raises(ValueError, match="tail is 0, or 16 or 32 with the persistent wgmma kernel"):
        TileConfig(128, 64, 1, 8, 3, wgmma=True, tail=16)
    with pytest.raises(ValueError, match="tail is 0, or 16 or 32"):
        TileConfig(128, 64, 1, 8, 3, wgmma=True, persistent=True, tail=8)
    tail32 = TileConfig(128, 64, 1, 8, 3, wgmma=True, persistent=True, tail=32)
    assert "s3 persistent tail32" in str(KernelConfig(64, tail32, tail32))


def test_narrow_tiles_are_validated_and_offered():
    from moe_triton.tune import candidates

    with pytest.raises(ValueError, match=r"tl\.dot grouped GEMM"):
        TileConfig(128, 64, 1, 8, 4, wgmma=True, narrow=True)
    with pytest.raises(ValueError, match=r"tl\.dot grouped GEMM"):
        TileConfig(64, 64, 1, 4, 3, direct=True, narrow=True)
    with pytest.raises(ValueError, match="64 rows or more"):
        KernelConfig(32, TileConfig(64, 64, 1, 4, 3, narrow=True), TileConfig(64, 64, 1, 4, 3))
    tile = TileConfig(128, 64, 8, 8, 4, tma=True, narrow=True)
    assert "s4 tma narrow" in str(KernelConfig(128, tile, tile))
    # The tuner tries every 128-row tile both ways; smaller blocks (bandwidth-bound) only whole.
    wide = [t for t in candidates(128, True) if not t.narrow]
    assert [dataclasses.replace(t, narrow=True) for t in wide] == [t for t in candidates(128, True) if t.narrow]
    assert not any(t.narrow for t in candidates(64, True))


def test_wgmma_entry_runs_on_tl_dot_elsewhere(tmp_path, monkeypatch):
    # A file asking for the Hopper kernel, read on another device: the same widths on the tl.dot kernel.
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    cfg = tiny(num_experts=8, top_k=2, dtype=torch.bfloat16)
    tuned = KernelConfig(64, TileConfig(64, 64, 1, 8, 3, wgmma=True), WGMMA_TILE)
    key = ConfigKey("bf16", 8, cfg.intermediate_size, cfg.hidden_size, 2, "bfloat16", "NVIDIA_H100_80GB_HBM3")
    configs.write_configs(key, {64: tuned}, tmp_path)
    configs.reload()
    try:
        experts = TritonExperts(cfg, unquantized(), DeviceInfo(Platform.CPU))
        hit = experts.config_for(64)
        assert hit.source == "other-device" and "wgmma off" in hit.detail
        assert hit.config == KernelConfig(64, TileConfig(64, 64, 1, 8, 3), TileConfig(256, 64, 1, 8, 4))
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


def test_malformed_config_file_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "broken.json").write_text(json.dumps({"key": {"kernel": "bf16"}, "configs": {}}))
    monkeypatch.setenv(configs.ENV_DIR, str(tmp_path))
    configs.reload()
    try:
        with pytest.raises(ValueError, match="malformed"):
            configs.lookup(ConfigKey("bf16", 8, 8, 8, 1, "bfloat16", "X"), 1)
    finally:
        monkeypatch.delenv(configs.ENV_DIR)
        configs.reload()


def test_shipped_configs_parse():
    configs.reload()
    db = configs._load()
    for key, (path, table) in db.items():
        assert path.name == key.file_name()
        assert all(m >= 1 for m in table)


@pytest.mark.parametrize("device", ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"])
@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"])
def test_shipped_configs_cover_the_presets(preset, device):
    """Every preset has a bf16 file tuned on both GPUs, with an entry at each benchmarked token count."""
    cfg = get_preset(preset).config
    key = ConfigKey("bf16", cfg.num_experts, cfg.intermediate_size, cfg.hidden_size, cfg.top_k, "bfloat16", device)
    for m in (1, 8, 32, 128, 512, 2048, 8192):
        hit = configs.lookup(key, m)
        assert (hit.source, hit.detail) == ("tuned", f"{key.file_name()} at M={m}")
