"""A decode step's MoE layer in one launch: both GEMMs, the activation and the weighted top-k sum.

At one token the layer's GEMM path is a chain of dependent launches (router, GEMM1, GEMM2, the sum);
here each program takes one routed pair and a slice of 128 (or 64) intermediate channels through
both GEMMs and adds its share of the output in fp32 (`fused_decode_details._kernel`), and
`from_logits` routes in the same launch (each program takes its token's top-k with the router's
code). The quantized moe-triton layers run it where their launch configuration names it
(`configs.QuantKernelConfig.fused`, which `moe tune` writes only where it times faster than the
layer's GEMMs); it can also be called on a loaded layer directly.
docs/design/triton-gemm-quantized.md says more, and how it compares with the GEMMs.

    fused = FusedDecode(experts)                       # checks what the kernel serves, once
    out = fused(hidden_states, topk_weights, topk_ids)  # M <= MAX_TOKENS, routed by the caller
    out = fused.from_logits(hidden_states, router_logits, correction_bias)  # routed in the same launch

Serves int4 and int8 weights in their quads layouts (`TritonWna16Experts`: symmetric, scale groups of
32, 64, 128 or one per channel, no act-order) and MXFP4 (`TritonMxfp4Experts`, bf16 layers); SiLU
or gpt-oss's clamped SwiGLU, with or without biases. The sum's order across programs is not
fixed (fp32 atomics), so outputs may differ in the last bits between calls; calls of one
`FusedDecode` on one device share its scratch, so they run one after another (one stream).
`fused_decode_torch` is its torch twin.
"""

from __future__ import annotations

import torch

from moe_core.config import ActivationKind, Scoring
from moe_core.experts import check_routed_inputs, checking_ids_on_accelerators
from moe_core.quant import ZeroPoint
from moe_core.reference import apply_activation
from moe_core.routing import check_router_inputs
from moe_triton._common.target import interpreting
from moe_triton.configs import FusedDecodeConfig
from moe_triton.fused_decode_details._kernel import MAX_TOKENS, SLICE, fused_decode_launch
from moe_triton.quant_gemm_details._dequant import dequantize_operand
from moe_triton.quant_gemm_details._layouts import GateUpInterleave, WeightOperand, WType
from moe_triton.quantized import GATE_UP_CHUNK, TritonMxfp4Experts, TritonWna16Experts
from moe_triton.routing_details._kernel import route_constexprs

__all__ = ["MAX_TOKENS", "FusedDecode", "fused_decode_torch", "unsupported_reason"]


def unsupported_reason(experts) -> str | None:
    """Why `FusedDecode` cannot serve this loaded experts layer; None where it can."""
    if not isinstance(experts, TritonWna16Experts | TritonMxfp4Experts):
        return f"needs a TritonWna16Experts or TritonMxfp4Experts layer, got {type(experts).__name__}"
    cfg, key = experts.config, experts.quant.weight
    if isinstance(experts, TritonMxfp4Experts) and cfg.dtype != torch.bfloat16:
        return f"serves MXFP4 in bf16 layers (the e2m1 unpack yields bf16), got {cfg.dtype}"
    act = cfg.activation
    if not ((act.kind is ActivationKind.SILU and act.clamp is None) or act.kind is ActivationKind.SWIGLU_OAI):
        return f"serves SiLU-gated experts without a clamp and gpt-oss's SwiGLU, got {act}"
    if cfg.parallel.use_ep:
        return "serves a layer holding every expert (no expert parallelism)"
    if key.act_order or key.zero_point is not ZeroPoint.NONE:
        return "serves symmetric weights without act-order"
    w13, w2 = _operands(experts)
    for w in (w13, w2):
        if not w.quads or w.wtype not in (WType.INT4, WType.INT8, WType.MXFP4):
            return (f"needs int4, int8 or MXFP4 weights in a quads layout, got {w.wtype.name} of K={w.k} in "
                    "another layout")
        if w.group % 32:
            return f"needs scale groups of 32, 64, 128 or one per channel, got {w.group}"
    return None


def _operands(experts) -> tuple[WeightOperand, WeightOperand]:
    cfg = experts.config
    return (experts._operand("w13", cfg.w13_rows, cfg.hidden_size),
            experts._operand("w2", cfg.hidden_size, cfg.intermediate_size_per_partition))


class FusedDecode:
    """One launch per call over a loaded quantized layer's weights (module docstring)."""

    def __init__(self, experts, *, channels: int = SLICE, num_warps: int = 8, block_h: int = 128,
                 k_split: int = 1) -> None:
        """Launch options (`configs.FusedDecodeConfig`, which checks them): channels (intermediate
        channels per program: 128, or 64 for twice the programs), num_warps, block_h (GEMM2's output
        rows per step), k_split (programs sharing a slice's GEMM1)."""
        reason = unsupported_reason(experts)
        if reason is not None:
            raise ValueError(f"FusedDecode: {reason}")
        self.experts, self.options = experts, FusedDecodeConfig(channels, num_warps, block_h, k_split)
        cfg = experts.config
        routing = cfg.routing
        # `from_logits`' routing kernel arguments: fixed by the layer (its logits are checked to match).
        self._route_consts = route_constexprs(cfg.num_experts, cfg.top_k, softmax=routing.scoring is Scoring.SOFTMAX,
                                              has_bias=routing.has_correction_bias, groups=routing.num_expert_groups,
                                              topk_groups=routing.topk_groups, renormalize=routing.renormalize,
                                              scaling=routing.routed_scaling_factor)
        # Per device, zero between calls (the programs of each call leave them so): the fp32 output sums
        # [MAX_TOKENS * K] and their arrival count; with k_split, GEMM1's fp32 partial sums
        # [MAX_TOKENS * top_k * w13 rows] and one arrival count per (pair, slice).
        self._scratch: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def __call__(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
                 ) -> torch.Tensor:
        """The layer's output for tokens the caller routed (topk_weights, topk_ids: [M, top_k])."""
        M, top_k = self._check_tokens(hidden_states), self.experts.config.top_k
        if topk_ids.shape != (M, top_k) or topk_weights.shape != (M, top_k):
            raise ValueError(f"topk_ids and topk_weights must be [{M}, {top_k}], got {list(topk_ids.shape)} "
                             f"and {list(topk_weights.shape)}")
        if not hidden_states.is_cuda or checking_ids_on_accelerators():
            check_routed_inputs(hidden_states, topk_weights, topk_ids, self.experts.config)  # ids in [0, E)
        return self.launch_routed(hidden_states, topk_weights, topk_ids)

    def launch_routed(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
                      ) -> torch.Tensor:
        """`__call__` without its checks, for a caller that made them (the layer's `apply`)."""
        return self._launch(hidden_states, routed=(topk_weights.to(torch.float32).contiguous(),
                                                   topk_ids.to(torch.int32).contiguous()))

    def from_logits(self, hidden_states: torch.Tensor, router_logits: torch.Tensor,
                    correction_bias: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output routed in the same launch, by the layer's routing (as
        `moe_triton.routing.route` would route these logits)."""
        self._check_tokens(hidden_states)
        cfg = self.experts.config
        routing = cfg.routing
        if routing.weight_on_input:
            raise ValueError("FusedDecode.from_logits: routings that weight the input (Llama4) are not served; "
                             "route with moe_triton.routing.route and call the layer directly")
        check_router_inputs(router_logits, routing, cfg.top_k, correction_bias)
        if tuple(router_logits.shape) != (hidden_states.shape[0], cfg.num_experts):
            raise ValueError(f"router_logits must be [{hidden_states.shape[0]}, {cfg.num_experts}] (a row per token, "
                             f"a column per expert), got {list(router_logits.shape)}")
        bias = correction_bias.float().contiguous() if correction_bias is not None else None
        return self._launch(hidden_states, router=(router_logits.contiguous(), bias, self._route_consts,
                                                   routing.renormalize_eps, routing.routed_scaling_factor))

    def _check_tokens(self, hidden_states: torch.Tensor) -> int:
        cfg = self.experts.config
        if hidden_states.dim() != 2 or hidden_states.shape[1] != cfg.hidden_size or hidden_states.dtype != cfg.dtype:
            raise ValueError(f"hidden_states must be [M, {cfg.hidden_size}] {cfg.dtype}, got "
                             f"{list(hidden_states.shape)} {hidden_states.dtype}")
        M = hidden_states.shape[0]
        if not 1 <= M <= MAX_TOKENS:
            raise ValueError(f"FusedDecode serves 1 to {MAX_TOKENS} tokens a call, got {M}")
        return M

    def _launch(self, hidden_states: torch.Tensor, **routing) -> torch.Tensor:
        cfg = self.experts.config
        w13, w2 = _operands(self.experts)
        device = hidden_states.device
        if device != w13.codes.device:
            raise ValueError(f"hidden_states are on {device}, the layer's weights on {w13.codes.device}")
        if device not in self._scratch:
            pairs, rows = MAX_TOKENS * cfg.top_k, w13.codes.shape[1]
            self._scratch[device] = (
                torch.zeros(MAX_TOKENS * cfg.hidden_size, dtype=torch.float32, device=device),
                torch.zeros(1, dtype=torch.int32, device=device),
                torch.zeros(pairs * rows if self.options.k_split > 1 else 0, dtype=torch.float32, device=device),
                torch.zeros(pairs * -(-rows // (2 * self.options.channels)) if self.options.k_split > 1 else 0,
                            dtype=torch.int32, device=device))
        sums, count, *partials = self._scratch[device]
        out = torch.empty_like(hidden_states)
        packed, act = self.experts._packed(), cfg.activation
        fused_decode_launch(
            hidden_states.contiguous(), w13.codes, w13.scale, w2.codes, w2.scale, sums, out, count,
            biases=(packed["w13_bias"], packed["w2_bias"]) if cfg.has_bias else None,
            swiglu=(act.alpha, act.limit) if act.kind is ActivationKind.SWIGLU_OAI else None,
            top_k=cfg.top_k, group1=w13.group, group2=w2.group, wtype=int(w13.wtype), code_offset=w13.code_offset,
            folded=(w13.folded_scale, w2.folded_scale),
            upcast=interpreting() and hidden_states.dtype == torch.bfloat16,
            ptx=hidden_states.is_cuda and torch.version.hip is None and not interpreting(),
            channels=self.options.channels, block_h=self.options.block_h, k_split=self.options.k_split,
            partials=partials, num_warps=self.options.num_warps, **routing)
        return out


def fused_decode_torch(experts, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
                       ) -> torch.Tensor:
    """The kernel's math in torch, from the same packed weights: fp32 GEMMs (and biases), each pair's
    activation times its routing weight rounded to the layer dtype, an fp32 sum over the pairs."""
    cfg = experts.config
    w13, w2 = (dequantize_operand(w) for w in _operands(experts))
    packed = experts._packed()
    gate_up = GateUpInterleave(GATE_UP_CHUNK)
    x = hidden_states.float()
    out = torch.zeros_like(x)
    for m in range(x.shape[0]):
        for j in range(cfg.top_k):
            e, weight = int(topk_ids[m, j]), topk_weights[m, j].float()
            h = w13[e] @ x[m] + (packed["w13_bias"][e] if cfg.has_bias else 0.0)
            act = (apply_activation(gate_up.unswizzle(h), cfg.activation) * weight).to(hidden_states.dtype)
            out[m] += w2[e] @ act.float() + (packed["w2_bias"][e] * weight if cfg.has_bias else 0.0)
    return out.to(hidden_states.dtype)
