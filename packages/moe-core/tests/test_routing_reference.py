"""The torch router and the fp32 reference MoE against independent per-token formulations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_core import Activation, ExpertWeights, MoEConfig, ParallelConfig, Routing, reference_moe, route_torch
from moe_core.quant import fp8_w8a8, int4_w4a16, unquantized
from moe_core.reference import apply_activation


def deepseek_route_per_token(logits, bias, top_k, n_group, topk_group, scale):
    """DeepSeek-V3's routing written token by token from its description."""
    M, E = logits.shape
    per = E // n_group
    ids, ws = [], []
    for t in range(M):
        s = torch.sigmoid(logits[t].double())
        c = s + bias.double()
        gscore = [sorted(c[g * per:(g + 1) * per].tolist(), reverse=True)[:2] for g in range(n_group)]
        keep = sorted(range(n_group), key=lambda g: -sum(gscore[g]))[:topk_group]
        allowed = [e for e in range(E) if e // per in keep]
        chosen = sorted(allowed, key=lambda e: -c[e].item())[:top_k]
        w = s[chosen]
        w = w / (w.sum() + 1e-20) * scale
        ids.append(chosen)
        ws.append(w.tolist())
    return torch.tensor(ws, dtype=torch.float64), torch.tensor(ids)


def test_deepseek_grouped_routing_matches_per_token():
    gen = torch.Generator().manual_seed(0)
    logits, bias = torch.randn(50, 32, generator=gen), torch.randn(32, generator=gen) * 0.5
    w, ids = route_torch(logits, Routing.deepseek_v3(8, 3, 2.5), 6, bias)
    w_ref, ids_ref = deepseek_route_per_token(logits, bias, 6, 8, 3, 2.5)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids.long().sort(-1).values, ids_ref.sort(-1).values)
    order = ids.long().argsort(-1)
    torch.testing.assert_close(w.gather(1, order).double(), w_ref.gather(1, ids_ref.argsort(-1)), rtol=1e-5, atol=1e-6)


def test_negative_bias_never_selects_masked_groups():
    logits = torch.full((1, 8), -8.0)
    bias = torch.full((8,), -1.0)
    _, ids = route_torch(logits, Routing.deepseek_v3(4, 1, 1.0), 2, bias)
    assert ids.long().div(2, rounding_mode="floor").unique().numel() == 1


@given(st.integers(1, 20), st.sampled_from([4, 8, 16]), st.integers(1, 4), st.booleans(), st.integers(0, 999))
@settings(max_examples=40, deadline=None)
def test_softmax_topk_is_softmax_of_the_topk_logits(m, e, k, renorm, seed):
    logits = torch.randn(m, e, generator=torch.Generator().manual_seed(seed))
    w, ids = route_torch(logits, Routing.softmax_topk(renorm), k)
    top = logits.topk(k, -1)
    assert torch.equal(ids.long(), top.indices)
    want = torch.softmax(top.values, -1) if renorm else torch.softmax(logits, -1).gather(1, top.indices)
    torch.testing.assert_close(w, want)


def test_llama4_and_sigmoid():
    logits = torch.randn(5, 8)
    w, _ = route_torch(logits, Routing.llama4(), 1)
    torch.testing.assert_close(w[:, 0], torch.sigmoid(logits.max(-1).values))
    w, _ids = route_torch(logits, Routing.sigmoid_topk(True), 3)
    torch.testing.assert_close(w.sum(-1), torch.ones(5))


def test_router_errors():
    with pytest.raises(ValueError, match=r"router_logits must be \[M, E\]"):
        route_torch(torch.randn(8), Routing(), 2)
    with pytest.raises(ValueError, match=r"expected correction_bias of shape \[8\], got None"):
        route_torch(torch.randn(3, 8), Routing.deepseek_v3(2, 1), 2)
    with pytest.raises(ValueError, match="correction_bias was given but"):
        route_torch(torch.randn(3, 8), Routing(), 2, torch.zeros(8))


def per_token_moe(x, w13, w2, b13, b2, weights, ids, activation, emap=None, on_input=False):
    """The MoE written per token and per choice, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if emap is not None:
                e = int(emap[e])
                if e < 0:
                    continue
            xi = x[t].double() * (weights[t, j].double() if on_input else 1)
            h = w13[e].double() @ xi + (b13[e].double() if b13 is not None else 0)
            y = w2[e].double() @ apply_activation(h, activation) + (b2[e].double() if b2 is not None else 0)
            out[t] += y if on_input else weights[t, j].double() * y
    return out


@pytest.mark.parametrize("activation", [Activation.silu(), Activation.gelu(), Activation.gelu_tanh(),
                                        Activation.swiglu_oai(), Activation.relu2()])
@pytest.mark.parametrize("bias, parallel", [(False, ParallelConfig()), (True, ParallelConfig(ep_size=3, ep_rank=1))])
def test_reference_matches_per_token_formulation(activation, bias, parallel):
    cfg = MoEConfig(7, 3, 32, 16, activation=activation, dtype=torch.float32, has_bias=bias, parallel=parallel)
    w = ExpertWeights.random(cfg, unquantized(), seed=4)
    gen = torch.Generator().manual_seed(5)
    x, logits = torch.randn(11, 32, generator=gen), torch.randn(11, 7, generator=gen)
    tw, ids = route_torch(logits, cfg.routing, cfg.top_k)
    emap = cfg.expert_map()
    got = reference_moe(x, w, cfg, tw, ids, expert_map=emap)
    want = per_token_moe(x, w.w13, w.w2, w.w13_bias, w.w2_bias, tw, ids, activation, emap)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert got.abs().sum() > 0


def test_reference_weight_on_input_and_quantized_weights():
    cfg = MoEConfig(4, 1, 64, 32, dtype=torch.float32, routing=Routing.llama4())
    w = ExpertWeights.random(cfg, int4_w4a16(32), seed=6)
    x, logits = torch.randn(9, 64), torch.randn(9, 4)
    tw, ids = route_torch(logits, cfg.routing, 1)
    d13, d2 = w.dequantize()
    want = per_token_moe(x, d13, d2, None, None, tw, ids, cfg.activation, on_input=True)
    torch.testing.assert_close(reference_moe(x, w, cfg, tw, ids).double(), want, rtol=1e-5, atol=1e-5)


def test_fp8_activation_emulation_changes_the_result_by_fp8_rounding():
    cfg = MoEConfig(4, 2, 128, 128, dtype=torch.float32)
    q = fp8_w8a8("block")
    w = ExpertWeights.random(cfg, q, seed=7)
    gen = torch.Generator().manual_seed(8)
    x, logits = torch.randn(6, 128, generator=gen), torch.randn(6, 4, generator=gen)
    tw, ids = route_torch(logits, cfg.routing, 2)
    exact = reference_moe(x, w, cfg, tw, ids)
    emulated = reference_moe(x, w, cfg, tw, ids, quant=q)
    rel = float((exact - emulated).norm() / exact.norm())
    assert 0.01 < rel < 0.08  # two e4m3 roundings (3 mantissa bits) of the GEMM inputs: ~4.5% here
    assert F.mse_loss(exact, emulated) > 0
