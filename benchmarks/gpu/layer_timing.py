"""What the GPU scripts share: the layers they build and the protocol that times them.

A layer is `moe_core.FusedMoE` on the triton backend with random weights of a preset's real shape
(`ExpertWeights.random`, seed 0, drawn on the GPU): bf16, int4 W4A16 (symmetric, a bf16 scale per
the preset's int4 group, no zero points), int8 W8A16 (per channel), MXFP4 (e2m1 codes, an e8m0 scale
per 32) or fp8 W8A8 (`fp8-block`: 128x128 weight blocks x 1x128 activation groups; `fp8-channel`: per
channel x per token). Routings with a correction bias (DeepSeek-V3) get the tuner's
(`moe_triton.tune.CORRECTION_BIAS`: near-uniform loads), not `moe bench`'s larger
`CORRECTION_BIAS_STD`, which concentrates DeepSeek's choices on fewer experts, so deepseek-v3's cells
time differently here and there (`benchmarks/results/int8_retune_2026-11-29.md`); the floor counts
the experts the routing selects either way (`moe_core.bench.routed_work`).

`time_layer` is the benchmark's protocol: the layer captured in CUDA graphs over rotating input sets
(8 sets, 2 above 512 tokens, so consecutive replays read other activations), the L2 flushed before
every replay, CUDA events around each (`moe_core.bench.time_cuda_layer`; the mean over the sets of each
set's median), the SM clock sampled meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from moe_core import FusedMoE
from moe_core.bench import SmClockSampler, mean_call_seconds, time_cuda_layer
from moe_core.presets import Preset
from moe_core.quant import MoEQuantConfig, fp8_w8a8, int4_w4a16, int8_w8a16, mxfp4_w4a16, unquantized
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights
from moe_triton.tune import CORRECTION_BIAS

PRESETS = ("qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v3")
TOKEN_COUNTS = (1, 8, 32, 128, 512, 2048, 8192)
DTYPES = ("bf16", "int4", "int8", "mxfp4", "fp8-block", "fp8-channel")
# ab_layer.py's: the matrix's and per-channel int4, which no preset's checkpoint uses (its kernels' A/Bs).
AB_DTYPES = (*DTYPES, "int4-channel")

Layer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def layer_quant(preset: Preset, dtype: str) -> MoEQuantConfig:
    """The quantization a benchmark dtype names: bf16, int4 (the preset's int4 group size; int4-channel: one
    scale row for all of K), int8, mxfp4 or fp8."""
    if dtype == "bf16":
        return unquantized()
    if dtype == "int4":
        return int4_w4a16(preset.int4_group_size)
    if dtype == "int4-channel":
        return int4_w4a16(-1)
    if dtype == "int8":
        return int8_w8a16()
    if dtype == "mxfp4":
        return mxfp4_w4a16()
    if dtype.startswith("fp8-"):
        return fp8_w8a8(dtype.removeprefix("fp8-"))
    raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(AB_DTYPES)}")


def random_weights(preset: Preset, dtype: str, device: torch.device) -> ExpertWeights:
    return ExpertWeights.random(preset.config, layer_quant(preset, dtype), seed=0, device=device)


def correction_bias(preset: Preset, device: torch.device, std: float = CORRECTION_BIAS) -> torch.Tensor | None:
    """A random per-expert correction bias of deviation `std` (default: the tuner's routing) where the
    preset's routing takes one."""
    cfg = preset.config
    if not cfg.routing.has_correction_bias:
        return None
    gen = torch.Generator(device=device).manual_seed(0)
    return torch.randn(cfg.num_experts, device=device, generator=gen) * std


def build_layer(preset: Preset, dtype: str, device: torch.device, weights: ExpertWeights | None = None,
                backend: str = "triton", bias_std: float = CORRECTION_BIAS) -> FusedMoE:
    """The preset's layer on `backend`, loaded with `weights` (default: `random_weights`) and
    `correction_bias(preset, device, bias_std)`.
    Raises moe_core.oracle.BackendUnavailableError where that backend cannot serve it."""
    layer = FusedMoE(preset.config, layer_quant(preset, dtype), device=device, prefer=backend)
    layer.load_weights(weights if weights is not None else random_weights(preset, dtype, device),
                       correction_bias=correction_bias(preset, device, bias_std))
    return layer


def input_sets(preset: Preset, tokens: int, device: torch.device, sets: int | None = None
               ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(hidden states, router logits) pairs of `tokens` tokens, seeded by the token count."""
    cfg = preset.config
    sets = sets if sets is not None else (8 if tokens <= 512 else 2)
    gen = torch.Generator(device=device).manual_seed(tokens)
    return [(torch.randn(tokens, cfg.hidden_size, device=device, generator=gen, dtype=torch.bfloat16),
             torch.randn(tokens, cfg.num_experts, device=device, generator=gen)) for _ in range(sets)]


def time_layer(layer: Layer, inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """{"us": microseconds of the mean call (each set's median, averaged), "sm_clock_mhz": median SM
    clock or None} of `layer` replayed from one CUDA graph per input set, the sets taken in turn, the
    L2 flushed before every replay (`moe_core.bench.time_cuda_layer` and `mean_call_seconds`, what
    `moe bench` uses on CUDA)."""
    with SmClockSampler(inputs[0][0].device) as clock:
        samples, method = time_cuda_layer(layer, inputs)
    if method != "cuda-graph":
        raise RuntimeError(f"the layer could not be captured in a CUDA graph: {method}")
    return {"us": mean_call_seconds(samples, len(inputs)) * 1e6, "sm_clock_mhz": clock.median}


def reference_error(layer: Layer, preset: Preset, weights: ExpertWeights, x: torch.Tensor, logits: torch.Tensor,
                    bias: torch.Tensor | None) -> float:
    """Relative L2 error of `layer` against an fp32 reference over the experts the tokens touch (the
    full dequantized copy would not fit); unquantized weights only."""
    from moe_core.reference import apply_activation

    cfg = preset.config
    tw, ti = route_torch(logits, cfg.routing, cfg.top_k, bias)
    ref = torch.zeros(x.shape[0], cfg.hidden_size, device=x.device)
    for e in ti.unique().tolist():
        tok, slot = (ti == e).nonzero(as_tuple=True)
        h = x[tok].float() @ weights.w13[e].float().T
        if weights.has_bias:
            h = h + weights.w13_bias[e].float()
        y = apply_activation(h, cfg.activation) @ weights.w2[e].float().T
        if weights.has_bias:
            y = y + weights.w2_bias[e].float()
        ref.index_add_(0, tok, y * tw[tok, slot, None])
    out = layer(x, logits).float()
    return float((out - ref).norm() / ref.norm())


def mhz(clock: float | None) -> str:
    return f"{clock:.0f} MHz" if clock is not None else "n/a"
