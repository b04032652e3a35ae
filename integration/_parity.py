"""What the transformers parity tests share: the error measure and the routing-slip rule.

In bf16 a near-tie between two experts can route a token differently in the eager and the fused
model; from that token on its sequence legitimately diverges. The tests compare logits only at the
positions before a sequence's first slip, and bound how many routings may slip at all."""

from __future__ import annotations

import torch


def relative_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


def record_fused_routing(fused_blocks) -> list[torch.Tensor]:
    """The experts each fused block's layer picks (sorted), from the logits it receives."""
    calls: list[torch.Tensor] = []
    for block in fused_blocks:
        block.moe.register_forward_pre_hook(
            lambda module, args: calls.append(module.route(args[1])[1].long().sort(dim=-1).values))
    return calls


def unslipped_positions(eager_calls: list[torch.Tensor], fused_calls: list[torch.Tensor],
                        shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """[batch, seq] bool: positions before the first token of their sequence that routed differently."""
    assert len(eager_calls) == len(fused_calls), (len(eager_calls), len(fused_calls))
    slipped = torch.stack([(e != f).any(dim=-1) for e, f in zip(eager_calls, fused_calls)])  # [layers, tokens]
    if dtype == torch.float32:
        assert not slipped.any(), f"fp32 routing differs in {int(slipped.sum())} (layer, token) pairs"
    assert slipped.float().mean() <= 0.1, f"{int(slipped.sum())} of {slipped.numel()} routings slipped"
    return slipped.any(dim=0).view(shape).int().cumsum(dim=1) == 0
