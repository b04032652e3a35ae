"""Layers, operands and tolerances the quantized tests share."""

import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, MoEConfig, ParallelConfig, Routing
from moe_core.quant import int4_w4a16
from moe_core.reference import reference_moe
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton.align import align_block_size
from moe_triton.configs import GemmConfig
from moe_triton.quant_gemm import grouped_quant_gemm, quant_gemm_torch
from moe_triton.quantized import TritonMxfp4Experts, TritonWna16Experts

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# What `supports` is asked about (a Hopper GPU), and where the kernels run (the interpreter on CPU).
DEVICE = DeviceInfo(Platform.CUDA, 0, "H100", (9, 0))
RUN_ON = DEVICE if DEV.type == "cuda" else DeviceInfo(Platform.CPU)


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def run_layer(cls, quant, activation=None, dtype=torch.float16, K=128, N=128, E=4, topk=2, M=7, bias=False,
         parallel=None, seed=0, routing=None, override=None, edit_weights=None):
    cfg = MoEConfig(num_experts=E, top_k=topk, hidden_size=K, intermediate_size=N,
                    activation=activation or Activation.silu(), routing=routing or Routing.softmax_topk(True),
                    dtype=dtype, parallel=parallel or ParallelConfig(), has_bias=bias)
    assert cls.supports(cfg, quant, DEVICE), cls.supports(cfg, quant, DEVICE).reason
    weights = ExpertWeights.random(cfg, quant, seed=seed, device=DEV)
    if edit_weights is not None:
        edit_weights(weights)
    experts = cls(cfg, quant, RUN_ON)
    experts.config_override = override
    experts.load_weights(weights)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(M, K, generator=gen).to(dtype).to(DEV)
    tw, ids = route_torch(torch.randn(M, E, generator=gen).to(DEV), cfg.routing, topk)
    out = experts.apply(x, tw, ids)
    ref = reference_moe(x, weights.to(DEV), cfg, tw, ids, quant, cfg.expert_map(DEV))
    assert out.shape == (M, K) and out.dtype == dtype
    return out, ref


def garbage_buffers(monkeypatch) -> None:
    """Every new `torch.empty` buffer holds garbage (0x5A bytes), so a buffer nobody cleared shows;
    `monkeypatch.undo()` after the call restores it."""
    empty = torch.empty

    def garbage(*args, **kwargs):
        t = empty(*args, **kwargs)
        t.view(torch.uint8).fill_(0x5A)
        return t

    monkeypatch.setattr(torch, "empty", garbage)


def refuse_zeroing_launches(monkeypatch) -> None:
    """For a call that must clear its scratch without a zeroing launch of its own: that launch
    (`quantized.zeroed_int32`) fails, and every new buffer holds garbage (`garbage_buffers`).
    `monkeypatch.undo()` after the call restores both."""
    from moe_triton import quantized

    def no_zeroing_launch(numel, device):
        raise AssertionError("a zeroing launch of its own")

    monkeypatch.setattr(quantized, "zeroed_int32", no_zeroing_launch)
    garbage_buffers(monkeypatch)


def gemm1_operand(quant, K: int, seed: int):
    """GEMM1's weights (N = 256) of a 4-expert 4-bit or int8 layer, in the kernel layout."""
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=K, intermediate_size=128, dtype=torch.float16)
    cls = TritonMxfp4Experts if quant.weight.dtype.value == "fp4e2m1" else TritonWna16Experts
    experts = cls(cfg, quant, RUN_ON)
    experts.load_weights(ExpertWeights.random(cfg, quant, seed=seed, device=DEV))
    return experts._operand("w13", 256, K)


def gemm1_error(w, launch: GemmConfig, past_k: float | None = None) -> float:
    """Relative L2 error of the kernel against its twin for 5 random tokens' top-2 pairs; with past_k,
    the kernel reads the tokens from rows 128 columns longer that hold past_k after K."""
    M, topk = 5, 2
    ids = torch.randint(0, w.num_experts, (M, topk), dtype=torch.int32, device=DEV)
    x = torch.randn(M, w.k, dtype=torch.float16, device=DEV)
    if past_k is not None:
        rows = torch.full((M, w.k + 128), past_k, dtype=x.dtype, device=DEV)
        rows[:, :w.k] = x
        x = rows[:, :w.k]
    sorted_ids, expert_ids, num_post = align_block_size(ids, launch.block_m, w.num_experts)
    out = torch.zeros(M * topk, w.n, dtype=torch.float32, device=DEV)
    grouped_quant_gemm(x, w, out, sorted_ids, expert_ids, num_post, M * topk, launch, a_rows_div=topk, atomic=True)
    return rel_l2(out, quant_gemm_torch(x, w, ids.flatten(), a_rows_div=topk))


def wgmma_launch(block_m: int, block_n: int, stages: int, split: int = 1) -> GemmConfig:
    return GemmConfig(block_m, block_n, split, 4, stages, swap_ab=True, wgmma=True)


def int4_bf16_layer(seed: int):
    """A small bf16 int4 (group 128) layer with its weights, and 16 routed tokens."""
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, dtype=torch.bfloat16)
    q = int4_w4a16(128)
    experts = TritonWna16Experts(cfg, q, RUN_ON)
    weights = ExpertWeights.random(cfg, q, seed=seed, device=DEV)
    experts.load_weights(weights)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(16, 256, generator=gen).to(torch.bfloat16).to(DEV)
    tw, ids = route_torch(torch.randn(16, 4, generator=gen).to(DEV), cfg.routing, 2)
    return experts, weights, x, tw, ids
