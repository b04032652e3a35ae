"""`TritonExperts` against the fp32 reference, its GEMM against the torch twin, and the plugin glue."""

import dataclasses
import functools
import json

import pytest
import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.experts import Support
from moe_core.presets import get_preset
from moe_core.quant import int4_w4a16, unquantized
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton import _plugin, _probe, configs
from moe_triton._details.offline import run_compiler_script
from moe_triton._details.pipeline import moe_gemm, moe_gemm_torch, moe_gemv, moe_gemv_torch
from moe_triton.align import align_block_size
from moe_triton.configs import ConfigKey, KernelConfig, TileConfig
from moe_triton.experts import TritonExperts

# Small tiles keep the CPU interpreter fast; the GPU tests use the tuned database.
TINY = KernelConfig(16, TileConfig(16, 32, 2, 4, 1), TileConfig(32, 16, 1, 4, 1))
TMA = KernelConfig(16, TileConfig(16, 32, 2, 4, 1, tma=True), TileConfig(32, 16, 1, 4, 1, tma=True))
GEMV1, GEMV2 = TileConfig(8, 32, 1, 4, 1, direct=True), TileConfig(4, 16, 1, 4, 1, direct=True)
DIRECT = {"both": KernelConfig(16, GEMV1, GEMV2), "gemm1": KernelConfig(16, GEMV1, TINY.gemm2),
          "gemm2": KernelConfig(16, TINY.gemm1, GEMV2)}
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def make_layer(cfg: MoEConfig, device: torch.device, gen: torch.Generator, tiles: KernelConfig | None = TINY):
    """The layer's weights drawn on gen's device (a GPU draws real shapes in a fraction of the CPU's time)."""
    E, R, K, N = cfg.num_local_experts, cfg.w13_rows, cfg.hidden_size, cfg.intermediate_size_per_partition
    draw = functools.partial(torch.randn, generator=gen, device=gen.device)
    w13 = draw(E, R, K) / K**0.5
    w2 = draw(E, K, N) / N**0.5
    b13 = draw(E, R) * 0.1 if cfg.has_bias else None
    b2 = draw(E, K) * 0.1 if cfg.has_bias else None
    weights = ExpertWeights.from_float(w13, w2, unquantized(), b13, b2, dtype=cfg.dtype).to(device)
    info = DeviceInfo(Platform.CPU) if device.type == "cpu" else DeviceInfo(
        Platform.CUDA, device.index or 0, torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
    experts = TritonExperts(cfg, unquantized(), info)
    experts.config_override = tiles
    experts.load_weights(weights)
    return experts, weights


def run_and_compare(cfg: MoEConfig, M: int, device: torch.device, seed: int, tiles=TINY, tol=None) -> float:
    gen = torch.Generator(device=device).manual_seed(seed)
    experts, weights = make_layer(cfg, device, gen, tiles)
    draw = functools.partial(torch.randn, generator=gen, device=device)
    x = draw(M, cfg.hidden_size).to(cfg.dtype)
    logits = draw(M, cfg.num_experts)
    bias = draw(cfg.num_experts) * 0.1 if cfg.routing.has_correction_bias else None
    tw, ti = route_torch(logits, cfg.routing, cfg.top_k, bias)
    out = experts.apply(x, tw, ti)
    assert out.shape == (M, cfg.hidden_size) and out.dtype == cfg.dtype
    ref = reference_moe(x, weights, cfg, tw, ti, expert_map=cfg.expert_map(device))
    err = rel_l2(out, ref)
    assert err < (tol or TOL[cfg.dtype]), err
    return err


def tiny(**kw) -> MoEConfig:
    base = dict(num_experts=8, top_k=2, hidden_size=48, intermediate_size=40, dtype=torch.float32)
    return MoEConfig(**{**base, **kw})


@pytest.mark.parametrize("activation", [Activation.silu(), Activation.gelu(), Activation.gelu_tanh(),
                                        Activation.swiglu_oai(1.702, 7.0), Activation.relu2()], ids=str)
def test_every_activation(activation, device):
    run_and_compare(tiny(activation=activation), 21, device, seed=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_dtypes_with_bias(dtype, device):
    run_and_compare(tiny(dtype=dtype, has_bias=True, activation=Activation.swiglu_oai()), 19, device, seed=2)


@pytest.mark.parametrize("ep_rank", [0, 2])
def test_expert_map(ep_rank, device):
    # 3 ranks over 8 experts: local blocks of 3, 3 and 2; other ranks' choices contribute zero.
    cfg = tiny(top_k=3, has_bias=True, parallel=ParallelConfig(ep_size=3, ep_rank=ep_rank))
    run_and_compare(cfg, 23, device, seed=3)


def test_weight_on_input_llama4(device):
    run_and_compare(tiny(top_k=1, routing=Routing.llama4(), dtype=torch.float16), 17, device, seed=4)


def test_grouped_routing_and_odd_sizes(device):
    # K and N not multiples of the tiles exercise the masked K loop and wrapped columns.
    cfg = tiny(num_experts=16, top_k=4, hidden_size=40, intermediate_size=24,
               routing=Routing.deepseek_v3(4, 2, 2.5))
    run_and_compare(cfg, 9, device, seed=5)


def test_tma_tiles_odd_sizes_and_expert_map(device):
    # Descriptor reads past N and past K (zero-filled) must never reach the output.
    cfg = tiny(num_experts=8, top_k=3, hidden_size=40, intermediate_size=24, has_bias=True,
               parallel=ParallelConfig(ep_size=2, ep_rank=1))
    run_and_compare(cfg, 11, device, seed=15, tiles=TMA)


def test_one_token(device):
    run_and_compare(tiny(), 1, device, seed=6)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("gemm", ["gemm1", "gemm2"])
def test_gemm_matches_torch_twin(gemm, tma, device):
    gen = torch.Generator().manual_seed(7)
    M, k, E, K, N = 13, 2, 4, 48, 40
    act = Activation.gelu() if gemm == "gemm1" else None
    rows_in = M if gemm == "gemm1" else M * k
    w = (torch.randn(E, 2 * N if act else N, K, generator=gen) / K**0.5).to(device)
    bias = torch.randn(E, w.shape[1], generator=gen).to(device)
    a = torch.randn(rows_in, K, generator=gen).to(device)
    tw = torch.rand(M, k, generator=gen).to(device)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)]).int().to(device)
    expert_map = torch.tensor([0, -1, 1, 2], dtype=torch.int32, device=device)
    sorted_ids, expert_ids, total = align_block_size(ids, 16, E, expert_map)
    w_local = w[[0, 2, 3]]
    b_local = bias[[0, 2, 3]]
    out = torch.randn(M * k, N, generator=gen).to(device)
    twin = out.clone()
    kw = dict(top_k=k, block_m=16, activation=act, mul_weight=True, zero_foreign=True)
    tile = TileConfig(16, 16, 2, 4, 1, tma=tma)
    moe_gemm(a, w_local, b_local, out, tw, sorted_ids, expert_ids, total, tile=tile, **kw)
    moe_gemm_torch(a, w_local, b_local, twin, tw, sorted_ids, expert_ids, total, **kw)
    torch.testing.assert_close(out, twin, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("gemm", ["gemm1", "gemm2"])
def test_gemm_narrow_blocks_match_torch_twin(gemm, tma, device):
    """Narrow tiles over 128-row blocks: an expert's last block with at most 64 valid rows multiplies
    only its first 64 (`moe_gemm_kernel`'s NARROW); the others all 128."""
    gen = torch.Generator().manual_seed(11)
    M, k, E, K, N = 160, 2, 3, 32, 24
    act = Activation.silu() if gemm == "gemm1" else None
    # Choices per expert 150, 100, 70: blocks of 128 and 22 (narrow), 100 and 70 rows.
    ids = torch.tensor([[0, 1] if t < 90 else [0, 2] if t < 150 else [1, 2] for t in range(M)], dtype=torch.int32)
    ids = ids[torch.randperm(M, generator=gen)].to(device)
    w = (torch.randn(E, 2 * N if act else N, K, generator=gen) / K**0.5).to(device)
    bias = torch.randn(E, w.shape[1], generator=gen).to(device)
    a = torch.randn(M if act else M * k, K, generator=gen).to(device)
    tw = torch.rand(M, k, generator=gen).to(device)
    sorted_ids, expert_ids, total = align_block_size(ids, 128, E)
    valid = [(sorted_ids[b * 128:(b + 1) * 128] < M * k).sum().item() for b in range(int(total) // 128)]
    assert any(v <= 64 for v in valid) and any(v > 64 for v in valid), valid
    out = torch.randn(M * k, N, generator=gen).to(device)
    twin = out.clone()
    kw = dict(top_k=k, block_m=128, activation=act, mul_weight=True, zero_foreign=True)
    tile = TileConfig(16, 16, 1, 4, 1, tma=tma, narrow=True)
    moe_gemm(a, w, bias, out, tw, sorted_ids, expert_ids, total, tile=tile, **kw)
    moe_gemm_torch(a, w, bias, twin, tw, sorted_ids, expert_ids, total, **kw)
    torch.testing.assert_close(out, twin, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("gemm", ["gemm1", "gemm2"])
def test_gemv_matches_torch_twin(gemm, device):
    # K = 40 is not a multiple of block_k, N = 20 not of block_n: the masked K loop and wrapped rows.
    gen = torch.Generator().manual_seed(12)
    M, k, E, K, N = 5, 3, 4, 40, 20
    act = Activation.swiglu_oai(1.702, 7.0) if gemm == "gemm1" else None
    w = (torch.randn(E, 2 * N if act else N, K, generator=gen) / K**0.5).to(device)
    bias = torch.randn(E, w.shape[1], generator=gen).to(device)
    a = torch.randn(M if act else M * k, K, generator=gen).to(device)
    tw = torch.rand(M, k, generator=gen).to(device)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)]).int().to(device)
    expert_map = torch.tensor([0, -1, 1, 2], dtype=torch.int32, device=device)
    w_local, b_local = w[[0, 2, 3]], bias[[0, 2, 3]]
    out = torch.zeros(M * k if act else M, N, device=device)
    twin = out.clone()
    kw = dict(activation=act, mul_weight=True)
    moe_gemv(a, w_local, b_local, out, tw, ids, expert_map, tile=GEMV1 if act else GEMV2, **kw)
    moe_gemv_torch(a, w_local, b_local, twin, tw, ids, expert_map, **kw)
    torch.testing.assert_close(out, twin, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("direct", list(DIRECT))
def test_direct_kernels_end_to_end(direct, device):
    # Either GEMM may be direct: both write the intermediate in choice order.
    cfg = tiny(top_k=3, has_bias=True, parallel=ParallelConfig(ep_size=3, ep_rank=1))
    run_and_compare(cfg, 3, device, seed=13, tiles=DIRECT[direct])


def test_direct_weight_on_input(device):
    run_and_compare(tiny(top_k=1, routing=Routing.llama4(), dtype=torch.bfloat16), 2, device, seed=14,
                    tiles=DIRECT["both"])


def test_reload_is_idempotent(device):
    gen = torch.Generator().manual_seed(8)
    cfg = tiny(has_bias=True)
    experts, weights = make_layer(cfg, device, gen)
    first = dict(experts.weights.tensors)
    experts.load_weights(weights)
    assert experts.weights.layout == "triton.canonical"
    for name, t in experts.weights.tensors.items():
        assert torch.equal(t, first[name])


def test_rejects_bad_input(device):
    experts, _ = make_layer(tiny(), device, torch.Generator().manual_seed(9))
    x = torch.randn(3, 48, device=device)
    tw, ti = torch.rand(3, 2, device=device), torch.zeros(3, 2, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="hidden_states"):
        experts.apply(x[:, :40], tw, ti)
    with pytest.raises(ValueError, match="dtype"):
        experts.apply(x.half(), tw, ti)
    with pytest.raises(ValueError, match="topk_ids"):
        experts.apply(x, tw, ti.long())
    with pytest.raises(ValueError, match="topk_weights"):
        experts.apply(x, tw.half(), ti)


def test_capability_and_plugin_glue():
    spec = _plugin.backend_spec()
    assert spec.name == "triton" and spec.probe == "moe_triton._probe:probe"
    assert "moe_triton.experts:TritonExperts" in {r.path for r in spec.experts}
    assert isinstance(_probe.probe(), Support)
    cfg = get_preset("qwen3-30b-a3b").config
    h100 = DeviceInfo(Platform.CUDA, 0, "NVIDIA H100 80GB HBM3", (9, 0))
    assert TritonExperts.supports(cfg, unquantized(), h100)
    assert not TritonExperts.supports(cfg, unquantized(), DeviceInfo(Platform.CPU))
    assert not TritonExperts.supports(cfg, unquantized(), DeviceInfo(Platform.CUDA, 0, "V100", (7, 0)))
    assert "int4" in TritonExperts.supports(cfg, int4_w4a16(128), h100).reason


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


WGMMA_TILE = TileConfig(256, 64, 1, 8, 4, wgmma=True)


def test_tuner_offers_wgmma_tiles_on_hopper_only():
    from moe_triton.tune import candidates

    for gated in (True, False):
        assert not any(t.wgmma for t in candidates(128, gated))
        assert not any(t.wgmma for t in candidates(32, gated, wgmma=True))  # the kernel takes 64 or 128 rows
        tiles = [t for t in candidates(128, gated, wgmma=True) if t.wgmma and not t.persistent]
        # 128 and 256 weight rows per program (gated: half as many output columns), N first or grouped by 8
        assert {(t.block_n * (2 if gated else 1), t.group_m) for t in tiles} == {(128, 1), (128, 8), (256, 1), (256, 8)}
        persistent = [t for t in candidates(128, gated, wgmma=True) if t.persistent]
        assert {(t.block_n * (2 if gated else 1), t.group_m, t.num_stages, t.tail) for t in persistent} == {
            (256, 1, 4, 0), (256, 4, 4, 0), (256, 8, 4, 0), (256, 8, 4, 16), (256, 8, 4, 32)}
        assert all(KernelConfig(128, t, t) for t in tiles)


def test_wgmma_gemm_refused_off_hopper():
    # The Gluon kernel exists for sm_90 only: a clear error elsewhere (here CPU tensors), never a
    # silent fallback.
    # The refusal comes before any launch: sorted ids built by hand (on a GPU machine the CPU
    # tensors could not go through the alignment kernel).
    gen = torch.Generator().manual_seed(9)
    sorted_ids = torch.cat([torch.arange(10, dtype=torch.int32), torch.full((54,), 10, dtype=torch.int32)])
    expert_ids, total = torch.zeros(1, dtype=torch.int32), torch.tensor([64], dtype=torch.int32)
    a = torch.randn(10, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(4, 256, 64, generator=gen).to(torch.bfloat16)
    out = torch.empty(10, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"wgmma GEMM \(TileConfig.wgmma\) needs an NVIDIA Hopper GPU \(sm_90\)"):
        moe_gemm(a, w, None, out, torch.rand(5, 2), sorted_ids, expert_ids, total, top_k=2, block_m=64,
                 tile=WGMMA_TILE, activation=None, mul_weight=True, zero_foreign=True)


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


# ---- real shapes on a GPU -----------------------------------------------------------------------

GPU_SHAPES = {
    # name: (preset, experts kept so the fp32 reference fits, M values)
    "qwen3-30b-a3b": ("qwen3-30b-a3b", None, (1, 64, 2048)),
    "mixtral-8x7b": ("mixtral-8x7b", None, (1, 300, 2048)),  # 2048: the H100 file's persistent wgmma tiles
    "gpt-oss-120b": ("gpt-oss-120b", 32, (1, 512)),
    "deepseek-v3": ("deepseek-v3", 32, (8, 1024)),
}


@pytest.mark.device("cuda")
@pytest.mark.parametrize("name", list(GPU_SHAPES))
def test_real_shapes_on_gpu(name):
    preset, experts, ms = GPU_SHAPES[name]
    cfg = get_preset(preset).config
    if experts is not None:
        r = cfg.routing
        routing = Routing.deepseek_v3(8, 4, 2.5) if r.grouped else r
        cfg = MoEConfig(num_experts=experts, top_k=cfg.top_k, hidden_size=cfg.hidden_size,
                        intermediate_size=cfg.intermediate_size, activation=cfg.activation, routing=routing,
                        has_bias=cfg.has_bias)
    for M in ms:
        run_and_compare(cfg, M, torch.device("cuda"), seed=M, tiles=None)


@pytest.mark.device("cuda")
@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-120b"])
def test_direct_kernels_on_gpu(name):
    # The decode kernels at real widths, whatever the tuned database picks; gpt-oss has biases and
    # its clamped SwiGLU, and K = 2880 is not a multiple of block_k.
    cfg = get_preset(name).config
    if cfg.num_experts > 32:
        cfg = MoEConfig(num_experts=32, top_k=cfg.top_k, hidden_size=cfg.hidden_size,
                        intermediate_size=cfg.intermediate_size, activation=cfg.activation,
                        routing=cfg.routing, has_bias=cfg.has_bias)
    tiles = KernelConfig(16, TileConfig(16, 256, 1, 4, 3, direct=True), TileConfig(8, 128, 1, 4, 3, direct=True))
    for M in (1, 5):
        run_and_compare(cfg, M, torch.device("cuda"), seed=M, tiles=tiles)


def _wgmma_tiles(block_m: int, rows1: int, rows2: int, stages: int, persistent: bool = False) -> KernelConfig:
    """Both GEMMs on the wgmma kernel: rows1 / rows2 weight rows per program (GEMM1 gated: half as many columns)."""
    return KernelConfig(block_m, TileConfig(rows1 // 2, 64, 1, 8, stages, wgmma=True, persistent=persistent),
                        TileConfig(rows2, 64, 1, 8, stages, wgmma=True, persistent=persistent))


WGMMA_CASES = {
    # name: (config, tokens, tiles)
    "qwen3-30b-bm128": (get_preset("qwen3-30b-a3b").config, 700, _wgmma_tiles(128, 256, 256, 4)),
    "qwen3-30b-bm64": (get_preset("qwen3-30b-a3b").config, 300, _wgmma_tiles(64, 128, 128, 3)),
    # biases, the clamped SwiGLU, N = K = 2880 (45 K tiles, a partial N tile)
    "gpt-oss-32x": (MoEConfig(num_experts=32, top_k=4, hidden_size=2880, intermediate_size=2880,
                              activation=Activation.swiglu_oai(1.702, 7.0), has_bias=True), 256,
                    _wgmma_tiles(128, 256, 256, 4)),
    # fp16, K and N tails, GELU, other ranks' experts (zeroed blocks)
    "odd-fp16-ep": (MoEConfig(num_experts=16, top_k=3, hidden_size=1000, intermediate_size=520,
                              activation=Activation.gelu(), has_bias=True, dtype=torch.float16,
                              parallel=ParallelConfig(ep_size=2, ep_rank=1)), 333, _wgmma_tiles(64, 256, 128, 2)),
    # top-1 with the router weight on the input (Llama4)
    "llama4-weight-on-input": (MoEConfig(num_experts=16, top_k=1, hidden_size=1024, intermediate_size=512,
                                         routing=Routing.llama4()), 200, _wgmma_tiles(128, 128, 256, 4)),
}


@pytest.mark.device("cuda")
@pytest.mark.parametrize("persistent", [False, True], ids=["per-tile", "persistent"])
@pytest.mark.parametrize("name", list(WGMMA_CASES))
def test_wgmma_gemm_on_gpu(name, persistent):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wgmma kernel is Hopper-only (its refusal elsewhere: test_wgmma_gemm_refused_off_hopper)")
    cfg, M, tiles = WGMMA_CASES[name]
    if persistent:
        tiles = KernelConfig(tiles.block_m, dataclasses.replace(tiles.gemm1, persistent=True),
                             dataclasses.replace(tiles.gemm2, persistent=True))
    run_and_compare(cfg, M, torch.device("cuda"), seed=M, tiles=tiles)


@pytest.mark.device("cuda")
@pytest.mark.parametrize("tail", [16, 32])
@pytest.mark.parametrize("gemm", ["gemm1", "gemm2"])
def test_persistent_tails_match_torch_twin(gemm, tail):
    """A full 128-row block takes in its expert's last block of at most `tail` rows (`TileConfig.tail`):
    experts of 128 + 16, 128 + 17, 128 + 33, 256 + 3, 5, 0 and 128 rows, and one another rank owns."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wgmma kernel is Hopper-only (its refusal elsewhere: test_wgmma_gemm_refused_off_hopper)")
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(tail)
    counts = [144, 145, 161, 259, 5, 0, 128, 40]
    E, K, N = len(counts), 192, 128
    ids = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in enumerate(counts)])
    M = ids.numel()
    ids = ids[torch.randperm(M, generator=gen)][:, None].to(dev)  # one choice per token
    expert_map = torch.tensor([0, 1, 2, 3, 4, 5, 6, -1], dtype=torch.int32, device=dev)
    sorted_ids, expert_ids, total = align_block_size(ids, 128, E, expert_map)
    act = Activation.silu() if gemm == "gemm1" else None
    w = (torch.randn(E - 1, 2 * N if act else N, K, generator=gen) / K**0.5).to(dev, torch.bfloat16)
    bias = torch.randn(E - 1, w.shape[1], generator=gen).to(dev)
    a = torch.randn(M, K, generator=gen).to(dev, torch.bfloat16)
    tw = torch.rand(M, 1, generator=gen).to(dev)
    out = torch.randn(M, N, generator=gen).to(dev, torch.bfloat16)
    twin = out.clone()
    kw = dict(top_k=1, block_m=128, activation=act, mul_weight=True, zero_foreign=True)
    tile = TileConfig(N // 2 if act else N, 64, 1, 8, 3, wgmma=True, persistent=True, tail=tail)
    moe_gemm(a, w, bias, out, tw, sorted_ids, expert_ids, total, tile=tile, **kw)
    moe_gemm_torch(a, w, bias, twin, tw, sorted_ids, expert_ids, total, **kw)
    torch.testing.assert_close(out.float(), twin.float(), atol=3e-2, rtol=2e-2)


@pytest.mark.device("cuda")
@pytest.mark.parametrize("tokens", [1, 3000])
def test_persistent_wgmma_gemm_loops_over_more_tiles_than_programs(tokens):
    """More tiles than SMs (each program runs several, the ring's phases carry across tiles), and
    fewer (programs without a second tile)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wgmma kernel is Hopper-only (its refusal elsewhere: test_wgmma_gemm_refused_off_hopper)")
    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=512, intermediate_size=768)
    run_and_compare(cfg, tokens, torch.device("cuda"), seed=tokens, tiles=_wgmma_tiles(128, 256, 128, 3, True))


@pytest.mark.device("cuda")
def test_fused_moe_layer_through_the_oracle():
    from moe_core.layer import FusedMoE

    cfg = get_preset("qwen3-30b-a3b").config
    layer = FusedMoE(cfg, device="cuda", prefer="triton")
    assert layer.plan.backend == "triton" and layer.plan.experts_cls is TritonExperts
    gen = torch.Generator().manual_seed(11)
    E, R, K, N = cfg.num_experts, cfg.w13_rows, cfg.hidden_size, cfg.intermediate_size
    weights = ExpertWeights.from_float(torch.randn(E, R, K, generator=gen) / K**0.5,
                                       torch.randn(E, K, N, generator=gen) / N**0.5, unquantized())
    layer.load_weights(weights)
    x = torch.randn(77, K, generator=gen).cuda().bfloat16()
    logits = torch.randn(77, E, generator=gen).cuda()
    out = layer(x, logits)
    tw, ti = route_torch(logits, cfg.routing, cfg.top_k)
    assert rel_l2(out, reference_moe(x, weights.to("cuda"), cfg, tw, ti)) < 1e-2


@pytest.mark.parametrize("device", ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"])
@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"])
def test_shipped_configs_cover_the_presets(preset, device):
    """Every preset has a bf16 file tuned on both GPUs, with an entry at each benchmarked token count."""
    cfg = get_preset(preset).config
    key = ConfigKey("bf16", cfg.num_experts, cfg.intermediate_size, cfg.hidden_size, cfg.top_k, "bfloat16", device)
    for m in (1, 8, 32, 128, 512, 2048, 8192):
        hit = configs.lookup(key, m)
        assert (hit.source, hit.detail) == ("tuned", f"{key.file_name()} at M={m}")


def test_moe_tune_forwards_its_options(capsys):
    from moe_core import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["tune", "--help"])
    assert exit_info.value.code == 0 and "--quant {none,int4}" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert cli.main(["tune", "--quant", "int4"]) == 2
        assert "torch sees no GPU" in capsys.readouterr().err


_COMPILE_BF16 = """
from moe_triton._details import gemm_kernels as gk
from moe_triton._details.offline import compile_kernel
ptrs = {"a_ptr": "*bf16", "b_ptr": "*bf16", "b_desc": "*bf16", "bias_ptr": "*bf16", "c_ptr": "*bf16",
        "topk_weights_ptr": "*fp32", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "total_ptr": "*i32",
        "x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "topk_ids_ptr": "*i32", "expert_map_ptr": "*i32",
        "alpha": "fp32", "limit": "fp32"}
compile_kernel(gk.moe_gemm_kernel, dict(A_ROW_DIV=8, GATED=True, ACT=gk.ACT_SILU, HAS_BIAS=False, MUL_WEIGHT=False,
                                        ZERO_FOREIGN=False, EVEN_K=True, B_TMA=False, UPCAST=False,
                                        DOT_PRECISION="tf32", BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8,
                                        NARROW=False, PDL=True), ptrs)
# 128-row blocks with their narrow half-block path.
compile_kernel(gk.moe_gemm_kernel, dict(A_ROW_DIV=8, GATED=True, ACT=gk.ACT_SILU, HAS_BIAS=False, MUL_WEIGHT=False,
                                        ZERO_FOREIGN=True, EVEN_K=True, B_TMA=False, UPCAST=False,
                                        DOT_PRECISION="tf32", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                                        NARROW=True, PDL=True), ptrs, num_warps=8, num_stages=4)
direct = dict(HAS_BIAS=True, MUL_WEIGHT=False, HAS_MAP=False, EVEN_K=True, BLOCK_N=8, BLOCK_K=256, PDL=True)
compile_kernel(gk.moe_gemv1_kernel, dict(direct, TOP_K=8, GATED=True, ACT=gk.ACT_SWIGLU_OAI), ptrs)
compile_kernel(gk.moe_gemv2_kernel, dict(direct, TOP_K=8, K_P2=8), ptrs)
from moe_triton._details.offline import compile_bf16_wgmma_gemm
# GEMM1 (SiLU) of 128-row blocks; GEMM2 with bias, router weight and zeroed foreign blocks; 64-row
# blocks with a K tail, the clamped SwiGLU, fp16 and sizes and strides that are not multiples of 16
# (cp.async needs 16-byte pieces: Triton must see them from multiples of 8). Each per tile, persistent,
# and persistent with 32-row tails (the largest ring).
for consts, fp16 in ((dict(), False),
                     (dict(GATED=False, ACT=0, A_ROW_DIV=1, HAS_BIAS=True, MUL_WEIGHT=True, ZERO_FOREIGN=True), False),
                     (dict(BLOCK_M=64, BLOCK_N=128, STAGES=3, ACT=gk.ACT_SWIGLU_OAI, HAS_BIAS=True, K_TAIL=True), True)):
    ptr16 = "*fp16" if fp16 else "*bf16"
    for persistent, tail in ((False, 0), (True, 0), (True, 32)):
        k = compile_bf16_wgmma_gemm({**consts, "TAIL": tail} if persistent else consts,
                                    {"a_ptr": ptr16, "c_ptr": ptr16}, aligned_ints=not fp16, persistent=persistent)
        assert k.metadata.shared <= 232448, k.metadata.shared  # an H100 block's shared memory
print("built")
"""


def test_kernels_compile_for_hopper():
    """Triton's compiler on the bf16 GEMM and the direct kernels for sm_90, launched dependent (their
    griddepcontrol code never runs under the interpreter), and on the Gluon wgmma GEMM, which the
    interpreter cannot run; in a child process, since this module may interpret the kernels."""
    assert run_compiler_script(_COMPILE_BF16).split() == ["built"]
