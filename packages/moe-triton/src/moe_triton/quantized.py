"""Quantized Triton fused experts: WNA16 (int4/int8 weights), fp8 W8A8 and MXFP4 (gpt-oss).

All three run the same pipeline: align the (token, k) pairs by expert (not for a few tokens:
`DIRECT_MAX_TOKENS`), GEMM1 with the weights dequantized in registers, the activation, and GEMM2
whose epilogue applies the router weight and sums the top-k choices atomically into fp32 [M, K],
zeroed on the side by GEMM1 (from `ROWS_SUM_MIN_PAIRS` pairs, or `ROWS_SUM_MIN_PAIRS_TOP8` at top-8,
it stores each pair's 16-bit row and one reduce sums them).

With 16-bit activations (WNA16, MXFP4) the activation runs in GEMM1's epilogue: the processor
interleaves gated w13 rows by chunks of `GATE_UP_CHUNK` (`quant_gemm_details._layouts.GateUpInterleave`),
so each output tile holds matching gate and up columns. fp8 keeps a separate activation launch, which
also quantizes GEMM2's input per token, group or tensor. Up to `LAST_ARRIVAL_MAX_TOKENS` tokens the
GEMMs' split-K and top-k sums are finished by their last contributor (`quant_gemm.LastArrival`):
route, align (not for a few tokens), GEMM1 and GEMM2 is the whole layer. A split GEMM1's sums must
start at zero: the routing launch clears them when FusedMoE routes (`apply_monolithic`), a launch
of their own when the caller routed (`apply`). More tokens take a cast launch after GEMM2, or the
reduce over stored rows from that many pairs (and the activation launch after a split GEMM1).

On Hopper the GEMMs (and that zeroing) are launched before the kernel ahead of them ends
(programmatic dependent launch), so their launch latency hides behind it; for one token, a quads
GEMM2 asks L2 for its first weight tiles while GEMM1 still runs (`quant_gemm.direct_quant_gemm`).
Where a call's launch configuration sets `fused` (a tuned file's choice), WNA16 and MXFP4 calls of
up to 8 tokens are instead one launch, routing included (`moe_triton.fused_decode`).
The measurements behind the thresholds below: docs/design/triton-gemm-quantized.md.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from functools import cached_property, partial
from typing import ClassVar

import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import ActivationKind, MoEConfig
from moe_core.experts import (
    Capability,
    Experts,
    SchemeSupport,
    Support,
    check_routed_inputs,
    checking_ids_on_accelerators,
)
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType, QuantKey, ZeroPoint
from moe_core.weights.canonical import ExpertWeights
from moe_core.weights.packing import pack_int4, unpack_int4
from moe_core.weights.processor import PackedWeights
from moe_triton._common.target import interpreting, mma_capable, num_sms, wgmma_capable
from moe_triton.act_order import permute_pair_rows
from moe_triton.act_quant import QMode, act_quant
from moe_triton.align import align_block_size
from moe_triton.configs import (
    ConfigKey,
    FusedDecodeConfig,
    GemmConfig,
    Lookup,
    QuantKernelConfig,
    TunedLaunch,
    device_tag,
    lender_lookup,
    lookup_exact,
)
from moe_triton.fused_decode_details._kernel import MAX_TOKENS as FUSED_DECODE_MAX_TOKENS
from moe_triton.quant_gemm import (
    BlockReady,
    LastArrival,
    direct_quant_gemm,
    grouped_quant_gemm,
    mma_takes,
    programs_per_block,
    zeroed_int32,
)
from moe_triton.quant_gemm_details._heuristics import effective_split, pick_config
from moe_triton.quant_gemm_details._kernel import AScale
from moe_triton.quant_gemm_details._layouts import (
    E2M1_FIELDS,
    INT4_NIBBLES,
    ByteQuadsLayout,
    GateUpInterleave,
    HalvesLayout,
    QuadsLayout,
    WeightOperand,
    WType,
    pack_e8m0_tiles,
)
from moe_triton.routing import route
from moe_triton.topk_sum import topk_sum

__all__ = ["LAST_ARRIVAL_MAX_TOKENS", "ROWS_SUM_MIN_PAIRS", "ROWS_SUM_MIN_PAIRS_TOP8", "TritonFp8Experts",
           "TritonMxfp4Experts", "TritonWna16Experts"]

_ALL_ACTIVATIONS = frozenset(ActivationKind)
# What the three quantized classes share: 16-bit activations in and out, 64-wide K/N tiles, the runs
# their tests passed on.
_SHARED_CAPABILITY = dict(
    activations=_ALL_ACTIVATIONS,
    dtypes=frozenset({torch.bfloat16, torch.float16}),
    hidden_multiple=64,
    intermediate_multiple=64,
    requires=("triton",),
    validated_on=("cuda: NVIDIA H100 80GB HBM3", "cuda: NVIDIA H200"),
)
_GPUS = frozenset({Platform.CUDA, Platform.ROCM})
# Rows per gate/up chunk of an interleaved w13: half of the narrowest GEMM1 tile (64 rows).
GATE_UP_CHUNK = 32
# Most tokens whose sums are finished by their last contributor: beyond, every GEMM2 program's
# acquire-release count per row costs more than the cast launch it saves.
LAST_ARRIVAL_MAX_TOKENS = 8
# Fewest (token, k) pairs whose top-k sums GEMM2 leaves to one reduce launch over its stored 16-bit
# rows (`moe_triton.topk_sum`), instead of fp32 atomic sums and a cast: ROWS_SUM_MIN_PAIRS_TOP8 for
# layers of 8 or more choices per token, whose GEMM2 would issue that many atomics per output,
# ROWS_SUM_MIN_PAIRS for the others (below these, the rows were no faster or slower).
ROWS_SUM_MIN_PAIRS = 16384
ROWS_SUM_MIN_PAIRS_TOP8 = 8192
# Most tokens whose (token, k) pairs the GEMMs take a block per pair, without the alignment launch (each
# pair streams its expert), against aligned blocks on the H200: at 2 tokens 1.02-1.11x in every preset
# and scheme measured; at 4, 1.01-1.07x where the router chooses WIDE_ROUTER_TOP_K or more of
# WIDE_ROUTER_EXPERTS or more experts (qwen3-30b-a3b, qwen3-235b-a22b, deepseek-v3: all 15 cells), and
# down to 0.70x elsewhere (mixtral-8x7b's top-2 of 8, whose tokens share experts; gpt-oss-120b int4 0.96x).
DIRECT_MAX_TOKENS = 2
DIRECT_MAX_TOKENS_WIDE_ROUTER = 4
# Most tokens whose fp8 input the routing launch quantizes per 128-wide group (block fp8's GEMM1 operand),
# in programs beside the routing's: one launch fewer per layer where the launches dominate
# (docs/design/triton-routing-align-reduce.md).
ROUTE_QUANTIZES_MAX_TOKENS = 8
WIDE_ROUTER_TOP_K = 8
WIDE_ROUTER_EXPERTS = 128


def _int4_quads(cols: int, group: int) -> bool:
    """int4 weights take the quads layout (`_layouts.QuadsLayout`) when 128-wide K tiles fit, K
    padded to whole tiles where the scale groups divide the padded K (zero scale rows pad it);
    otherwise (per-channel scales: group == cols) the halves layout with 64-wide tiles."""
    return group % 32 == 0 and (cols % 128 == 0 or (group < cols and _padded_k(cols) % group == 0))


def _int8_quads(cols: int, group: int) -> bool:
    """int8 weights take the byte quads (`_layouts.ByteQuadsLayout`) when each 32-wide quarter of a
    128-wide K tile lies in one scale group, K padded to whole tiles where 128 does not divide it:
    per-channel scales cover the padding as they are, grouped ones where their groups divide the
    padded K (zero scale rows pad it); otherwise canonical codes, which take any K."""
    return group % 32 == 0 and (cols % 128 == 0 or group == cols or _padded_k(cols) % group == 0)


def _takes_quads(wtype: WType, cols: int, group: int) -> bool:
    """Weights in a quads layout: MXFP4 always (its groups of 32 divide any padded K), int4 where
    `_int4_quads`, int8 where `_int8_quads`."""
    return (wtype is WType.MXFP4 or (wtype is WType.INT4 and _int4_quads(cols, group))
            or (wtype is WType.INT8 and _int8_quads(cols, group)))


def _padded_k(cols: int) -> int:
    """K of the quads layout: whole 128-wide tiles."""
    return -(-cols // 128) * 128


def _block_k(wtype: WType, cols: int, group: int) -> int:
    """K tile of one GEMM: it must divide K (quads pad K instead), and each dequantized slice (a
    quarter of the tile for quads, half for the halves layout: one dot each) must sit inside
    one scale group."""
    if _takes_quads(wtype, cols, group):
        return 128
    for bk in (128, 64, 32):
        piece = bk // 2 if wtype is WType.INT4 else bk
        if cols % bk == 0 and group % piece == 0 and piece >= 16:
            return bk
    raise ValueError(f"no K tile fits K={cols} with scale groups of {group}")


# K tile of every fp8 GEMM (the quads' tile, `_padded_k`): one 128x128 scale block per tile;
# per-channel and per-tensor codes are padded to whole tiles (`_padded_to_whole_tiles`: +0.0 codes, and
# the activation launch writes zero columns there), so a K that 128 does not divide (gpt-oss's 2880)
# keeps the tile the swapped fp8 wgmma is fastest with.
FP8_BLOCK_K = 128


def _group(key: QuantKey, cols: int) -> int:
    return key.group_size if key.scale.granularity is Granularity.GROUP else cols


def _operand_group(wtype: WType, cols: int, group: int) -> int:
    """`WeightOperand.group`: K per scale row; a per-channel row of quads codes covers their padded K."""
    if group == cols and cols % 128 and _takes_quads(wtype, cols, group):
        return _padded_k(cols)
    return group


def _wtype(key: QuantKey) -> WType:
    return {QuantDType.INT4: WType.INT4, QuantDType.INT8: WType.INT8, QuantDType.FP8_E4M3: WType.FP8,
            QuantDType.FP4_E2M1: WType.MXFP4}[key.dtype]


def _padded_to_whole_tiles(wtype: WType, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                           cols: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Canonical codes, scales and zero points with K padded to whole 128-wide tiles whose padding
    dequantizes to exactly 0 (the kernels also mask the activations there): integer codes at their
    zero (the implicit one, or each row's own zero point per channel) under zero scale rows, MXFP4
    code 0 (+0.0) under e8m0 exponent 0, fp8 code +0.0. A per-channel (or per-tensor) scale covers the
    padding as it is."""
    pad_k = _padded_k(cols) - cols
    scale_rows = 0 if group == cols else pad_k // group
    scale = torch.nn.functional.pad(scale, (0, scale_rows), value=0)
    if wtype is WType.INT4:
        codes = torch.nn.functional.pad(codes, (0, pad_k // 2), value=0x88)
        zero = torch.nn.functional.pad(zero, (0, scale_rows), value=8) if zero is not None else None
    elif wtype is WType.INT8:
        if zero is not None and group == cols:
            codes = torch.cat((codes, zero.unsqueeze(-1).expand(*zero.shape, pad_k).to(codes.dtype)), dim=-1)
        else:
            codes = torch.nn.functional.pad(codes, (0, pad_k), value=128)
            zero = torch.nn.functional.pad(zero, (0, scale_rows), value=128) if zero is not None else None
    elif wtype is WType.FP8:  # torch pads no fp8 tensor: its bytes are padded
        codes = torch.nn.functional.pad(codes.view(torch.uint8), (0, pad_k), value=0).view(codes.dtype)
    else:
        codes = torch.nn.functional.pad(codes, (0, pad_k // 2), value=0)
    return codes, scale, zero


def _rows_first(t: torch.Tensor, key: QuantKey) -> torch.Tensor:
    """Scales/zeros [E, rows, groups] (or [E, rows] per channel) -> [E, groups, rows] contiguous."""
    if key.scale.granularity is Granularity.CHANNEL:
        t = t.unsqueeze(-1)
    return t.transpose(1, 2).contiguous()


def _group_sort(g_idx: torch.Tensor, group: int, name: str) -> torch.Tensor:
    """int64 [..., C]: input channels sorted by scale group (stable), so that group j occupies
    [j*group, (j+1)*group). Only groupings of exactly `group` channels each (GPTQ desc_act's) sort so."""
    perm = torch.argsort(g_idx.long(), dim=-1, stable=True)
    expected = torch.arange(g_idx.shape[-1], device=g_idx.device) // group
    if not torch.equal(torch.gather(g_idx.long(), -1, perm), expected.expand_as(perm)):
        raise ValueError(f"{name}_g_idx: every scale group must hold exactly {group} input channels for the "
                         "Triton WNA16 kernels; this act-order assignment does not")
    return perm


def _act_order_sorted(weights: ExpertWeights, config: MoEConfig, device: torch.device
                      ) -> tuple[ExpertWeights, torch.Tensor]:
    """Act-order weights as plain grouped ones, and `w13_perm` int32 [E, K] ([E, 2, K] where gate and
    up are grouped apart): each expert's input channels sorted by scale group (each w13 half by its
    own g_idx), so the kernel reads a scale row per group of K; GEMM1's input is permuted to match per
    pair (`permute_pair_rows`). w2's sort is folded into w13's output rows, both halves alike (gate n
    stays paired with up n), so GEMM1 already writes GEMM2's input in w2's sorted order."""
    key = weights.key
    int4 = key.dtype is QuantDType.INT4
    group = key.group_size
    g13 = weights.w13_g_idx.to(device)
    if g13.dim() == 3 and torch.equal(g13[:, 0], g13[:, 1]):
        g13 = g13[:, 0]  # the halves agree: one order for all rows
    perm13 = _group_sort(g13, group, "w13")
    perm2 = _group_sort(weights.w2_g_idx.to(device), group, "w2")
    codes13 = weights.w13.to(device)
    codes13 = unpack_int4(codes13) if int4 else codes13
    E, R, K = codes13.shape
    cols = perm13.unsqueeze(1).expand(E, R, K) if perm13.dim() == 2 else perm13.repeat_interleave(R // 2, dim=1)
    codes13 = torch.gather(codes13, 2, cols)
    N = perm2.shape[1]
    rows = torch.cat([perm2, perm2 + N], 1) if config.activation.gated else perm2

    def w13_rows(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        t = t.to(device)
        return torch.gather(t, 1, rows.view(E, R, *([1] * (t.dim() - 2))).expand_as(t))

    codes2 = weights.w2.to(device)
    codes2 = unpack_int4(codes2) if int4 else codes2
    codes2 = torch.gather(codes2, 2, perm2.unsqueeze(1).expand_as(codes2))
    sorted_weights = replace(
        weights, w13=pack_int4(w13_rows(codes13)) if int4 else w13_rows(codes13), w2=pack_int4(codes2) if int4 else codes2,
        w13_scale=w13_rows(weights.w13_scale), w13_zero=w13_rows(weights.w13_zero),
        w13_bias=w13_rows(weights.w13_bias), w13_g_idx=None, w2_g_idx=None)
    return sorted_weights, perm13.to(torch.int32).contiguous()


def _half_experts(weights: ExpertWeights) -> ExpertWeights:
    """w13 [E, 2N, ...] as 2E experts of N rows: expert 2e holds e's gate rows, 2e + 1 its up rows."""
    def split(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.reshape(t.shape[0] * 2, t.shape[1] // 2, *t.shape[2:])

    return replace(weights, w13=split(weights.w13), w13_scale=split(weights.w13_scale),
                   w13_zero=split(weights.w13_zero), w13_bias=split(weights.w13_bias))


class _Processor:
    """Canonical -> kernel layout. Pure: reads `weights`, returns new tensors.

    `layout` names the tensors' shapes and memory order (`quant_gemm_details._layouts`) and changes
    when they do, so packed weights cached under it stay valid. `interleave_gate_up`: gated w13 rows
    (codes, scales, zero points, bias) in `GateUpInterleave(GATE_UP_CHUNK)` order.

    Act-order weights are sorted first (`_act_order_sorted`) and add `w13_perm`; where gate and up
    are grouped apart, w13 is packed as 2E half-experts of N rows (`_half_experts`), not interleaved."""

    def __init__(self, layout: str, interleave_gate_up: bool) -> None:
        self.layout = layout
        self.interleave_gate_up = interleave_gate_up

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        key = weights.key
        wt = _wtype(key)
        out: dict[str, torch.Tensor] = {}
        halves_apart = False
        if key.act_order:
            weights, out["w13_perm"] = _act_order_sorted(weights, config, device)
            halves_apart = out["w13_perm"].dim() == 3
            if halves_apart:
                weights = _half_experts(weights)
        order = None
        if self.interleave_gate_up and config.activation.gated and not halves_apart:
            order = GateUpInterleave(GATE_UP_CHUNK).row_order(config.intermediate_size_per_partition, device)
        for name in ("w13", "w2"):
            rows = order if name == "w13" else None

            def canonical(t: torch.Tensor, rows=rows) -> torch.Tensor:
                t = t.to(device)
                return t if rows is None else t.index_select(1, rows)

            codes = canonical(getattr(weights, name))
            cols = codes.shape[2] * (2 if wt in (WType.INT4, WType.MXFP4) else 1)
            scale = canonical(getattr(weights, f"{name}_scale"))
            zero = getattr(weights, f"{name}_zero")
            if wt is WType.FP8:
                if cols % FP8_BLOCK_K:  # per channel or tensor (128x128 blocks need whole tiles)
                    codes, scale, _ = _padded_to_whole_tiles(wt, codes, scale, None, cols, cols)
                out[name], out[f"{name}_scale"] = codes.contiguous(), scale.float().contiguous()
                continue
            group = _group(key, cols)
            bk = _block_k(wt, cols, group)
            zero = canonical(zero) if zero is not None else None
            if _takes_quads(wt, cols, group):
                if cols % bk:
                    codes, scale, zero = _padded_to_whole_tiles(wt, codes, scale, zero, cols, group)
                out[name] = (ByteQuadsLayout(bk).swizzle(codes) if wt is WType.INT8 else
                             QuadsLayout(bk, E2M1_FIELDS if wt is WType.MXFP4 else INT4_NIBBLES).swizzle(codes))
            elif wt is WType.INT4:
                out[name] = HalvesLayout(bk).swizzle(codes)
            else:
                out[name] = codes.contiguous()
            if wt is WType.MXFP4:
                # `WeightOperand.folded_scale`, decided once by the packing and kept on the CPU: each launch
                # reads it without waiting for the GPU.
                out[f"{name}_scale"], folded = pack_e8m0_tiles(_rows_first(scale, key))
                out[f"{name}_folded_scale"] = torch.tensor(folded)
            else:
                out[f"{name}_scale"] = _rows_first(scale, key)
            if zero is not None:
                out[f"{name}_zero"] = _rows_first(zero, key)
        if weights.has_bias:
            bias = weights.w13_bias.to(device)
            out["w13_bias"] = (bias if order is None else bias.index_select(1, order)).float().contiguous()
            out["w2_bias"] = weights.w2_bias.to(device).float().contiguous()
        return PackedWeights(self.layout, out)


class _QuantTritonExperts(Experts, TunedLaunch):
    backend = "triton"
    # FusedMoE hands the router logits to `apply_monolithic`, which routes with the one-launch Triton
    # router (`router`, also what the oracle names), not moe_core's torch reference (several launches).
    monolithic = True
    router = "moe_triton.routing:route"
    _qmode: ClassVar[QMode] = QMode.NONE

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> None:
        super().__init__(config, quant, device)
        self.config_override: QuantKernelConfig | None = None  # forces the launch shapes (tests, tuning)
        family = self.kernel_family()
        # The tuned-config key of this layer; None for schemes that always use the heuristic.
        self.config_key = None if family is None else ConfigKey(
            family, config.num_local_experts, config.intermediate_size_per_partition, config.hidden_size,
            config.top_k, str(config.dtype).removeprefix("torch."), device_tag(device.name))
        self._lookups: dict[int, Lookup] = {}
        self._fused_paths: dict[FusedDecodeConfig, object] = {}  # `_fused_decode`'s, by options
        # The GEMM operands of the loaded weights, built on first use (a call builds them several times).
        self._operands: tuple[PackedWeights | None, dict[tuple[str, int, int], WeightOperand]] = (None, {})

    def kernel_family(self) -> str | None:
        """The tuned-config family (`moe_triton.configs`) of this scheme; None: always the heuristic."""
        return None

    def _find_config(self, num_tokens: int) -> Lookup:
        """Only a tuned file of this exact shape (`file_config`), else `pick_config`'s measured
        heuristic: unlike the 16-bit tiles, a quantized launch shape does not carry over to other shapes."""
        hit = self.file_config(num_tokens)
        if hit is None:
            hit = Lookup(self.heuristic_config(num_tokens), "default",
                         "pick_config heuristic (no tuned file of this shape)")
        return hit

    def file_config(self, num_tokens: int) -> Lookup | None:
        """The launch shapes a file of this exact shape gives (`configs.lookup_exact`: this device's,
        else another one's; MXFP4 and symmetric int8 the int4 file of its shape), as this layer runs them: off sm_90 wgmma
        GEMMs as tl.dot ones, borrowed ones `borrowed_as_served`; None without a file."""
        hit = lookup_exact(self.config_key, num_tokens) if self.config_key is not None else None
        if hit is None:
            return None
        hit = self._runnable(hit)
        if hit.source == "borrowed":
            int8 = self.quant.weight.dtype is QuantDType.INT8  # on byte quads: per channel or g128, any K
            served = borrowed_as_served(hit.config, int8=int8)
            if served != hit.config:
                lent, changes = hit.config, []
                if any(g.num_stages != h.num_stages for g, h in ((served.gemm1, lent.gemm1), (served.gemm2, lent.gemm2))):
                    changes.append(f"stages capped at {BORROWED_MAX_STAGES}")
                if any(g.block_n != h.block_n for g, h in ((served.gemm1, lent.gemm1), (served.gemm2, lent.gemm2))):
                    changes.append(f"tl.dot tiles of 32+ pairs at most {BORROWED_INT8_DOT_MAX_N} wide")
                if lent.fused is not None:
                    changes.append("the lender's fused decode options dropped")
                if lent.gemm1.mma or lent.gemm2.mma:
                    changes.append("mma off (the lender's choice, measured on int4)")
                hit = Lookup(served, hit.source, ", ".join([hit.detail, *changes]))
        return hit

    def lender_config(self, num_tokens: int) -> Lookup | None:
        """The entry of a lender's file of this exact shape on this device (`configs.lender_lookup`: MXFP4
        and symmetric int8 the int4 one) as this layer can run it, its mma GEMMs kept, where `file_config`
        serves a borrowed entry on the tl.dot kernel: what `moe tune` times beside the file's own; None
        without one."""
        hit = lender_lookup(self.config_key, num_tokens) if self.config_key is not None else None
        return None if hit is None else self._runnable(hit)

    def _runnable(self, hit: Lookup) -> Lookup:
        """hit with the GEMMs this layer cannot run on the tl.dot kernel, said in its detail: wgmma ones
        off an sm_90 GPU (another GPU's file, or a borrowed one), mma ones where `_mma_serves` says no."""
        if (hit.config.gemm1.wgmma or hit.config.gemm2.wgmma) and not (
                self.device.platform is Platform.CUDA and wgmma_capable(self.device.torch_device)):
            plain = QuantKernelConfig(_as_tl_dot(hit.config.gemm1), _as_tl_dot(hit.config.gemm2))
            hit = Lookup(plain, hit.source, hit.detail + ", wgmma off (not an sm_90 GPU)")
        mma_off = [name for name, g, cols in (("gemm1", hit.config.gemm1, self.config.hidden_size),
                                              ("gemm2", hit.config.gemm2, self.config.intermediate_size_per_partition))
                   if g.mma and not self._mma_serves(cols)]
        if mma_off:
            served = replace(hit.config, **{name: getattr(hit.config, name).on_tl_dot() for name in mma_off})
            hit = Lookup(served, hit.source, hit.detail + ", mma off (its kernel takes int4, int8 or MXFP4 quads "
                         "without act-order on NVIDIA sm_80 or later)")
        return hit

    def _mma_serves(self, cols: int) -> bool:
        """Whether the mma kernel (`GemmConfig.mma`) takes this layer's GEMM of K = cols on its device:
        weights its launcher takes (`quant_gemm.mma_takes`, from the layout this layer gives them),
        without act-order, on an NVIDIA GPU of sm_80 or later, compiled."""
        key = self.quant.weight
        wtype, group = _wtype(key), _group(key, cols)
        return (not key.act_order and mma_takes(wtype, _takes_quads(wtype, cols, group), _block_k(wtype, cols, group),
                                                _operand_group(wtype, cols, group))
                and mma_capable(self.device))

    def heuristic_config(self, num_tokens: int) -> QuantKernelConfig:
        """`pick_config`'s launch shapes for both GEMMs (what `moe tune --quant int4` searches around)."""
        cfg = self.config
        pairs = num_tokens * cfg.top_k
        w13 = self._operand("w13", cfg.w13_rows, cfg.hidden_size)
        w2 = self._operand("w2", cfg.hidden_size, cfg.intermediate_size_per_partition)
        sms = num_sms(self.device.torch_device)
        return QuantKernelConfig(pick_config(pairs, w13.num_experts, w13, sms),
                                 pick_config(pairs, w2.num_experts, w2, sms))

    def _operand(self, name: str, n: int, k: int) -> WeightOperand:
        p = self._packed()
        loaded, operands = self._operands
        if loaded is not p:
            loaded, operands = self._operands = (p, {})
        operand = operands.get((name, n, k))
        if operand is None:
            operand = operands[(name, n, k)] = self._build_operand(p, name, n, k)
        return operand

    def _build_operand(self, p: PackedWeights, name: str, n: int, k: int) -> WeightOperand:
        key = self.quant.weight
        wt = _wtype(key)
        if wt is WType.FP8:
            # k: the codes' K, padded to whole tiles (`_padded_to_whole_tiles`)
            return WeightOperand(wt, p[name], p[f"{name}_scale"], None, n, p[name].shape[2], 0, FP8_BLOCK_K, 0)
        group = _group(key, k)
        if name == "w13" and self._w13_halves_apart:
            n //= 2  # half-experts of N rows (`_half_experts`)
        folded = p.get(f"{name}_folded_scale")
        return WeightOperand(wt, p[name], p[f"{name}_scale"], p.get(f"{name}_zero"), n, k, _operand_group(wt, k, group),
                             _block_k(wt, k, group), key.code_offset, folded_scale=folded is not None and bool(folded))

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
              ) -> torch.Tensor:
        if checking_ids_on_accelerators():
            check_routed_inputs(hidden_states, topk_weights, topk_ids, self.config)
        _check_inputs(hidden_states, topk_weights, topk_ids, self.config)
        fused = self._fused_decode(hidden_states.shape[0])
        if fused is not None:
            return fused.launch_routed(hidden_states, topk_weights, topk_ids)
        return self._apply(hidden_states, topk_weights, topk_ids, None)

    def _fused_decode(self, num_tokens: int):
        """The one-launch decode path (`moe_triton.fused_decode.FusedDecode`) where this call's launch
        configuration names it and the call is small enough for it, else None; built once per options."""
        if not 0 < num_tokens <= FUSED_DECODE_MAX_TOKENS:
            return None
        options = self.config_for(num_tokens).config.fused
        if options is None:
            return None
        fused = self._fused_paths.get(options)
        if fused is None:
            from moe_triton.fused_decode import FusedDecode  # imports this module

            fused = self._fused_paths[options] = FusedDecode(self, **asdict(options))
        return fused

    def apply_monolithic(self, hidden_states: torch.Tensor, router_logits: torch.Tensor,
                         correction_bias: torch.Tensor | None) -> torch.Tensor:
        """FusedMoE's call: route with `moe_triton.routing.route`, then `apply`. Where a split GEMM1
        finishes its sums by last arrival (up to LAST_ARRIVAL_MAX_TOKENS tokens), the routing launch
        also clears those sums (and where GEMM2 waits per block, the blocks' counters), and up to
        ROUTE_QUANTIZES_MAX_TOKENS tokens it quantizes block fp8's input: a launch fewer each than apart."""
        cfg = self.config
        if router_logits.dim() != 2 or router_logits.shape[0] != hidden_states.shape[0]:
            raise ValueError(f"router_logits must be [{hidden_states.shape[0]}, {cfg.num_experts}] (a row per token "
                             f"of hidden_states), got {list(router_logits.shape)}")
        fused = self._fused_decode(hidden_states.shape[0])
        if fused is not None:
            return fused.from_logits(hidden_states, router_logits, correction_bias)
        # Before the routing launch, which may read hidden_states; its own outputs need no checks.
        _check_hidden_states(hidden_states, cfg)
        if router_logits.device != hidden_states.device:
            raise ValueError(f"router_logits on {router_logits.device}, hidden_states on {hidden_states.device}: "
                             "one device is accepted")
        M = router_logits.shape[0]
        sums_numel = self._gemm1_sums_numel(M)
        numel = sums_numel + self._ready_numel(M)
        zeroed = torch.empty(numel, dtype=torch.int32, device=router_logits.device) if numel else None
        gemm1_input = None
        if self._qmode is QMode.GROUP128 and 0 < M <= ROUTE_QUANTIZES_MAX_TOKENS and not cfg.routing.weight_on_input:
            gemm1_input = (torch.empty(M, cfg.hidden_size, dtype=torch.float8_e4m3fn, device=hidden_states.device),
                           torch.empty(M, cfg.hidden_size // 128, dtype=torch.float32, device=hidden_states.device))
        topk_weights, topk_ids = route(router_logits, cfg.routing, cfg.top_k, correction_bias, zero=zeroed,
                                       quantize=(hidden_states, *gemm1_input) if gemm1_input is not None else None)
        # The buffer is GEMM1's sums, then GEMM2's block counters: sliced only where it holds both.
        both = 0 < sums_numel < numel
        return self._apply(hidden_states, topk_weights, topk_ids,
                           (zeroed[:sums_numel] if both else zeroed) if sums_numel else None, gemm1_input,
                           router_logits if self._ranks_by_logit else None,
                           (zeroed[sums_numel:] if both else zeroed) if numel > sums_numel else None)

    @cached_property
    def _ranks_by_logit(self) -> bool:
        """Whether the routing's top-k are the logits' (`Routing.chooses_by_logit`), the layer's input is
        GEMM1's (no routing weight on it) and the experts are all this rank's, so that GEMM1's programs can
        find their pair's expert themselves (`GemmConfig.own_route`)."""
        r = self.config.routing
        return r.chooses_by_logit and not r.weight_on_input and self.expert_map is None

    def _gemm1_sums_numel(self, num_tokens: int) -> int:
        """int32 elements, zero on entry, of a GEMM1 split over K at this many tokens: the sums and
        arrival counts it finishes by last arrival (16-bit activations), or fp8's fp32 sums that the
        activation launch quantizes; 0 where GEMM1 needs none."""
        cfg = self.config
        if not 0 < num_tokens <= LAST_ARRIVAL_MAX_TOKENS or self._w13_halves_apart:
            return 0
        gemm1 = self.config_for(num_tokens).config.gemm1
        split = effective_split(gemm1.split_k, self._operand("w13", cfg.w13_rows, cfg.hidden_size))
        if not _gemm1_adds_sums(gemm1, split, self._gate_up_chunk):
            return 0
        pairs = num_tokens * cfg.top_k
        return _gemm1_sums_len(pairs, cfg.w13_rows, gemm1.block_n) if self._qmode is QMode.NONE else pairs * cfg.w13_rows

    def _ready_numel(self, num_tokens: int) -> int:
        """int32 counters, zero on entry, of a call whose GEMM2 waits per block (`GemmConfig.block_ready`):
        one per M block and one for GEMM1's side job; 0 where it does not (GEMM1 not storing GEMM2's
        input itself, where the option changes nothing)."""
        cfg = self.config
        if num_tokens == 0:
            return 0
        launch = self.config_for(num_tokens).config
        if not launch.gemm2.block_ready:
            return 0
        split1 = effective_split(launch.gemm1.split_k, self._operand("w13", cfg.w13_rows, cfg.hidden_size))
        if not _gemm1_activates(self._qmode, split1, num_tokens, self._w13_halves_apart):
            return 0
        direct = self._direct_max_tokens >= num_tokens
        return BlockReady.counts_numel(num_tokens * cfg.top_k, launch.gemm1.block_m, cfg.num_experts, direct)

    def _apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
               gemm1_sums: torch.Tensor | None,
               gemm1_input: tuple[torch.Tensor, torch.Tensor] | None = None,
               router_logits: torch.Tensor | None = None,
               ready_counts: torch.Tensor | None = None) -> torch.Tensor:
        """The layer on inputs its callers checked (`apply`, or `apply_monolithic` whose router made the
        top-k). gemm1_sums: `_gemm1_sums_numel` int32 elements already zeroed (by the routing launch),
        or None: zeroed here where GEMM1 needs them. gemm1_input: block fp8's GEMM1 operand (e4m3
        codes, scales per 128-wide group) already quantized (by the routing launch), or None.
        router_logits: the logits topk_ids are the top-k of (`_ranks_by_logit`), for GEMM1's own routing at
        one token (`GemmConfig.own_route`), or None. ready_counts: `_ready_numel` int32 elements already
        zeroed (by the routing launch), or None: zeroed here where GEMM2 waits per block."""
        cfg = self.config
        K, N, R = cfg.hidden_size, cfg.intermediate_size_per_partition, cfg.w13_rows
        M, topk = topk_ids.shape
        P = M * topk
        dev = hidden_states.device
        if M == 0:
            return torch.zeros(M, K, dtype=cfg.dtype, device=dev)
        w13, w2 = self._operand("w13", R, K), self._operand("w2", K, N)
        E_local = w13.num_experts
        launch = self.config_for(M).config
        c1, c2 = launch.gemm1, launch.gemm2
        split1, split2 = effective_split(c1.split_k, w13), effective_split(c2.split_k, w2)
        # A few tokens: a block per pair without the alignment launch (`direct_quant_gemm`).
        direct = self._direct_max_tokens >= M
        if direct:
            ids32 = topk_ids.to(torch.int32).contiguous()
            gemm = partial(direct_quant_gemm, topk_ids=ids32, expert_map=self.expert_map)
        else:
            sorted_ids, expert_ids, num_post = align_block_size(topk_ids, c1.block_m, cfg.num_experts,
                                                                self.expert_map)
            gemm = partial(grouped_quant_gemm, sorted_ids=sorted_ids, expert_ids=expert_ids, num_post=num_post,
                           num_valid=P)
        x = hidden_states
        routed = None  # GEMM2's router weights, converted here: no launch between the GEMMs
        if cfg.routing.weight_on_input:  # Llama4 (top-1): scale the input, not the output
            x = (x.float() * topk_weights.float()).to(cfg.dtype)
        else:
            routed = topk_weights.float().contiguous()
        packed = self._packed()
        qm = self._qmode
        fp8 = torch.float8_e4m3fn
        a_mode = AScale.GROUP if qm is QMode.GROUP128 else (AScale.ROW if qm is not QMode.NONE else AScale.NONE)
        # The CPU interpreter truncates fp32 -> bf16 stores, so there bf16 intermediates stay fp32.
        inter_dtype = torch.float32 if (interpreting() and cfg.dtype == torch.bfloat16) else cfg.dtype

        # GEMM2 sums a token's top-k choices (and K-splits) in fp32 (and their arrival counts), zero
        # on entry: GEMM1 clears them on the side. Many pairs: GEMM2 stores each pair's row instead,
        # and one reduce sums them.
        finish_last = M <= LAST_ARRIVAL_MAX_TOKENS
        min_rows_pairs = ROWS_SUM_MIN_PAIRS_TOP8 if topk >= 8 else ROWS_SUM_MIN_PAIRS
        sum_rows = topk > 1 and split2 == 1 and not finish_last and min_rows_pairs <= P
        scratch2 = None
        if topk * split2 > 1 and not sum_rows:
            arrivals2 = M * -(-K // c2.block_n) if finish_last else 0
            scratch2 = torch.empty(M * K + arrivals2, dtype=torch.int32, device=dev)
            sums2 = scratch2[:M * K].view(torch.float32).view(M, K)

        # GEMM1 operand: fp8 codes with scales (per token/group: once per token; per expert-tensor: per pair).
        a1, a1_scale, a1_div = x, None, topk
        pair_expert = None  # each pair's local expert, for per-tensor scales only
        if gemm1_input is not None:
            a1, a1_scale = gemm1_input
        elif qm in (QMode.TOKEN, QMode.GROUP128):
            a1, a1_scale = act_quant(x, None, qm, fp8, M, out_cols=w13.k)
        elif qm is QMode.TENSOR:
            # Per-tensor fp8 scales are per expert's rows: the quantization needs each pair's local expert.
            pair_expert = topk_ids.flatten().long()
            if self.expert_map is not None:
                pair_expert = self.expert_map.long()[pair_expert]
            pair_expert = pair_expert.to(torch.int32)
            a1, a1_scale = act_quant(x, None, qm, fp8, P, topk, pair_expert, E_local, out_cols=w13.k)
            a1_div = 1
        gemm1_launch = gemm
        perm = packed.get("w13_perm")
        if perm is not None:  # act-order WNA16: each pair's input in its expert's sorted channel order
            a1, gemm1_launch = self._act_order_gemm1(x, topk_ids, perm, gemm, c1.block_m, direct)
            a1_div = 1
        halves_apart = perm is not None and perm.dim() == 3
        gemm1 = partial(gemm1_launch, a1, w13, cfg=c1, a_rows_div=a1_div, a_scale=a1_scale, a_scale_mode=a_mode,
                        bias=packed.get("w13_bias"), zero_side=scratch2)
        if M == 1 and c1.own_route and router_logits is not None and perm is None and qm is QMode.NONE:
            gemm1 = partial(gemm1, own_route=router_logits.contiguous())
        chunk = self._gate_up_chunk
        ready2 = None
        if _gemm1_activates(qm, split1, M, halves_apart):
            # The activation in GEMM1's epilogue, once a tile's sums are whole.
            a2 = torch.empty(P, N, dtype=inter_dtype, device=dev)
            if c2.block_ready:  # the launches check the counters' size
                counts = ready_counts if ready_counts is not None else zeroed_int32(
                    BlockReady.counts_numel(P, c1.block_m, cfg.num_experts, direct), dev)
                gemm1 = partial(gemm1, ready=BlockReady(counts, wait=False))
                ready2 = BlockReady(counts, wait=True, per_block=programs_per_block(w13, c1),
                                    zeroed=scratch2.numel() if scratch2 is not None else 0)
            if not _gemm1_adds_sums(c1, split1, chunk):
                gemm1(a2, activation=cfg.activation, gate_up_chunk=chunk)
            else:
                # A zeroing launch is a noticeable share of a one-token layer: FusedMoE's routing
                # launch clears these sums instead (`apply_monolithic`).
                numel = _gemm1_sums_len(P, R, c1.block_n)
                scratch1 = gemm1_sums if gemm1_sums is not None else zeroed_int32(numel, dev)
                assert scratch1.numel() == numel, (scratch1.numel(), numel)
                gemm1(scratch1[:P * R].view(torch.float32).view(P, R), activation=cfg.activation,
                      gate_up_chunk=chunk, last_arrival=LastArrival(a2, scratch1[P * R:]))
            a2_scale = None
        else:
            # fp8 keeps GEMM1's output in fp32 so the quantization of GEMM2's input sees the reference's values.
            h_dtype = torch.float32 if (split1 > 1 or qm is not QMode.NONE) else inter_dtype
            if split1 > 1:  # atomic sums, zero on entry: cleared by the routing launch, or a dependent one
                scratch1 = gemm1_sums if gemm1_sums is not None else zeroed_int32(P * R, dev)
                assert scratch1.numel() == P * R, (scratch1.numel(), P * R)
                h = scratch1.view(torch.float32).view(P, R)
            else:
                h = torch.empty(P, R, dtype=h_dtype, device=dev)
            # Half-experts write a pair's gate row, then its up row: [2P, N] is h's [gate | up] rows.
            gemm1(h.view(2 * P, N) if halves_apart else h, atomic=split1 > 1)
            a2, a2_scale = act_quant(h, cfg.activation, qm, fp8 if qm is not QMode.NONE else inter_dtype, P,
                                     1, pair_expert, E_local, gate_up_chunk=chunk, out_cols=w2.k)
        # prefetch_l2: GEMM2's first weight tiles head for L2 while GEMM1 runs (direct launches; aligned ones where
        # the entry asks, `GemmConfig.prefetch_tiles`).
        gemm2 = partial(gemm, a2, w2, cfg=c2, a_scale=a2_scale, a_scale_mode=a_mode, bias=packed.get("w2_bias"),
                        topk_weights=routed, reduce_topk=topk, prefetch_l2=True, ready=ready2)
        if sum_rows:
            rows = torch.empty(P, K, dtype=inter_dtype, device=dev)
            gemm2(rows, reduce_topk=1)
            return topk_sum(rows, topk, cfg.dtype)
        out = torch.empty(M, K, dtype=cfg.dtype, device=dev)
        if scratch2 is None:  # one contribution per output row: stored as it is
            gemm2(out)
        elif finish_last:
            gemm2(sums2, last_arrival=LastArrival(out, scratch2[M * K:]))
        else:
            gemm2(sums2, atomic=True)
            out.copy_(sums2)
        return out

    @property
    def _direct_max_tokens(self) -> int:
        """Most tokens of a call whose GEMMs take a block per pair (no alignment launch)."""
        cfg = self.config
        wide = cfg.top_k >= WIDE_ROUTER_TOP_K and cfg.num_experts >= WIDE_ROUTER_EXPERTS
        return max(DIRECT_MAX_TOKENS, DIRECT_MAX_TOKENS_WIDE_ROUTER if wide else 0)

    @property
    def _gate_up_chunk(self) -> int:
        """Rows per gate/up chunk of the packed w13 (0: canonical [gate | up] or not gated)."""
        if self._w13_halves_apart:
            return 0
        return GATE_UP_CHUNK if self.weight_processor.interleave_gate_up and self.config.activation.gated else 0

    @property
    def _w13_halves_apart(self) -> bool:
        """Act-order weights whose gate and up halves are grouped apart: w13 packed as 2E half-experts."""
        perm = self._packed().get("w13_perm")
        return perm is not None and perm.dim() == 3

    def _act_order_gemm1(self, x: torch.Tensor, topk_ids: torch.Tensor, perm: torch.Tensor, gemm: partial,
                         block_m: int, direct: bool) -> tuple[torch.Tensor, partial]:
        """(GEMM1's input, the GEMM launcher to take it) for act-order weights (`_act_order_sorted`).

        One order per expert (perm [E, K]): row p of the input is pair p's token in its expert's
        order, through the layer's own launcher `gemm`. Gate and up grouped apart (perm [E, 2, K]): each
        pair becomes two, of half-experts 2e and 2e + 1 (rows 2p and 2p + 1, each in its half's order),
        aligned on their own; GEMM1 then writes [2P, N], that is [P, 2N] as [gate | up], and the
        activation runs as its own launch."""
        M, topk = topk_ids.shape
        ids = topk_ids.to(torch.int32)
        expert_map = self.expert_map
        if perm.dim() == 2:
            local = ids if expert_map is None else expert_map[ids.long()]
            return permute_pair_rows(x, perm, local.flatten(), topk), gemm
        halves = torch.arange(2, dtype=torch.int32, device=ids.device)
        half_ids = (2 * ids.unsqueeze(-1) + halves).view(M, 2 * topk)
        half_map = None
        if expert_map is not None:  # global half-expert -> local one, -1 stays -1
            half_map = torch.where(expert_map.unsqueeze(-1) >= 0, 2 * expert_map.unsqueeze(-1) + halves, -1)
            half_map = half_map.flatten().to(torch.int32)
        local = half_ids if half_map is None else half_map[half_ids.long()]
        a1 = permute_pair_rows(x, perm.view(-1, perm.shape[-1]), local.flatten(), 2 * topk)
        if direct:
            return a1, partial(direct_quant_gemm, topk_ids=half_ids.contiguous(), expert_map=half_map)
        sorted_ids, expert_ids, num_post = align_block_size(half_ids, block_m, 2 * self.config.num_experts, half_map)
        return a1, partial(grouped_quant_gemm, sorted_ids=sorted_ids, expert_ids=expert_ids, num_post=num_post,
                           num_valid=2 * M * topk)


def _gemm1_activates(qm: QMode, split1: int, num_tokens: int, halves_apart: bool) -> bool:
    """Whether GEMM1 stores GEMM2's input itself, the activation in its epilogue: 16-bit activations,
    whole sums in the tile (one K-split, or finished by last arrival up to LAST_ARRIVAL_MAX_TOKENS
    tokens), gate and up in one operand. Otherwise a launch between the GEMMs takes GEMM1's output."""
    return qm is QMode.NONE and (split1 == 1 or num_tokens <= LAST_ARRIVAL_MAX_TOKENS) and not halves_apart


def _gemm1_adds_sums(gemm1: GemmConfig, split: int, gate_up_chunk: int) -> bool:
    """Whether GEMM1 adds into fp32 sums (split over K, or on the mma kernel with a gated activation,
    whose gate and up rows lie in other warps: it finishes by last arrival) rather than storing its rows."""
    return split > 1 or (gemm1.mma and gate_up_chunk > 0)


def _gemm1_sums_len(pairs: int, rows: int, block_n: int) -> int:
    """int32 elements of a split GEMM1's last-arrival scratch: fp32 sums [pairs, rows], then an
    arrival count per pair and block of rows."""
    return pairs * rows + pairs * -(-rows // block_n)


# A borrowed int4 wgmma launch shape's pipeline depth for MXFP4: its ring also holds each K tile's
# e8m0 exponents (4 bytes per weight row), and int4's four-stage 128 x 256 wgmma tiles fill the H100's
# shared memory to within 1 KB (233,540 bytes needed against 232,448 on qwen3-235b-a22b at 2048
# tokens). MXFP4's tl.dot tiles keep their depth: the deepest int4 one lent (32 x 256, five stages)
# needs 128 KB with MXFP4's exponents. int8's words are twice int4's bytes, so every GEMM is capped:
# that tile at five stages would need about 200 KB (an A100 has 164).
BORROWED_MAX_STAGES = 3
# int8's tl.dot tiles of 32 or more pairs at most this many columns wide: 256 columns hold twice int4's
# words in registers beside the larger accumulator and spill (sm_90 builds, four warps, three stages:
# 32 x 256 308 bytes per thread, 64 x 256 428; 16 x 256, 32 x 128 and 64 x 128 none), where 128
# columns carry the bytes of int4's 256.
BORROWED_INT8_DOT_MAX_N = 128


def borrowed_as_served(config: QuantKernelConfig, *, int8: bool = False) -> QuantKernelConfig:
    """A borrowed int4 launch shape as MXFP4 (wgmma GEMMs) or int8 (every GEMM) runs it: at most
    BORROWED_MAX_STAGES stages deep; int8's tl.dot GEMMs of 32+ pairs at most BORROWED_INT8_DOT_MAX_N wide;
    the mma kernel's GEMMs on the tl.dot kernel (the lender chose that kernel for int4's dequantization)."""
    def served(g: GemmConfig) -> GemmConfig:
        g = g.on_tl_dot()
        if g.wgmma or int8:
            g = replace(g, num_stages=min(g.num_stages, BORROWED_MAX_STAGES))
        if int8 and not g.wgmma and g.block_m >= 32:
            g = replace(g, block_n=min(g.block_n, BORROWED_INT8_DOT_MAX_N))
        return g

    return QuantKernelConfig(served(config.gemm1), served(config.gemm2))


def _as_tl_dot(gemm: GemmConfig) -> GemmConfig:
    """A wgmma launch shape as the tl.dot kernel's, without a tail that kernel does not take (its
    dots are 16 wide or more: an 8-pair tail goes, a 16-pair one stays)."""
    return replace(gemm, wgmma=False, tail=gemm.tail if gemm.tail in (16, 32) else 0)


def _check_hidden_states(x: torch.Tensor, cfg: MoEConfig) -> None:
    if x.dim() != 2 or x.shape[1] != cfg.hidden_size:
        raise ValueError(f"hidden_states must be [M, {cfg.hidden_size}], got {list(x.shape)}")
    if x.dtype != cfg.dtype:
        raise ValueError(f"hidden_states dtype {x.dtype} differs from the layer dtype {cfg.dtype}")
    if not x.is_contiguous():
        raise ValueError("hidden_states must be contiguous")


def _check_inputs(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg: MoEConfig) -> None:
    _check_hidden_states(x, cfg)
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_ids.shape[1] != cfg.top_k:
        raise ValueError(f"topk_ids must be [{x.shape[0]}, {cfg.top_k}], got {list(topk_ids.shape)}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights shape {list(topk_weights.shape)} differs from topk_ids {list(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if not (x.device == topk_ids.device == topk_weights.device):
        raise ValueError("hidden_states, topk_weights and topk_ids must be on one device")


_INT_GRANS = frozenset({Granularity.GROUP, Granularity.CHANNEL})
_INT_ZP = frozenset({ZeroPoint.NONE, ZeroPoint.INTEGER})
_GROUPS = frozenset({32, 64, 128})


class TritonWna16Experts(_QuantTritonExperts):
    """int4/int8 weights (GPTQ, AWQ, compressed-tensors after the canonical form), 16-bit activations."""

    weight_processor = _Processor(f"triton.wna16.quads-k-padded-or-halves.int8-byte-quads-k-padded.gate-up-{GATE_UP_CHUNK}",
                                  interleave_gate_up=True)
    capability = Capability(
        platforms=_GPUS,
        schemes=(
            SchemeSupport(QuantDType.INT4, _INT_GRANS, group_sizes=_GROUPS, zero_points=_INT_ZP, act_order=True),
            SchemeSupport(QuantDType.INT8, _INT_GRANS, group_sizes=_GROUPS, zero_points=_INT_ZP, act_order=True),
        ),
        min_capability=(8, 0),
        **_SHARED_CAPABILITY,
        limitations=(
            "act-order (g_idx): each expert's channels are sorted by group at load and each (token, choice) "
            "pair's input gathered in that order per call (top_k copies of the input); where gate and up are "
            "grouped apart GEMM1 runs over 2E half-experts and the activation as its own launch; "
            "checked under the CPU interpreter only, not yet on a GPU",
            "act-order only where every group holds exactly group_size channels (checked at load)",
            "float zero points (HQQ/tinygemm) are refused",
        ),
    )

    def kernel_family(self) -> str | None:
        w = self.quant.weight
        group = f"g{w.group_size}" if w.scale.granularity is Granularity.GROUP else "channel"
        return f"wna16-{w.dtype.value}-{group}" + ("-zp" if w.zero_point is not ZeroPoint.NONE else "")

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device) -> Support:
        g = quant.weight.group_size
        n = config.intermediate_size_per_partition
        if g is not None and (config.hidden_size % g or n % g):
            return Support.no(f"group size {g} must divide K={config.hidden_size} and N={n}")
        return Support.yes()


class TritonFp8Experts(_QuantTritonExperts):
    """fp8 e4m3 weights and dynamically quantized fp8 activations."""

    weight_processor = _Processor("triton.fp8.canonical-k-padded", interleave_gate_up=False)
    capability = Capability(
        platforms=frozenset({Platform.CUDA}),
        schemes=(
            SchemeSupport(QuantDType.FP8_E4M3, frozenset({Granularity.TENSOR, Granularity.CHANNEL}),
                          activation=QuantDType.FP8_E4M3),
            SchemeSupport(QuantDType.FP8_E4M3, frozenset({Granularity.BLOCK}),
                          block_shapes=frozenset({(128, 128)}), activation=QuantDType.FP8_E4M3),
        ),
        min_capability=(8, 9),
        **_SHARED_CAPABILITY,
        limitations=("e4m3fn only (ROCm's fnuz fp8 is not handled)",),
    )

    def kernel_family(self) -> str | None:
        """By weight scale granularity ("fp8-tensor", "fp8-channel", "fp8-block"): the activation scales
        each pairs with run the same kernel code. Files ship for fp8 blocks (H100, H200) and for the
        per-channel shapes of qwen3-30b-a3b, gpt-oss-120b and qwen3-235b-a22b (H200); elsewhere
        `pick_config` unless one is tuned."""
        return f"fp8-{self.quant.weight.scale.granularity.value}"

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device) -> Support:
        w, a = quant.weight, quant.activation
        g, ag = w.scale.granularity, a.scale.granularity
        # Per-token activation scales pair with per-tensor or per-channel weights (one scale per A row).
        accepted = {Granularity.TENSOR: (Granularity.TOKEN, Granularity.TENSOR),
                    Granularity.CHANNEL: (Granularity.TOKEN,), Granularity.BLOCK: (Granularity.GROUP,)}[g]
        if ag not in accepted:
            return Support.no(f"{g.value} fp8 weights with {ag.value} activation scales "
                              f"(needs {' or '.join(a.value for a in accepted)})")
        if g is Granularity.BLOCK:
            if a.scale.group_size != 128:
                return Support.no(f"activation group {a.scale.group_size} with 128x128 weight blocks (needs 128)")
            n = config.intermediate_size_per_partition
            if config.hidden_size % 128 or n % 128:
                return Support.no(f"block fp8 needs K and N divisible by 128 (K={config.hidden_size}, N={n})")
        return Support.yes()

    @cached_property  # read several times per call: the quantization is fixed at construction
    def _qmode(self) -> QMode:  # type: ignore[override]
        g = self.quant.activation.scale.granularity
        return {Granularity.TENSOR: QMode.TENSOR, Granularity.TOKEN: QMode.TOKEN,
                Granularity.GROUP: QMode.GROUP128}[g]


class TritonMxfp4Experts(_QuantTritonExperts):
    """OCP MXFP4 weights (e2m1 codes, e8m0 scales per 32) with 16-bit activations (gpt-oss)."""

    weight_processor = _Processor(f"triton.mxfp4.quads-e2m1-fields-e8m0-factor-words-k-padded.gate-up-{GATE_UP_CHUNK}",
                                  interleave_gate_up=True)
    capability = Capability(
        platforms=_GPUS,
        schemes=(SchemeSupport(QuantDType.FP4_E2M1, frozenset({Granularity.GROUP}), group_sizes=frozenset({32})),),
        min_capability=(8, 0),
        **_SHARED_CAPABILITY,
        limitations=("weights are dequantized in registers (no native fp4 tensor-core path)",),
    )

    def kernel_family(self) -> str | None:
        """MXFP4 files ship for three H100 shapes (tuned where that beat int4's shapes); elsewhere the
        lookup takes the int4 launch shapes of the shape (`configs.BORROWED_FAMILIES`)."""
        return "mxfp4"
