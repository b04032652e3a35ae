"""FusedMoE computes no gradients: a call autograd would record is refused with what to do instead."""

from __future__ import annotations

import pytest
import torch

from moe_core import ExpertWeights, FusedMoE, MoEConfig

CFG = MoEConfig(8, 2, 64, 32, dtype=torch.float32)


@pytest.fixture(scope="module")
def layer():
    layer = FusedMoE(CFG, None, "cpu", prefer="reference")
    layer.load_weights(ExpertWeights.random(CFG, layer.quant))
    return layer


@pytest.mark.parametrize(("x_grad", "logits_grad", "named"), [
    (True, False, "but hidden_states requires grad"),
    (False, True, "but router_logits requires grad"),
    (True, True, "but hidden_states and router_logits require grad"),
])
def test_inputs_requiring_grad_are_refused_with_grad_enabled(layer, x_grad, logits_grad, named):
    x = torch.randn(3, 64, requires_grad=x_grad)
    logits = torch.randn(3, 8, requires_grad=logits_grad)
    with pytest.raises(RuntimeError, match=rf"FusedMoE is inference-only and computes no gradients, {named} with "
                                           r"grad mode enabled .* under torch.no_grad\(\) or torch.inference_mode\(\)"):
        layer(x, logits)


def test_the_same_inputs_run_without_grad_mode(layer):
    x = torch.randn(3, 64, requires_grad=True)
    logits = torch.randn(3, 8, requires_grad=True)
    with torch.no_grad():
        expected = layer(x, logits)
    with torch.inference_mode():
        assert torch.equal(layer(x, logits), expected)
    assert torch.equal(layer(x.detach(), logits.detach()), expected)  # grad mode on, nothing to record
