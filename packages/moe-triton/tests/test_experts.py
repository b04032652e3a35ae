"""TritonExperts (bf16 / fp16 / fp32 weights) end to end against moe-core's fp32 reference.

On a machine without a GPU the kernels run under TRITON_INTERPRET=1 at tiny shapes.
"""

import dataclasses
import functools

import pytest
import torch
from _experts_support import GEMV1, GEMV2, tiny

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.experts import Support
from moe_core.presets import get_preset
from moe_core.quant import int4_w4a16, unquantized
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton import _plugin, _probe
from moe_triton.configs import KernelConfig, TileConfig
from moe_triton.experts import TritonExperts

# Small tiles keep the CPU interpreter fast; the GPU tests use the tuned database.
TINY = KernelConfig(16, TileConfig(16, 32, 2, 4, 1), TileConfig(32, 16, 1, 4, 1))


TMA = KernelConfig(16, TileConfig(16, 32, 2, 4, 1, tma=True), TileConfig(32, 16, 1, 4, 1, tma=True))


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


def test_expert_ids_outside_the_layer_are_checked_on_request(monkeypatch):
    """Experts.apply's ids must lie in [0, E); GPU kernels check that only with MOE_CHECK_EXPERT_IDS=1
    (the check synchronizes with the device), and then refuse naming the ids."""
    from moe_core import experts as experts_contract

    cfg = tiny()
    gen = torch.Generator().manual_seed(0)
    layer, _ = make_layer(cfg, torch.device("cpu"), gen)
    x = torch.randn(3, cfg.hidden_size, generator=gen)
    weights = torch.full((3, cfg.top_k), 1.0 / cfg.top_k)
    ids = torch.zeros(3, cfg.top_k, dtype=torch.int32)
    ids[1, 0] = cfg.num_experts  # one past the last expert
    for flag, refused in (("1", True), ("maybe", None)):
        monkeypatch.setenv(experts_contract.ENV_CHECK_IDS, flag)
        experts_contract.checking_ids_on_accelerators.cache_clear()
        if refused:
            with pytest.raises(ValueError, match=rf"expert ids outside \[0, {cfg.num_experts}\).*\[{cfg.num_experts}\]"):
                layer.apply(x, weights, ids)
        else:
            with pytest.raises(ValueError, match="MOE_CHECK_EXPERT_IDS='maybe'"):
                layer.apply(x, weights, ids)
    experts_contract.checking_ids_on_accelerators.cache_clear()
