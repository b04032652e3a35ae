"""The moe-triton kernels moe-cuda runs around the vendor GEMMs, against moe-cuda's torch twins: its
classes' router on CUDA (moe-triton's) against moe-core's route_torch, infinite logits included; the
activation (`moe_cuda.dispatch.activate` on CUDA) against apply_activation; the SGLang class's 1 x 128
fp8 quantization against moe-triton's twin `act_quant_torch`; Marlin's top-k sum against its torch form; the grouped
classes' gathered top-k sum against the torch combine. On the
CPU they run under TRITON_INTERPRET (conftest); on a GPU, on the GPU."""

from __future__ import annotations

import pytest
import torch

from moe_core.config import Activation, ActivationKind, Routing
from moe_core.oracle import router_of
from moe_core.reference import apply_activation
from moe_core.routing import route_torch
from moe_cuda import dispatch
from moe_cuda.flashinfer import FlashInferCutlassExperts, FlashInferTrtllmBf16Experts
from moe_cuda.grouped_mm import TorchFp8GroupedMmExperts, TorchGroupedMmExperts
from moe_cuda.marlin import MarlinExperts
from moe_cuda.sglang_fp8 import SglangFp8BlockExperts
from moe_triton.act_quant import QMode, act_quant, act_quant_torch
from moe_triton.routing import route as route_one_launch
from moe_triton.topk_sum import gather_topk_sum, topk_sum

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INF = float("inf")
CLASSES = (MarlinExperts, SglangFp8BlockExperts, TorchGroupedMmExperts, TorchFp8GroupedMmExperts,
           FlashInferCutlassExperts, FlashInferTrtllmBf16Experts)


def _logits(m: int, e: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, e, generator=gen) * 3).to(dtype).to(DEVICE)


def test_every_class_routes_with_one_launch_on_cuda_and_its_twin_on_the_cpu(monkeypatch):
    assert all(router_of(cls) is dispatch.route for cls in CLASSES)
    logits, routing = _logits(5, 16, seed=1).cpu(), Routing(renormalize=True)
    ref_w, ref_ids = route_torch(logits, routing, 4)
    monkeypatch.setattr(dispatch, "route_one_launch", lambda *args: pytest.fail("a Triton launch on CPU tensors"))
    weights, ids = dispatch.route(logits, routing, 4)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_w)
    if torch.cuda.is_available():
        monkeypatch.undo()
        monkeypatch.setattr(dispatch, "route_torch", lambda *args: pytest.fail("route_torch ran on CUDA tensors"))
        weights, ids = dispatch.route(logits.cuda(), routing, 4)
        assert torch.equal(ids.cpu(), ref_ids)
        torch.testing.assert_close(weights.cpu(), ref_w, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("e,top_k", [(8, 2), (60, 4), (128, 8), (7, 1)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_router_chooses_and_weighs_as_route_torch(e, top_k, renormalize, dtype):
    routing = Routing(renormalize=renormalize, routed_scaling_factor=1.0 if renormalize else 2.5)
    logits = _logits(37, e, seed=e + top_k, dtype=dtype)
    weights, ids = route_one_launch(logits, routing, top_k)
    ref_w, ref_ids = route_torch(logits, routing, top_k)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    # bf16 logits tie often: the chosen set may differ only among equal logits, which then weigh the same
    same = ids.sort(-1).values == ref_ids.sort(-1).values
    chosen = logits.float().gather(1, ids.long()).sort(-1).values
    assert (same | (chosen == logits.float().gather(1, ref_ids.long()).sort(-1).values)).all()
    torch.testing.assert_close(weights.sort(-1).values, ref_w.sort(-1).values, rtol=2e-6, atol=1e-7)


def test_the_router_takes_infinite_logits_as_route_torch():
    routing = Routing(renormalize=True)
    logits = _logits(6, 16, seed=3)
    logits[0, 5] = INF  # one +Inf: all the weight
    logits[1, [2, 9]] = INF  # two +Inf: shared, lower id first
    logits[2, :] = -INF  # no expert: weight 0, ids 0..k-1
    logits[3, [0, 1, 2]] = -INF  # some -Inf: never chosen while finite ones remain
    logits[4, 3:] = -INF  # fewer finite experts than k: -Inf ones follow, lower id first
    logits[5, [4, 7, 11]] = INF  # more +Inf experts than k
    for top_k in (1, 4):
        weights, ids = route_one_launch(logits, routing, top_k)
        ref_w, ref_ids = route_torch(logits, routing, top_k)
        assert torch.equal(ids, ref_ids), (top_k, ids, ref_ids)
        torch.testing.assert_close(weights, ref_w, rtol=2e-6, atol=1e-7)


# Every kind the moe-cuda classes take (clamped SiLU is a feature none of them claims).
_ACTIVATIONS = [Activation.silu(), Activation(ActivationKind.GELU),
                Activation(ActivationKind.GELU_TANH), Activation(ActivationKind.SWIGLU_OAI, alpha=1.702, limit=7.0),
                Activation(ActivationKind.RELU2)]


def _activate(h: torch.Tensor, activation: Activation) -> torch.Tensor:
    """What `moe_cuda.dispatch.activate` runs on CUDA."""
    return act_quant(h, activation, QMode.NONE, h.dtype, h.shape[0])[0]


@pytest.mark.parametrize("activation", _ACTIVATIONS, ids=lambda a: a.kind.value)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_activation_matches_apply_activation(activation, dtype):
    gen = torch.Generator().manual_seed(5)
    n = 1100  # a width that is no power of two
    width = 2 * n if activation.kind.gated else n
    h = (torch.randn(9, width, generator=gen) * 4).to(dtype).to(DEVICE)
    out = _activate(h, activation)
    ref = apply_activation(h.float(), activation)
    assert out.shape == (9, n) and out.dtype == dtype
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
    # rows strided as GEMM outputs can be: the pass reads rows through their stride
    wide = torch.zeros(9, width + 64, dtype=dtype, device=DEVICE)
    wide[:, :width] = h
    torch.testing.assert_close(_activate(wide[:, :width], activation), out, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_group_quantization_matches_its_twin(dtype):
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(11, 384, generator=gen) * torch.logspace(-3, 3, 11)[:, None]).to(dtype)
    x[3, 128:256] = 0  # an all-zero group: the smallest scale, zero codes
    x = x.to(DEVICE)
    codes, scales = act_quant(x, None, QMode.GROUP128, torch.float8_e4m3fn, x.shape[0])  # as the SGLang class
    ref_codes, ref_scales = act_quant_torch(x, None, QMode.GROUP128, torch.float8_e4m3fn, x.shape[0])
    assert codes.dtype == torch.float8_e4m3fn and scales.shape == (11, 3)
    torch.testing.assert_close(scales, ref_scales, rtol=0, atol=0)
    assert torch.equal(codes.view(torch.uint8), ref_codes.view(torch.uint8))


@pytest.mark.parametrize("top_k", [1, 2, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_topk_sum_matches_marlins_torch_form(top_k, dtype):
    gen = torch.Generator().manual_seed(top_k)
    M, K = 5, 1100  # two column blocks, the second partial
    y = (torch.randn(M * top_k, K, generator=gen) * 3).to(dtype).to(DEVICE)
    out = topk_sum(y, top_k, dtype)
    ref = y.view(M, top_k, K).sum(1, dtype=torch.float32).to(dtype)
    assert out.dtype == dtype and out.shape == (M, K)
    torch.testing.assert_close(out, ref, rtol=0 if dtype == torch.float32 else 1e-2, atol=1e-5)


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("expert_map", [None, torch.tensor([-1, 0, 1, -1, 2])], ids=["all-local", "expert-parallel"])
def test_the_gathered_combine_matches_the_torch_combine(weighted, expert_map):
    """`dispatch.combine` (on CUDA one `gather_topk_sum` pass over the choices' slots, elsewhere its
    torch twin) against the sorted rows put back in (token, choice) order and summed, rows of other
    ranks' experts holding NaN."""
    gen = torch.Generator().manual_seed(3)
    M, top_k, K, E = 6, 3, 1100, 5
    ids = torch.randint(0, E, (M, top_k), generator=gen)
    weights = torch.rand(M, top_k, generator=gen)
    local_experts = 3 if expert_map is not None else E
    perm = dispatch.permute_by_expert(weights, ids, local_experts, expert_map)
    y = torch.randn(M * top_k, K, generator=gen).to(torch.bfloat16)
    y[~perm.local] = float("nan")
    scale = torch.where(perm.local, perm.weight if weighted else torch.ones_like(perm.weight), 0.0)
    contrib = torch.where(perm.local[:, None], y.float(), 0.0) * scale[:, None]
    ref = torch.empty_like(contrib).index_copy_(0, perm.pair, contrib).view(M, top_k, K).sum(1).to(y.dtype)
    twin = dispatch.combine(y, perm, M, weighted)
    gathered = gather_topk_sum(y.to(DEVICE), perm.slot.to(DEVICE), top_k, y.dtype,
                               perm.weight.to(DEVICE) if weighted else None)
    assert not ref.isnan().any()
    torch.testing.assert_close(twin.float(), ref.float(), rtol=8e-3, atol=1e-5)
    torch.testing.assert_close(gathered.cpu().float(), ref.float(), rtol=8e-3, atol=1e-5)
