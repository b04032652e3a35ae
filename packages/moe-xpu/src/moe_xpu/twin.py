"""A pure-torch twin of `XpuFusedMoe.apply`, computed from the processed layouts (CPU, fp32).

It reads the tensors `moe_xpu.layouts` produces the way vllm-xpu-kernels 0.1.16.2 reads them:
16-bit and fp8 weights as [E, in, out]; 4-bit weights as [E, out, in/2] with the even input
element in the low nibble; int4 codes re-encoded by the interface to two's-complement nibbles
(code - 8) and multiplied by their group scale; e2m1 codes through the e2m1 table and e8m0 scales
decoded as the GEMM does (the exponent byte shifted into a float's exponent field, so 0 gives 0);
per-tensor fp8 scales on the GEMM result, block scales on the weights; biases after the scales;
the interface's activations (gate|up halves, swigluoai interleaved with its fixed constants);
`expert_map` routing with -1 meaning another rank's expert; top-k weights applied to each expert's
output and summed in fp32. Block fp8 with fp8 activations quantizes both GEMM inputs per 1x128
group, as the interface does before dequantizing them for the 16-bit GEMM.

Deliberately not modelled: the kernel's 16-bit roundings (dequantized weights, GEMM outputs,
activations). Tests compare the twin with moe-core's fp32 reference at a tight tolerance, which
checks the layouts; the device tests check the kernel itself at the 16-bit tolerance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_core.config import ActivationKind, MoEConfig
from moe_core.quant import MoEQuantConfig
from moe_core.weights import PackedWeights
from moe_core.weights.packing import E2M1_VALUES
from moe_xpu.inputs import dequantize_fp8_groups, quantize_fp8_groups, routed_inputs
from moe_xpu.layouts import FP8_BLOCK, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT

__all__ = ["interface_int4_reencode", "kernel_activate", "kernel_weight", "twin_moe"]


def interface_int4_reencode(codes: torch.Tensor) -> torch.Tensor:
    """What XpuFusedMoe's constructor does to uint8 int4 weights: each nibble n (value n - 8)
    becomes the 4-bit two's complement of n - 8, which is n with its top bit flipped."""
    return codes ^ 0x88


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., C] -> int64 [..., 2C], the low nibble first."""
    p = packed.view(torch.uint8).long()
    return torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)


def _signed(nibbles: torch.Tensor) -> torch.Tensor:
    return nibbles - 16 * (nibbles >= 8)


def _e8m0_as_gemm(scale: torch.Tensor) -> torch.Tensor:
    return (scale.to(torch.int32) << 23).view(torch.float32)


def _per_element(scale: torch.Tensor, cols: int) -> torch.Tensor:
    return scale.repeat_interleave(cols // scale.shape[-1], dim=-1)


def kernel_weight(packed: PackedWeights, name: str) -> torch.Tensor:
    """The GEMM's B operand of `name` ("w13" or "w2") as fp32 [E, in, out]."""
    w, scale = packed[name], packed.get(f"{name}_scale")
    layout = packed.layout
    if layout == "xpu.dense.kn":
        return w.float()
    if layout == "xpu.fp8.kn":
        if scale.ndim == 1:  # per tensor: the GEMM scales its fp32 result, the same product
            return w.float() * scale.view(-1, 1, 1)
        return w.float() * scale.repeat_interleave(FP8_BLOCK, 1).repeat_interleave(FP8_BLOCK, 2)
    if layout == "xpu.int4.nk":
        values = _signed(_nibbles(interface_int4_reencode(w))).float()
        return (values * _per_element(scale.float(), values.shape[-1])).transpose(1, 2)
    if layout == "xpu.mxfp4.nk":
        values = E2M1_VALUES[_nibbles(w)]
        return (values * _per_element(_e8m0_as_gemm(scale), values.shape[-1])).transpose(1, 2)
    raise ValueError(f"the twin does not know layout {layout!r}")


def kernel_activate(h: torch.Tensor, config: MoEConfig) -> torch.Tensor:
    """The interface's activation on GEMM1's output [m, R] -> [m, N]."""
    kind = config.activation.kind
    if kind is ActivationKind.RELU2:
        return F.relu(h).square()
    if kind is ActivationKind.SWIGLU_OAI:
        gate = h[:, 0::2].clamp(max=SWIGLU_OAI_LIMIT)
        up = h[:, 1::2].clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
        return gate * torch.sigmoid(SWIGLU_OAI_ALPHA * gate) * (up + 1)
    gate, up = h.chunk(2, dim=-1)
    if kind is ActivationKind.SILU:
        return F.silu(gate) * up
    if kind is ActivationKind.GELU:
        return F.gelu(gate) * up
    return F.gelu(gate, approximate="tanh") * up


def twin_moe(packed: PackedWeights, config: MoEConfig, quant: MoEQuantConfig, hidden_states: torch.Tensor,
             topk_weights: torch.Tensor, topk_ids: torch.Tensor,
             expert_map: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 [M, K]: the layer as the experts class runs it through XpuFusedMoe."""
    x, weights = routed_inputs(hidden_states, topk_weights, config)
    fp8_groups = quant.activation is not None

    def gemm_input(a: torch.Tensor) -> torch.Tensor:
        return dequantize_fp8_groups(*quantize_fp8_groups(a, FP8_BLOCK)) if fp8_groups else a

    x = gemm_input(x.float())
    ids = topk_ids.long()
    local = expert_map.long()[ids] if expert_map is not None else ids
    w13, w2 = kernel_weight(packed, "w13"), kernel_weight(packed, "w2")
    b13, b2 = packed.get("w13_bias"), packed.get("w2_bias")
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in range(w13.shape[0]):
        token, slot = (local == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        h = x[token] @ w13[e]
        if b13 is not None:
            h = h + b13[e].float()
        y = gemm_input(kernel_activate(h, config)) @ w2[e]
        if b2 is not None:
            y = y + b2[e].float()
        out.index_add_(0, token, y * weights[token, slot, None])
    return out
