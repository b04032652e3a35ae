"""Marlin fused-MoE GEMMs (`torch.ops._moe_C.moe_wna16_marlin_gemm`) from vLLM 0.26.0's prebuilt
library, for weight-only int4/int8 (GPTQ, AWQ zero points, act-order), fp8 and MXFP4 weights with
bf16/fp16 activations.

The layer routes with moe-triton's router (`moe_triton.routing`, one launch); the library's
`moe_align_block_size` (`align_blocks`, its torch twin, under an expert map) sorts the routed pairs
by expert into blocks of `block_size_m` rows (the kernel's sorted-ids form); GEMM1 writes one row per
pair, the activation runs between the GEMMs (moe-triton's `act_quant`, one pass), GEMM2 multiplies
each row by its router weight, and the top-k rows of a token are summed (moe-triton's `topk_sum`, one
pass). Weights are repacked into Marlin's tiles here (`moe_cuda.marlin_layout`), never by vLLM's
`gptq_marlin_repack`, which lives in a second library.

`marlin_twin` computes what the kernel computes from the same arguments, in torch: the CPU tests run
this class's whole path with it, so only the kernel itself is left for the GPU to prove.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import MoEConfig
from moe_core.experts import Capability, Experts, SchemeSupport, Support
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType, QuantKey, ZeroPoint
from moe_core.weights import ExpertWeights, PackedWeights
from moe_core.weights.packing import E2M1_VALUES, unpack_int4
from moe_cuda.dispatch import activate
from moe_cuda.grouped_mm import ALL_ACTIVATIONS, ROUTED_BY_CORE
from moe_cuda.marlin_layout import (
    marlin_bias,
    marlin_repack,
    marlin_scales,
    marlin_unbias,
    marlin_unpack,
    marlin_unscale,
    marlin_zero_points,
    marlin_zero_points_unpack,
    scalar_type_id,
)
from moe_cuda.vendor import MARLIN_LIBRARY, announce_first_compile
from moe_triton.topk_sum import topk_sum

__all__ = [
    "BLOCK_SIZES_M",
    "FLOAT4_E2M1F",
    "FLOAT8_E4M3FN",
    "UINT4",
    "UINT4B8",
    "UINT8B128",
    "MarlinBlocks",
    "MarlinExperts",
    "MarlinProcessor",
    "MarlinWeightType",
    "align_blocks",
    "block_size_m",
    "library_align_blocks",
    "marlin_twin",
    "weight_type",
]

# vLLM's NanRepr numbering (part of the ScalarType id)
_NAN_NONE, _NAN_IEEE_754, _NAN_EXTD_RANGE_MAX_MIN = 0, 1, 2


@dataclass(frozen=True)
class MarlinWeightType:
    """One weight type the kernel dequantizes, as its ScalarType id names it."""

    name: str  # vLLM's spelling
    bits: int  # code width: 4 or 8
    type_id: int  # vLLM ScalarType id passed as b_q_type
    code_offset: int  # implicit zero of symmetric integer codes (0: zero points, or a float type)


UINT4 = MarlinWeightType("uint4", 4, scalar_type_id(0, 4, False, 0, False, _NAN_IEEE_754), 0)
UINT4B8 = MarlinWeightType("uint4b8", 4, scalar_type_id(0, 4, False, 8, False, _NAN_IEEE_754), 8)
UINT8B128 = MarlinWeightType("uint8b128", 8, scalar_type_id(0, 8, False, 128, False, _NAN_IEEE_754), 128)
FLOAT8_E4M3FN = MarlinWeightType("float8_e4m3fn", 8, scalar_type_id(4, 3, True, 0, True, _NAN_EXTD_RANGE_MAX_MIN), 0)
FLOAT4_E2M1F = MarlinWeightType("float4_e2m1f", 4, scalar_type_id(2, 1, True, 0, True, _NAN_NONE), 0)


def weight_type(key: QuantKey) -> MarlinWeightType:
    """The kernel's type for a canonical weight key (ValueError naming what is accepted otherwise)."""
    if key.dtype is QuantDType.INT4:
        return UINT4 if key.zero_point is ZeroPoint.INTEGER else UINT4B8
    if key.dtype is QuantDType.INT8 and key.zero_point is ZeroPoint.NONE:
        return UINT8B128
    if key.dtype is QuantDType.FP8_E4M3:
        return FLOAT8_E4M3FN
    if key.dtype is QuantDType.FP4_E2M1:
        return FLOAT4_E2M1F
    raise ValueError(f"Marlin has no weight type for {key}: accepted are int4 (with or without integer zero "
                     "points), symmetric int8, fp8 e4m3 and MXFP4")


def _fp8_exponent_bias(dtype: torch.dtype) -> int:
    """Marlin turns fp8 codes into 16-bit floats by moving bits, leaving the exponent short by the
    difference of the biases (fp16 15 - 7 = 8, bf16 127 - 7 = 120); the scales carry it back."""
    return {torch.float16: 8, torch.bfloat16: 120}[dtype]


# ---- weights ----------------------------------------------------------------------------------


def _codes(weights: ExpertWeights, name: str) -> torch.Tensor:
    """Canonical weight `name` as integer codes [E, out, in] (4-bit unpacked; fp8 as its bit patterns)."""
    w = getattr(weights, name)
    if weights.key.dtype in (QuantDType.INT4, QuantDType.FP4_E2M1):
        return unpack_int4(w)
    if weights.key.dtype is QuantDType.FP8_E4M3:
        return w.view(torch.uint8)
    return w


def _grouped_scales(weights: ExpertWeights, name: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Scales as [E, groups along the input, rows] in `dtype` (fp8 with the exponent bias folded in)."""
    key, scale = weights.key, getattr(weights, f"{name}_scale")
    g = key.scale.granularity
    if key.dtype is QuantDType.FP4_E2M1:
        return scale.transpose(1, 2)  # e8m0 exponent codes, reordered as they are
    if g is Granularity.TENSOR:
        s = scale.float().view(-1, 1, 1).expand(-1, 1, rows)
    elif g is Granularity.CHANNEL:
        s = scale.float().unsqueeze(1)
    elif g is Granularity.GROUP:
        s = scale.float().transpose(1, 2)
    else:  # BLOCK: one scale per (block_rows x block_cols) becomes a group of block_cols along the input
        block_rows = key.scale.block_shape[0]
        s = scale.float().transpose(1, 2).repeat_interleave(block_rows, 2)[..., :rows]
    if key.dtype is QuantDType.FP8_E4M3:
        s = s * 2.0 ** _fp8_exponent_bias(dtype)
    return s.to(dtype)


@dataclass(frozen=True)
class MarlinProcessor:
    """Canonical weights -> Marlin tiles: per GEMM ("w13": n = R, k = K; "w2": n = K, k = N)
    `{name}` int32 [E, k/16, n*bits/2]; `{name}_scale` [E, groups, n] (layer dtype; MXFP4: e8m0);
    with zero points `{name}_zero` int32 [E, groups, n/8]; with act-order `{name}_g_idx` (sorted) and
    `{name}_perm` (the sort) int32 [E, k]; with biases `{name}_bias` [E, n] (layer dtype).

    Marlin sorts one GEMM's input channels once for all its rows, so act-order w13 whose gate and up
    halves are grouped apart (canonical g_idx [E, 2, K] with halves that differ) becomes two GEMMs,
    "w13_gate" and "w13_up" (n = N each), whose outputs are the two halves of GEMM1's rows."""

    layout: str = "marlin.tiles"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        N, K = config.intermediate_size_per_partition, config.hidden_size
        gemms: list[tuple[str, str, slice, torch.Tensor | None]] = []  # (packed name, canonical name, rows, g_idx)
        for name in ("w13", "w2"):
            g_idx = getattr(weights, f"{name}_g_idx") if weights.key.act_order else None
            if g_idx is not None and g_idx.dim() == 3 and not torch.equal(g_idx[:, 0], g_idx[:, 1]):
                gemms += [("w13_gate", name, slice(0, N), g_idx[:, 0]), ("w13_up", name, slice(N, 2 * N), g_idx[:, 1])]
            else:
                gemms.append((name, name, slice(None), g_idx[:, 0] if g_idx is not None and g_idx.dim() == 3
                              else g_idx))
        tensors: dict[str, torch.Tensor] = {}
        for packed_name, name, rows, g_idx in gemms:
            cols = K if name == "w13" else N
            tensors.update(_pack_gemm(weights, name, packed_name, rows, cols, g_idx, config.dtype, device))
        return PackedWeights(self.layout, tensors)


def _pack_gemm(weights: ExpertWeights, name: str, packed_name: str, rows: slice, cols: int,
               g_idx: torch.Tensor | None, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """The Marlin tensors of canonical weight `name`'s output rows `rows` as GEMM `packed_name`."""
    key = weights.key
    out: dict[str, torch.Tensor] = {}
    codes = _codes(weights, name)[:, rows].to(device)
    if g_idx is not None:
        g_idx = g_idx.to(device)
        order = torch.argsort(g_idx, dim=1, stable=True)
        codes = torch.gather(codes, 2, order.unsqueeze(1).expand_as(codes))
        out[f"{packed_name}_g_idx"] = torch.gather(g_idx, 1, order).to(torch.int32).contiguous()
        out[f"{packed_name}_perm"] = order.to(torch.int32).contiguous()
    out[packed_name] = marlin_repack(codes.transpose(1, 2), weight_type(key).bits)
    all_rows = getattr(weights, name).shape[1]
    scales = _grouped_scales(weights, name, all_rows, cols, dtype)[..., rows]
    scales = marlin_scales(scales.to(device))
    if key.dtype is QuantDType.FP4_E2M1:  # the fp4 dequantizer reads scale pairs swapped
        scales = _swap_scale_pairs(scales).view(torch.float8_e8m0fnu)
    out[f"{packed_name}_scale"] = scales
    if key.zero_point is ZeroPoint.INTEGER:
        zeros = getattr(weights, f"{name}_zero")[:, rows].to(device).transpose(1, 2)
        out[f"{packed_name}_zero"] = marlin_zero_points(zeros)
    if weights.has_bias:
        out[f"{packed_name}_bias"] = marlin_bias(getattr(weights, f"{name}_bias")[:, rows].to(device, dtype))
    return out


_PAIR_SWAP = torch.tensor([0, 2, 1, 3])


def _swap_scale_pairs(scales: torch.Tensor) -> torch.Tensor:
    shape = scales.shape
    return scales.reshape(*shape[:-1], -1, 4)[..., _PAIR_SWAP.to(scales.device)].reshape(shape).contiguous()


def _unswap_scale_pairs(scales: torch.Tensor) -> torch.Tensor:
    return _swap_scale_pairs(scales)  # the swap is its own inverse


# ---- routing into blocks ----------------------------------------------------------------------

BLOCK_SIZES_M = (8, 16, 32, 48, 64)


def block_size_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """Rows per block: the smallest that most experts fill (vLLM's rule: tokens*top_k/E/block < 0.9)."""
    for size in BLOCK_SIZES_M:
        if num_tokens * top_k / num_experts / size < 0.9:
            return size
    return BLOCK_SIZES_M[-1]


@dataclass(frozen=True, eq=False)
class MarlinBlocks:
    """The routed pairs in the kernel's block form (vLLM's moe_align_block_size output)."""

    sorted_ids: torch.Tensor  # int32 [capacity]: flat pair index (token * top_k + choice) per row; padding = M*top_k
    expert_ids: torch.Tensor  # int32 [capacity / block]: the local expert of each block
    num_tokens_post_padded: torch.Tensor  # int32 [1]: rows in use (a multiple of block)
    block: int  # rows per block


def align_blocks(topk_ids: torch.Tensor, block: int, num_local_experts: int,
                 expert_map: torch.Tensor | None) -> MarlinBlocks:
    """Sort the pairs by local expert, each expert's rows padded to whole blocks; pairs of experts that
    another rank owns are left out. Token order is kept within an expert. No host sync."""
    pairs = topk_ids.numel()
    ids = topk_ids.reshape(-1).long()
    if expert_map is not None:
        ids = expert_map.to(ids.device).long()[ids]
        ids = torch.where(ids < 0, num_local_experts, ids)
    counts = torch.zeros(num_local_experts + 1, dtype=torch.int64, device=ids.device)
    counts.index_add_(0, ids, torch.ones_like(ids))
    # other ranks' pairs (the last count) take no rows; padding, not an element write, keeps it capturable
    padded = torch.nn.functional.pad((counts[:-1] + block - 1) // block * block, (0, 1))
    padded_start = torch.cumsum(padded, 0) - padded
    order = torch.argsort(ids, stable=True)
    sorted_expert = ids[order]
    rank = torch.arange(pairs, device=ids.device) - (torch.cumsum(counts, 0) - counts)[sorted_expert]
    capacity = pairs + min(pairs, num_local_experts) * (block - 1)
    dest = torch.where(sorted_expert < num_local_experts, padded_start[sorted_expert] + rank, capacity)
    sorted_ids = torch.full((capacity + 1,), pairs, dtype=torch.int32, device=ids.device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_ends = torch.cumsum(padded[:num_local_experts], 0) // block
    blocks = torch.arange(math.ceil(capacity / block), device=ids.device)
    expert_ids = torch.searchsorted(block_ends, blocks, right=True).clamp(max=num_local_experts - 1)
    return MarlinBlocks(sorted_ids[:capacity], expert_ids.to(torch.int32),
                        padded.sum().reshape(1).to(torch.int32), block)


def library_align_blocks(topk_ids: torch.Tensor, block: int, num_local_experts: int) -> MarlinBlocks:
    """`align_blocks` (no expert map) by the Marlin library's own `moe_align_block_size` kernel: one
    launch instead of about twenty. Order within an expert is the kernel's; blocks past the rows in
    use are never read. CUDA only."""
    MARLIN_LIBRARY.load()
    pairs = topk_ids.numel()
    capacity = pairs + min(pairs, num_local_experts) * (block - 1)
    sorted_ids = torch.empty(capacity, dtype=torch.int32, device=topk_ids.device)
    expert_ids = torch.empty(math.ceil(capacity / block), dtype=torch.int32, device=topk_ids.device)
    used = torch.empty(1, dtype=torch.int32, device=topk_ids.device)
    torch.ops._moe_C.moe_align_block_size(topk_ids, num_local_experts, block, sorted_ids, expert_ids, used, None)
    return MarlinBlocks(sorted_ids, expert_ids, used, block)


# ---- the kernel and its twin ------------------------------------------------------------------


def _dequantize_tiles(packed: PackedWeights, name: str, wtype: MarlinWeightType, size_n: int) -> torch.Tensor:
    """fp32 [E, k, n] (k in the kernel's order: sorted by group under act-order) from Marlin's tensors."""
    codes = marlin_unpack(packed[name], wtype.bits, size_n)
    E, k, n = codes.shape
    scales = packed[f"{name}_scale"]
    if wtype is FLOAT4_E2M1F:
        exps = marlin_unscale(_unswap_scale_pairs(scales.view(torch.uint8)))
        s = torch.exp2(exps.float() - 127.0)
        values = E2M1_VALUES.to(codes.device)[codes]
    else:
        s = marlin_unscale(scales).float()
        if wtype is FLOAT8_E4M3FN:
            s = s / 2.0 ** _fp8_exponent_bias(scales.dtype)
            values = codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
        else:
            values = codes.float()
    g_idx = packed.get(f"{name}_g_idx")
    group_of_k = g_idx.long() if g_idx is not None else \
        (torch.arange(k, device=codes.device) // (k // s.shape[1])).expand(E, k)
    expand = torch.gather(s, 1, group_of_k.unsqueeze(-1).expand(E, k, n))
    zeros = packed.get(f"{name}_zero")
    if zeros is not None:
        values = values - torch.gather(marlin_zero_points_unpack(zeros).float(), 1,
                                       group_of_k.unsqueeze(-1).expand(E, k, n))
    else:
        values = values - wtype.code_offset
    return values * expand


def marlin_twin(x: torch.Tensor, packed: PackedWeights, name: str, wtype: MarlinWeightType, blocks: MarlinBlocks,
                topk_weights: torch.Tensor, top_k: int, mul_topk_weights: bool, size_n: int,
                out: torch.Tensor) -> torch.Tensor:
    """What one `moe_wna16_marlin_gemm` call computes, in fp32 torch, from the same tensors: for each
    block in use and each real row r of it, out[r] = x[r // top_k] @ W[expert] (+ bias), times the
    router weight of pair r when `mul_topk_weights`; rows no block names are left as they are."""
    weights = _dequantize_tiles(packed, name, wtype, size_n)
    perm = packed.get(f"{name}_perm")
    bias = packed.get(f"{name}_bias")
    used = int(blocks.num_tokens_post_padded.item())
    for b in range(used // blocks.block):
        rows = blocks.sorted_ids[b * blocks.block:(b + 1) * blocks.block].long()
        rows = rows[rows < x.shape[0] * top_k]  # padding rows name the pair count
        e = int(blocks.expert_ids[b])
        a = x[rows // top_k].float()
        if perm is not None:
            a = a[:, perm[e].long()]
        y = a @ weights[e]
        if bias is not None:
            y = y + marlin_unbias(bias[e:e + 1])[0].float()
        if mul_topk_weights:
            y = y * topk_weights.reshape(-1)[rows].float()[:, None]
        out[rows] = y.to(out.dtype)
    return out


# ---- the experts class ------------------------------------------------------------------------

_MARLIN_GROUPS = frozenset({32, 64, 128})


class MarlinExperts(Experts):
    """Weight-only quantized experts on Marlin's fused-MoE GEMM (vLLM 0.26.0's `_moe_C` library)."""

    backend = "marlin"
    router = "moe_cuda.dispatch:route"
    weight_processor = MarlinProcessor()
    capability = Capability(
        platforms=frozenset({Platform.CUDA}),
        schemes=(
            # GPTQ (symmetric, optionally act-order) and compressed-tensors int4/int8
            SchemeSupport(QuantDType.INT4, frozenset({Granularity.GROUP, Granularity.CHANNEL}),
                          group_sizes=_MARLIN_GROUPS, act_order=True),
            SchemeSupport(QuantDType.INT8, frozenset({Granularity.GROUP, Granularity.CHANNEL}),
                          group_sizes=_MARLIN_GROUPS, act_order=True),
            # AWQ: int4 with integer zero points per group
            SchemeSupport(QuantDType.INT4, frozenset({Granularity.GROUP}), group_sizes=_MARLIN_GROUPS,
                          zero_points=frozenset({ZeroPoint.INTEGER})),
            # fp8 weights with 16-bit activations (weight-only)
            SchemeSupport(QuantDType.FP8_E4M3, frozenset({Granularity.TENSOR, Granularity.CHANNEL,
                                                          Granularity.BLOCK}),
                          block_shapes=frozenset({(128, 128)})),
            SchemeSupport(QuantDType.FP4_E2M1, frozenset({Granularity.GROUP}), group_sizes=frozenset({32})),
        ),
        activations=ALL_ACTIVATIONS,
        dtypes=frozenset({torch.bfloat16, torch.float16}),
        min_capability=(8, 0),
        features=ROUTED_BY_CORE,
        hidden_multiple=128,  # the kernel's thread tiles: GEMM1 k = K % 128, GEMM2 n = K % 64
        intermediate_multiple=64,  # GEMM1 n = 2N % 128, GEMM2 k = N % 64
        validated_on=("cuda: NVIDIA H100 80GB HBM3", "cuda: NVIDIA H200"),
        limitations=(
            "weight-only: activations stay bf16/fp16 (fp8 W8A8 layers go elsewhere)",
            "run on Hopper only (sm90): Ampere and Ada (sm80/sm86/sm89), where Marlin matters most, are not "
            "validated on real hardware",
            "needs vLLM 0.26.0's prebuilt _moe_C library (MOE_CUDA_MARLIN_LIB or an installed vllm==0.26.0); "
            "on Hopper its sm_80 PTX is compiled on first use (about a minute, cached in CUDA_CACHE_PATH)",
            "hidden size a multiple of 128 and intermediate size of 64 (no padding; gpt-oss's 2880 is refused)",
            "int8 only symmetric; zero points only int4 with groups (AWQ); act-order without zero points",
            "act-order gate and up halves grouped apart run GEMM1 as two kernel calls (checked on CPU through "
            "the kernel's twin only; the single-grouping act-order path ran on the GPU)",
        ),
    )

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> None:
        super().__init__(config, quant, device)
        self.weight_type = weight_type(quant.weight)
        self._workspace: torch.Tensor | None = None  # the kernel's per-SM locks, allocated on first call

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> Support:
        spec = quant.weight.scale
        n = config.intermediate_size_per_partition
        # Each GEMM's input must hold whole groups (fp8 blocks become groups of their column count),
        # and fp8 block rows must not straddle gate and up rows.
        if spec.granularity is Granularity.GROUP:
            divisors = {"group size": spec.group_size}
        elif spec.granularity is Granularity.BLOCK:
            divisors = {"block columns": spec.block_shape[1], "block rows": spec.block_shape[0]}
        else:
            divisors = {}
        for what, d in divisors.items():
            for dim, size in (("hidden size", config.hidden_size), ("intermediate size", n)):
                if size % d:
                    return Support.no(f"{what} {d} does not divide the {dim} {size}")
        return MARLIN_LIBRARY.availability()

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
              ) -> torch.Tensor:
        packed = self._packed()
        cfg = self.config
        M, K = hidden_states.shape
        top_k = topk_ids.shape[1]
        block = block_size_m(M, top_k, cfg.num_local_experts)
        if hidden_states.is_cuda and self.expert_map is None:
            blocks = library_align_blocks(topk_ids, block, cfg.num_local_experts)
        else:
            blocks = align_blocks(topk_ids, block, cfg.num_local_experts, self.expert_map)
        topk_weights = topk_weights.float().contiguous()
        x = hidden_states.contiguous()
        on_input = cfg.routing.weight_on_input
        if on_input:  # top_k is 1: scale each token's input by its one weight
            x = (x.float() * topk_weights).to(x.dtype)
        if "w13_gate" in packed.tensors:  # act-order halves grouped apart: GEMM1 as two GEMMs
            n = cfg.intermediate_size_per_partition
            h = torch.cat([self._gemm(x, packed, half, blocks, topk_weights, top_k, False, n,
                                      torch.empty(M * top_k, n, dtype=x.dtype, device=x.device))
                           for half in ("w13_gate", "w13_up")], dim=1)
        else:
            h = self._gemm(x, packed, "w13", blocks, topk_weights, top_k, False, cfg.w13_rows,
                           torch.empty(M * top_k, cfg.w13_rows, dtype=x.dtype, device=x.device))
        a = activate(h, cfg)
        # GEMM2 writes every pair's row but those of pairs another rank owns: zeros keep them out of the sum
        rows = torch.zeros if self.expert_map is not None else torch.empty
        y = self._gemm(a, packed, "w2", blocks, topk_weights, 1, not on_input, K,
                       rows(M * top_k, K, dtype=x.dtype, device=x.device))
        if y.is_cuda:
            return topk_sum(y, top_k, x.dtype)
        return y.view(M, top_k, K).sum(1, dtype=torch.float32).to(x.dtype)  # its twin: fp32 sum, no fp32 copy of y

    def _gemm(self, x: torch.Tensor, packed: PackedWeights, name: str, blocks: MarlinBlocks,
              topk_weights: torch.Tensor, top_k: int, mul_topk_weights: bool, size_n: int,
              out: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":  # no kernel on the CPU: the tests run the twin on the same arguments
            return marlin_twin(x, packed, name, self.weight_type, blocks, topk_weights, top_k, mul_topk_weights,
                               size_n, out)
        MARLIN_LIBRARY.load()
        announce_first_compile(torch.cuda.get_device_capability(x.device))
        if self._workspace is None or self._workspace.device != x.device:
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            self._workspace = torch.zeros(sms * 4, dtype=torch.int32, device=x.device)
        return torch.ops._moe_C.moe_wna16_marlin_gemm(
            x, out, packed[name], packed.get(f"{name}_bias"), packed[f"{name}_scale"],
            None, None,  # a_scales, global_scale: 16-bit activations, no NVFP4 global scale
            packed.get(f"{name}_zero"), packed.get(f"{name}_g_idx"), packed.get(f"{name}_perm"),
            self._workspace, blocks.sorted_ids, blocks.expert_ids, blocks.num_tokens_post_padded,
            topk_weights, blocks.block, top_k, mul_topk_weights, self.weight_type.type_id,
            x.shape[0], size_n, x.shape[1],
            True,  # is_k_full: each layer holds its whole input dimension and its own g_idx
            False,  # use_atomic_add
            True,  # use_fp32_reduce
            False,  # is_zp_float: zero points are integer codes
            -1, -1, -1,  # thread_k, thread_n, blocks_per_sm: the kernel's heuristics
        )

