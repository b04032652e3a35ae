"""Model presets: the MoE layer shapes of real models (one layer each), and their int4 group size."""

from __future__ import annotations

from dataclasses import dataclass

from moe_core.config import Activation, MoEConfig, Routing

__all__ = ["PRESETS", "Preset", "get_preset"]


@dataclass(frozen=True)
class Preset:
    name: str
    config: MoEConfig  # one layer, unsharded, bf16
    int4_group_size: int  # group size of the model's common int4 checkpoints (must divide K and N)
    source: str  # where the shape comes from


def _p(name, E, k, K, N, routing, source, activation=None, bias=False, g=128) -> Preset:
    cfg = MoEConfig(num_experts=E, top_k=k, hidden_size=K, intermediate_size=N, routing=routing,
                    activation=activation or Activation.silu(), has_bias=bias)
    return Preset(name, cfg, g, source)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    _p("tiny", 8, 2, 256, 128, Routing.softmax_topk(True), "a small test shape", g=64),
    _p("mixtral-8x7b", 8, 2, 4096, 14336, Routing.softmax_topk(True), "mistralai/Mixtral-8x7B-v0.1 config.json"),
    _p("qwen3-30b-a3b", 128, 8, 2048, 768, Routing.softmax_topk(True), "Qwen/Qwen3-30B-A3B config.json"),
    _p("qwen3-235b-a22b", 128, 8, 4096, 1536, Routing.softmax_topk(True), "Qwen/Qwen3-235B-A22B config.json"),
    _p("deepseek-v3", 256, 8, 7168, 2048, Routing.deepseek_v3(8, 4, 2.5), "deepseek-ai/DeepSeek-V3 config.json"),
    # gpt-oss: K = N = 2880 = 45 * 64, so its int4 form uses group 64.
    _p("gpt-oss-120b", 128, 4, 2880, 2880, Routing.softmax_topk(True), "openai/gpt-oss-120b config.json",
       activation=Activation.swiglu_oai(1.702, 7.0), bias=True, g=64),
)}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}") from None
