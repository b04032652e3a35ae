"""Routing and expert semantics added for the transformers model table: group-limited greedy (a group
scored by its best expert), sqrt-softplus scores, a selection bias on the logits, clamped SiLU; each
against a direct transcription of the model code, and each refused by experts classes that do not
declare it (`Capability.features`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from moe_core import FusedMoE, MoEConfig, route_torch
from moe_core.backends import Platform, detect_device
from moe_core.config import Activation, Feature, GroupScoring, Routing, Scoring
from moe_core.experts import UNQUANTIZED, Capability, Experts
from moe_core.reference import ReferenceExperts, apply_activation

M, E, TOP_K = 64, 8, 2


def _logits(seed: int) -> torch.Tensor:
    return torch.randn(M, E, generator=torch.Generator().manual_seed(seed)) * 2


def _same_choice(weights, ids, expected_weights, expected_ids):
    order, expected_order = ids.long().sort(-1), expected_ids.sort(-1)
    assert torch.equal(order.values, expected_order.values)
    torch.testing.assert_close(weights.gather(1, order.indices), expected_weights.gather(1, expected_order.indices))


def test_group_limited_greedy_scores_a_group_by_its_best_expert():
    logits = _logits(0)
    routing = Routing(num_expert_groups=4, topk_groups=2, group_scoring=GroupScoring.MAX, routed_scaling_factor=2.0)
    weights, ids = route_torch(logits, routing, TOP_K)
    # DeepSeek-V2's group_limited_greedy, transcribed
    scores = logits.softmax(-1)
    group_scores = scores.view(M, 4, 2).max(-1).values
    mask = torch.zeros(M, 4).scatter_(1, group_scores.topk(2, -1).indices, 1).repeat_interleave(2, -1).bool()
    expected_w, expected_ids = scores.masked_fill(~mask, 0.0).topk(TOP_K, -1)
    _same_choice(weights, ids, expected_w * 2.0, expected_ids)
    assert Feature.GROUP_SCORE_MAX in routing.features
    assert not Routing(num_expert_groups=4, topk_groups=2).features


def test_sqrt_softplus_scores():
    logits = _logits(1)
    weights, ids = route_torch(logits, Routing(Scoring.SQRT_SOFTPLUS, renormalize=True), TOP_K)
    scores = F.softplus(logits).sqrt()
    expected_w, expected_ids = scores.topk(TOP_K, -1)
    _same_choice(weights, ids, expected_w / expected_w.sum(-1, keepdim=True), expected_ids)


def test_selection_bias_added_to_logits():
    logits, bias = _logits(2), torch.randn(E) * 3
    routing = Routing(Scoring.SIGMOID, renormalize=True, has_correction_bias=True, correction_bias_on_logits=True)
    weights, ids = route_torch(logits, routing, TOP_K, bias)
    expected_ids = (logits + bias).topk(TOP_K, -1).indices  # Kolibri: topk(logits + bias), sigmoid of the logits
    expected_w = logits.gather(1, expected_ids).sigmoid()
    _same_choice(weights, ids, expected_w / expected_w.sum(-1, keepdim=True), expected_ids)
    # on the scores it would choose differently for some tokens
    other = route_torch(logits, Routing(Scoring.SIGMOID, renormalize=True, has_correction_bias=True), TOP_K, bias)[1]
    assert not torch.equal(other.sort(-1).values, ids.sort(-1).values)
    with pytest.raises(ValueError, match="correction_bias_on_logits"):
        Routing(correction_bias_on_logits=True)


def test_clamped_silu():
    h = torch.randn(16, 2 * 8) * 4
    out = apply_activation(h, Activation.silu(clamp=1.5))
    gate, up = h.chunk(2, -1)
    torch.testing.assert_close(out, F.silu(gate.clamp(max=1.5)) * up.clamp(-1.5, 1.5))
    assert Activation.silu(clamp=1.5).features == {Feature.CLAMPED_SILU}
    assert not Activation.silu().features
    with pytest.raises(ValueError, match=r"Activation\.clamp=0\.0 is invalid"):
        Activation.silu(clamp=0.0)


class _PlainExperts(Experts):
    """A class declaring no optional features (as every class does by default)."""

    backend = "plain"
    weight_processor = ReferenceExperts.weight_processor
    capability = Capability(platforms=frozenset(Platform), schemes=(UNQUANTIZED,),
                            activations=ReferenceExperts.capability.activations)

    def apply(self, hidden_states, topk_weights, topk_ids):
        raise NotImplementedError


@pytest.mark.parametrize("config", [
    MoEConfig(E, TOP_K, 64, 32, routing=Routing(Scoring.SQRT_SOFTPLUS)),
    MoEConfig(E, TOP_K, 64, 32, routing=Routing(num_expert_groups=4, topk_groups=2, group_scoring="max")),
    MoEConfig(E, TOP_K, 64, 32, activation=Activation.silu(clamp=7.0)),
], ids=["sqrt_softplus", "group_max", "clamped_silu"])
def test_classes_refuse_features_they_do_not_declare(config):
    device = detect_device("cpu")
    support = _PlainExperts.supports(config, _unquantized(), device)
    assert not support and "does not implement" in support.reason
    assert ReferenceExperts.supports(config, _unquantized(), device)
    layer = FusedMoE(config, prefer="reference")
    assert layer.plan.backend == "reference"


def _unquantized():
    from moe_core.quant import unquantized

    return unquantized()
