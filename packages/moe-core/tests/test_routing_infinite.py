"""Infinite router logits: +Inf chooses its expert, a row of -Inf chooses none (weight 0), for every
scoring of `route_torch`; finite rows route exactly as before; a layer fed them stays finite."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from moe_core import ExpertWeights, FusedMoE, MoEConfig, route_torch
from moe_core.config import GroupScoring, Routing, Scoring

INF = float("inf")
E = 8

ROUTINGS = {
    "softmax": (Routing.softmax_topk(False), None),
    "softmax-renorm": (Routing.softmax_topk(True), None),
    "sigmoid-renorm": (Routing.sigmoid_topk(True), None),
    "sqrt-softplus-renorm": (Routing(Scoring.SQRT_SOFTPLUS, renormalize=True), None),
    "deepseek-v3": (Routing.deepseek_v3(4, 2, 2.5), torch.linspace(-0.3, 0.3, E)),
    "grouped-max": (Routing(num_expert_groups=4, topk_groups=2, group_scoring=GroupScoring.MAX), None),
    "bias-on-logits": (Routing(Scoring.SIGMOID, renormalize=True, num_expert_groups=2, topk_groups=1,
                               has_correction_bias=True, correction_bias_on_logits=True), torch.linspace(1, -1, E)),
    "softmax-with-bias": (Routing(has_correction_bias=True), torch.linspace(2, -2, E)),
}


def _route(name, logits, k=2):
    routing, bias = ROUTINGS[name]
    return route_torch(logits, routing, k, bias)


def _row(*values):
    return torch.tensor([values], dtype=torch.float32)


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_one_plus_inf_logit_is_chosen_first(name):
    logits = _row(3.0, -1.0, 0.5, 2.0, 1.0, -2.0, 0.0, INF)  # expert 7: last by id, last by every bias
    weights, ids = _route(name, logits)
    assert ids[0, 0] == 7 and torch.isfinite(weights).all()
    routing, _ = ROUTINGS[name]
    if routing.scoring is Scoring.SOFTMAX:  # softmax's limit: all the probability on the +Inf expert
        assert weights[0].tolist() == [1.0, 0.0]
        if not routing.has_correction_bias:  # the others follow in the order of their logits
            assert ids[0, 1] == 0
    if routing.renormalize and routing.scoring is not Scoring.SIGMOID:
        assert weights[0, 0] == routing.routed_scaling_factor


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_several_plus_inf_logits_share_the_weight_lower_ids_first(name):
    routing, _ = ROUTINGS[name]
    logits = _row(0.0, INF, 1.0, -1.0, INF, 2.0, INF, 0.5)
    weights, ids = _route(name, logits, k=2)
    # bias-on-logits keeps one group of four: the lower of the two holding +Inf (experts 0-3), where
    # expert 2 has the best finite choice (logit + bias).
    assert ids[0].tolist() == ([1, 2] if name == "bias-on-logits" else [1, 4])
    if routing.scoring is Scoring.SOFTMAX and not routing.has_correction_bias and not routing.grouped:
        torch.testing.assert_close(weights[0], torch.full((2,), 0.5 if routing.renormalize else 1 / 3))
    weights, ids = _route(name, torch.full((1, E), INF), k=3)
    assert ids[0].tolist() == [0, 1, 2]
    share = 1 / 3 if routing.renormalize else 1 / E  # the unrenormalized routings here are softmax
    torch.testing.assert_close(weights, torch.full((1, 3), share * routing.routed_scaling_factor))


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_all_minus_inf_row_chooses_no_expert(name):
    logits = torch.cat([torch.full((1, E), -INF), torch.randn(2, E)])
    weights, ids = _route(name, logits, k=3)
    assert ids[0].tolist() == [0, 1, 2] and weights[0].tolist() == [0.0, 0.0, 0.0]
    assert torch.isfinite(weights).all() and weights[1:].sum() > 0


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_minus_inf_rules_an_expert_out(name):
    logits = torch.randn(16, E, generator=torch.Generator().manual_seed(3))
    logits[:, 2] = -INF
    weights, ids = _route(name, logits, k=3)
    assert not (ids == 2).any() and torch.isfinite(weights).all()


def test_sqrt_softplus_without_renormalization_weighs_plus_inf_infinitely():
    weights, ids = route_torch(_row(0.0, INF, 1.0, 2.0), Routing(Scoring.SQRT_SOFTPLUS), 2)
    assert ids[0].tolist() == [1, 3] and weights[0, 0] == INF and torch.isfinite(weights[0, 1])


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_finite_rows_route_as_before_beside_infinite_rows(name):
    """A finite row's routing does not depend on its neighbours being infinite, and equals the
    formula of `Routing`'s docstring computed directly (the rules above add nothing to it)."""
    gen = torch.Generator().manual_seed(7)
    finite = torch.randn(32, E, generator=gen) * 3
    mixed = torch.cat([finite, _row(*[INF] * E), _row(*[-INF] * E)])
    w_alone, ids_alone = _route(name, finite, k=3)
    w_mixed, ids_mixed = _route(name, mixed, k=3)
    assert torch.equal(ids_alone, ids_mixed[:32]) and torch.equal(w_alone, w_mixed[:32])
    routing, bias = ROUTINGS[name]
    if not routing.grouped and bias is None:
        logits = finite
        scores = {Scoring.SOFTMAX: logits.softmax(-1), Scoring.SIGMOID: logits.sigmoid(),
                  Scoring.SQRT_SOFTPLUS: torch.nn.functional.softplus(logits).sqrt()}[routing.scoring]
        top = scores.topk(3, -1)
        expected = top.values / top.values.sum(-1, keepdim=True) if routing.renormalize else top.values
        assert torch.equal(ids_alone.long(), top.indices) and torch.equal(w_alone, expected)


_BACKENDS = ["reference", pytest.param("cpu", marks=pytest.mark.skipif(
    importlib.util.find_spec("moe_cpu") is None, reason="moe-cpu is not installed"))]


@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize("routing", [Routing.softmax_topk(True), Routing.deepseek_v3(4, 2, 2.5)],
                         ids=["softmax-renorm", "deepseek-v3"])
def test_layer_output_stays_finite_on_infinite_logits(backend, routing):
    cfg = MoEConfig(E, 2, 64, 32, routing=routing, dtype=torch.float32)
    layer = FusedMoE(cfg, None, "cpu", prefer=backend)
    weights = ExpertWeights.random(cfg, layer.quant, seed=0)
    bias = torch.linspace(-0.2, 0.2, E) if routing.has_correction_bias else None
    layer.load_weights(weights, correction_bias=bias)
    x = torch.randn(4, 64)
    logits = torch.randn(4, E)
    logits[0, 5] = INF
    logits[1, [2, 6]] = INF
    logits[2] = -INF
    with torch.no_grad():
        out = layer(x, logits)
        assert torch.isfinite(out).all()
        assert not out[2].any()  # no possible expert: no routed output
        if not routing.grouped:  # softmax: as with a logit so large that the others' scores vanish
            huge = logits.clone()
            huge[0, 5] = 1e4
            huge[1, [2, 6]] = 1e4
            torch.testing.assert_close(out[:2], layer(x, huge)[:2], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out[3], layer(x, logits[3:].clone().repeat(4, 1))[3])
