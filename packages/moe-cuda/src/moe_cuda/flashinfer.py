"""FlashInfer's fused-MoE kernels (flashinfer-python 0.7.2.post1): their weight layouts and capability
records. The bf16/fp8 CUTLASS class is validated on an H100 (its device tests passed there, with
FlashInfer's sm_90 module built from source, narrowed to the kernels called here); the MXFP4 class has
never run (its module did not finish building inside the device calls) and the TRT-LLM kernels run on
sm100/sm103 only: both are NOT validated on real hardware. The converters are written from
FlashInfer's API and checked on the CPU against their definitions and, through torch twins that read
the converted tensors, against moe-core's reference.

- `flashinfer_cutlass` (`cutlass_fused_moe`, sm90+): GEMM1 weights with the up rows first, then the
  gate rows ("w31"), as TRT-LLM's SwiGLU reads them; fp8 128x128 block scales reordered alike.
  Its MXFP4 x bf16 mode (`FlashInferCutlassMxfp4Experts`, sm90 only) takes the same row order, the e2m1
  bytes in the sm90 mixed-input GEMM's interleave and the e8m0 scales folded in 64x128 blocks.
- `flashinfer_trtllm` (`trtllm_bf16_routed_moe`, sm100/sm103): bf16 weights in "BlockMajorK": rows
  permuted for the gated epilogue (up and gate rows alternating) and shuffled in 32-row blocks for
  the transposed MMA output, then cut into 128-byte column blocks, block-major.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import ActivationKind, MoEConfig
from moe_core.experts import UNQUANTIZED, Capability, Experts, SchemeSupport, Support
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType
from moe_core.reference import apply_activation
from moe_core.weights import ExpertWeights, PackedWeights
from moe_core.weights.packing import E2M1_VALUES, unpack_int4
from moe_cuda.grouped_mm import ROUTED_BY_CORE
from moe_cuda.sglang_fp8 import BLOCK
from moe_triton.act_quant import QMode, act_quant_torch

__all__ = [
    "FlashInferCutlassExperts",
    "FlashInferCutlassMxfp4Experts",
    "FlashInferCutlassMxfp4Processor",
    "FlashInferCutlassProcessor",
    "FlashInferTrtllmBf16Experts",
    "FlashInferTrtllmBf16Processor",
    "block_major_k",
    "deinterleave_fp4_for_sm90",
    "flashinfer_cutlass_mxfp4_twin",
    "fold_scales_for_sm90",
    "from_block_major_k",
    "interleave_fp4_for_sm90",
    "swap_gate_up",
    "trtllm_gemm1_rows",
    "trtllm_gemm2_rows",
    "unfold_scales_for_sm90",
    "weight_on_input",
]

# FlashInfer's default: the token buckets its tuner profiles run up to this many tokens.
TUNE_MAX_TOKENS = 8192
_NOT_VALIDATED = ("NOT validated on real hardware: written from FlashInfer 0.7.2.post1's API; its layouts are "
                  "checked on the CPU; its device tests have not passed on a GPU here")


def weight_on_input(config: MoEConfig, hidden_states: torch.Tensor, topk_weights: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's kernels multiply each expert's output by its router weight. Llama4 (top-1) weights
    the input instead: scale the input and give the kernel weights of one."""
    if not config.routing.weight_on_input:
        return hidden_states, topk_weights
    return (hidden_states.float() * topk_weights).to(hidden_states.dtype), torch.ones_like(topk_weights)


def swap_gate_up(t: torch.Tensor) -> torch.Tensor:
    """[E, 2N, ...] gate rows then up rows -> up rows then gate rows (its own inverse)."""
    gate, up = t.chunk(2, dim=1)
    return torch.cat((up, gate), dim=1).contiguous()


# ---- flashinfer_cutlass -----------------------------------------------------------------------


@dataclass(frozen=True)
class FlashInferCutlassProcessor:
    """`w31` [E, 2N, K] (up rows, then gate rows) and `w2` [E, K, N] in the layer dtype or fp8; fp8
    block scales `w31_scale` [E, 2N/128, K/128] (reordered as the rows) and `w2_scale`, fp32."""

    layout: str = "flashinfer.cutlass.w31"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        tensors = {"w31": swap_gate_up(weights.w13.to(device)), "w2": weights.w2.to(device).contiguous()}
        if weights.key.quantized:
            tensors["w31_scale"] = swap_gate_up(weights.w13_scale.to(device, torch.float32))
            tensors["w2_scale"] = weights.w2_scale.to(device, torch.float32).contiguous()
        return PackedWeights(self.layout, tensors)


def _dequantize_blocks(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows, cols = w.shape[1], w.shape[2]
    return w.float() * scale.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)[:, :rows, :cols]


def flashinfer_cutlass_twin(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                            packed: PackedWeights) -> torch.Tensor:
    """What `cutlass_fused_moe` computes with SwiGLU from the converted tensors, in fp32 torch: per
    choice silu(gate) * up of GEMM1 (rows [up | gate]), GEMM2, times the router weight, summed;
    fp8 block weights with the input and GEMM2's input quantized per 1x128 group."""
    w31, w2 = packed["w31"], packed["w2"]
    fp8 = "w31_scale" in packed.tensors
    if fp8:
        w31, w2 = _dequantize_blocks(w31, packed["w31_scale"]), _dequantize_blocks(w2, packed["w2_scale"])
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w31.shape[0]):
        token, slot = (topk_ids == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        a = x[token].float()
        if fp8:
            a = _fake_quantize_groups(a)
        up, gate = (a @ w31[e].float().T).chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
        if fp8:
            h = _fake_quantize_groups(h)
        out.index_add_(0, token, (h @ w2[e].float().T) * topk_weights[token, slot, None].float())
    return out.to(x.dtype)


def _fake_quantize_groups(a: torch.Tensor) -> torch.Tensor:
    codes, scale = act_quant_torch(a, None, QMode.GROUP128, torch.float8_e4m3fn, a.shape[0])
    return (codes.float().view(a.shape[0], -1, BLOCK) * scale[..., None]).view_as(a)


# FlashInfer's sm_90 fused-MoE module and what building it costs (measured: benchmarks/results/README.md lists the record).
SM90_MODULE = "fused_moe_90"
SM90_BUILD_COST = "248 CUDA files, about 8.6 CPU-hours; MAX_JOBS sets the parallel compiles, each up to 8 GB"


@functools.cache
def announce_sm90_build() -> None:
    """Before a first call that compiles FlashInfer's sm_90 module, say once per process what that
    costs and where it is kept, and turn on ninja's [n/N] progress lines (FLASHINFER_JIT_VERBOSE)."""
    from flashinfer.jit import env as jit_env

    jit_dir = jit_env.FLASHINFER_JIT_DIR
    if jit_env.get_aot_artifacts(SM90_MODULE) or (jit_dir / SM90_MODULE / f"{SM90_MODULE}.so").exists():
        return
    if "FLASHINFER_JIT_VERBOSE" not in os.environ:
        # FlashInfer reads VERBOSE=1 as a debug build (-O0 --device-debug) unless DEBUG says otherwise.
        os.environ.update(FLASHINFER_JIT_VERBOSE="1", FLASHINFER_JIT_DEBUG=os.environ.get("FLASHINFER_JIT_DEBUG", "0"))
    print(f"moe-cuda: FlashInfer compiles its sm_90 CUTLASS fused-MoE module on this first call: {SM90_BUILD_COST}; "
          f"later processes load it from {jit_dir}. benchmarks/gpu/flashinfer_sm90.py builds only the kernels "
          "one moe-cuda class calls (--variant).", file=sys.stderr, flush=True)


class _TunedOnFirstEagerCall(Experts):
    """`cutlass_fused_moe` callers: the first eager GPU call runs FlashInfer's tuning pass."""

    router = "moe_cuda.dispatch:route"

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> None:
        super().__init__(config, quant, device)
        self._tuned = False  # FlashInfer's tactics chosen for this layer's shape (first eager GPU call)

    def _call_tuned_once(self, call: functools.partial) -> torch.Tensor:
        if not self._tuned and not torch.cuda.is_current_stream_capturing():
            # Untuned, FlashInfer runs its default GEMM tactics, whatever the shape and GPU (on an H100
            # the tuned ones were within 2% of them at the presets' shapes). One tuning pass covers every
            # token bucket up to TUNE_MAX_TOKENS for this layer shape; later calls, CUDA graph captures
            # included, read FlashInfer's cache.
            from flashinfer.autotuner import autotune

            with autotune(True):
                out = call()
            self._tuned = True
        else:
            out = call()
        return out[0] if isinstance(out, list | tuple) else out


class FlashInferCutlassExperts(_TunedOnFirstEagerCall):
    """FlashInfer's CUTLASS fused MoE: bf16/fp16, or fp8 128x128 blocks (input quantized by the kernel)."""

    backend = "flashinfer_cutlass"
    weight_processor = FlashInferCutlassProcessor()
    capability = Capability(
        platforms=frozenset({Platform.CUDA}),
        schemes=(UNQUANTIZED,
                 SchemeSupport(QuantDType.FP8_E4M3, frozenset({Granularity.BLOCK}),
                               block_shapes=frozenset({(BLOCK, BLOCK)}), activation=QuantDType.FP8_E4M3)),
        activations=frozenset({ActivationKind.SILU}),
        dtypes=frozenset({torch.bfloat16, torch.float16}),
        min_capability=(9, 0),
        features=ROUTED_BY_CORE,
        bias=False,
        expert_parallel=False,
        hidden_multiple=BLOCK,
        intermediate_multiple=BLOCK,
        requires=("flashinfer",),
        validated_on=("cuda: NVIDIA H100 80GB HBM3", "cuda: NVIDIA H200"),
        limitations=(
            f"FlashInfer has no prebuilt sm_90 MoE: the first call JIT-compiles its CUTLASS module ({SM90_BUILD_COST}); "
            "the 44 files this class calls took 7-8 minutes on a 64-CPU host "
            "(benchmarks/gpu/flashinfer_sm90.py --variant bf16-fp8). Install flashinfer-python==0.7.2.post1",
            "SiLU gated only; no biases, no expert parallelism through this class (FlashInfer's own ep_size/ep_rank "
            "are not wired)",
            f"the first eager call on a GPU tunes FlashInfer's GEMM tactics for the layer's shape (token buckets up to "
            f"{TUNE_MAX_TOKENS}); a CUDA graph captured before any eager call runs FlashInfer's default tactics",
            "on an H100, tuned: bf16 3.9-6.0x slower than moe-triton and 1.3-4.5x slower than torch's grouped GEMM; "
            "fp8 blocks 1.06-1.42x faster than moe-triton in mixtral-8x7b at 128-8192 tokens, slower elsewhere",
        ),
    )

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> Support:
        if quant.weight.quantized and config.dtype != torch.bfloat16:
            # The binding makes a runner for bf16 x fp8 only (CutlassMoeFCRunner<__nv_bfloat16, __nv_fp8_e4m3>).
            return Support.no(f"fp8 128x128 blocks with {config.dtype} activations (supported: torch.bfloat16)")
        return Support.yes()

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
              ) -> torch.Tensor:
        packed = self._packed()
        hidden_states, topk_weights = weight_on_input(self.config, hidden_states, topk_weights)
        if hidden_states.device.type == "cpu":  # no kernel on the CPU: the tests run the twin
            return flashinfer_cutlass_twin(hidden_states, topk_weights, topk_ids, packed)
        from flashinfer.fused_moe import cutlass_fused_moe

        if self.device.capability == (9, 0):
            announce_sm90_build()
        fp8 = "w31_scale" in packed.tensors
        call = functools.partial(
            cutlass_fused_moe, input=hidden_states, token_selected_experts=topk_ids.to(torch.int32),
            token_final_scales=topk_weights.float(), fc1_expert_weights=packed["w31"],
            fc2_expert_weights=packed["w2"], output_dtype=hidden_states.dtype,
            quant_scales=[packed["w31_scale"], packed["w2_scale"]] if fp8 else [],
            use_deepseek_fp8_block_scale=fp8, tune_max_num_tokens=TUNE_MAX_TOKENS)
        return self._call_tuned_once(call)


# ---- flashinfer_cutlass, MXFP4 x bf16 (W4A16, sm90) -------------------------------------------

# FlashInfer's W4A16 group (INT4GroupwiseParams::wfp4a16_group_size); the scale fold works in blocks of
# 64 rows x 128 inputs (four groups), the weight interleave in blocks of 16 rows x 64 inputs.
MXFP4_GROUP = 32
_FOLD_ROWS, _FOLD_INPUTS = 64, 128
_INTERLEAVE_ROWS, _INTERLEAVE_INPUTS = 16, 64

# The interleave kernel's bit moves within each 32-bit word of four gathered bytes, in its order:
# (mask, shift), a positive shift to the left. They split sign from exponent-mantissa for the LUT convert.
_FP4_WORD_MOVES = (
    (0x00000080, 24), (0x00000070, 18), (0x00000008, 12), (0x00000007, 6),
    (0x00008000, 13), (0x00007000, 7), (0x00000800, 1), (0x00000700, -5),
    (0x00800000, 2), (0x00700000, -4), (0x00080000, -10), (0x00070000, -16),
    (0x80000000, -1), (0x10000000, 1), (0x60000000, -3), (0x08000000, -13),
    (0x01000000, -11), (0x06000000, -15),
)
# The same moves read backwards, written out by hand: bit i of a kernel word came from bit _WORD_SOURCE_BIT[i].
_WORD_SOURCE_BIT = (16, 17, 18, 8, 9, 10, 0, 1, 2, 19, 25, 26, 11, 24, 27, 3,
                    20, 21, 22, 12, 13, 14, 4, 5, 6, 23, 29, 30, 15, 28, 31, 7)


def _check_interleave_shape(n: int, k: int) -> None:
    if n % _INTERLEAVE_ROWS or k % _INTERLEAVE_INPUTS:
        raise ValueError(f"the sm90 mixed-GEMM interleave needs rows % {_INTERLEAVE_ROWS} and inputs % "
                         f"{_INTERLEAVE_INPUTS}, got {n} rows of {k} inputs")


def interleave_fp4_for_sm90(weight: torch.Tensor) -> torch.Tensor:
    """Torch port of FlashInfer's `interleave_fp4_weights_for_sm90_mixed_gemm_kernel`: uint8 [E, n, k/2]
    (two e2m1 codes a byte) -> the same shape in the sm90 mixed-input GEMM's layout.

    Each (row pair, 64-input partition, lane) of the kernel gathers bytes (r, c), (r + 8, c), (r, c + 4)
    and (r + 8, c + 4) into one word, moves its bits by `_FP4_WORD_MOVES` and stores the word's four
    bytes at one destination row and column; the index names are the kernel's."""
    E, n, half_k = weight.shape
    _check_interleave_shape(n, half_k * 2)
    dev = weight.device
    block_id = torch.arange(n // 2, device=dev).view(-1, 1, 1)
    partition_id = torch.arange(half_k * 2 // _INTERLEAVE_INPUTS, device=dev).view(1, -1, 1)
    lane_id = torch.arange(16, device=dev).view(1, 1, -1)
    row_id = block_id // 8 * 16 + block_id % 8
    mma_id = lane_id // 4
    dst_row_id = row_id + (mma_id % 2) * 8
    interleaved_lane_id = lane_id // 8 * 16 + (lane_id % 4) * 4
    col_id = partition_id * 32 + mma_id * 8 + lane_id % 4
    dst_col_id = partition_id * 32 + interleaved_lane_id
    first = row_id * half_k + col_id
    second = (row_id + 8) * half_k + col_id
    sources = torch.stack((first, second, first + 4, second + 4), dim=-1).reshape(-1)
    flat = weight.reshape(E, -1)
    raw = flat[:, sources].to(torch.int64).view(E, -1, 4)
    word = raw[..., 0] | raw[..., 1] << 8 | raw[..., 2] << 16 | raw[..., 3] << 24
    moved = torch.zeros_like(word)
    for mask, shift in _FP4_WORD_MOVES:
        bits = word & mask
        moved |= bits << shift if shift >= 0 else bits >> -shift
    word_bytes = torch.stack([(moved >> (8 * j)) & 0xFF for j in range(4)], dim=-1).to(torch.uint8)
    dst = ((dst_row_id * half_k + dst_col_id).reshape(-1, 1) + torch.arange(4, device=dev)).reshape(-1)
    out = torch.empty_like(flat)
    out[:, dst] = word_bytes.view(E, -1)
    return out.view(E, n, half_k)


def deinterleave_fp4_for_sm90(weight: torch.Tensor) -> torch.Tensor:
    """Inverse of `interleave_fp4_for_sm90`, from the kernel's formulas read backwards.

    Destination row g*16 + h*8 + i, byte p*32 + hi*16 + l*4 + w holds byte w of the word that lane
    (mma = 2*hi + h, l) gathered: source row g*16 + (w % 2)*8 + i, byte p*32 + mma*8 + (w // 2)*4 + l."""
    E, n, half_k = weight.shape
    _check_interleave_shape(n, half_k * 2)
    # dims: E, g, h, i, p, hi, l, w
    stored = weight.to(torch.int64).view(E, n // 16, 2, 8, half_k // 32, 2, 4, 4)
    word = stored[..., 0] | stored[..., 1] << 8 | stored[..., 2] << 16 | stored[..., 3] << 24
    raw = torch.zeros_like(word)
    for bit, source_bit in enumerate(_WORD_SOURCE_BIT):
        raw |= ((word >> bit) & 1) << source_bit
    # the word's bytes w = 2*half + pair: dims E, g, h, i, p, hi, l, half, pair
    byte = torch.stack([(raw >> (8 * j)) & 0xFF for j in range(4)], dim=-1).view(*raw.shape, 2, 2)
    # source order: E, g, pair (row + 8), i, p, hi, h (mma = 2*hi + h), half (byte + 4), l
    return byte.permute(0, 1, 8, 3, 4, 5, 2, 7, 6).reshape(E, n, half_k).to(torch.uint8)


def _check_fold_shape(rows: int, groups: int) -> None:
    per_block = _FOLD_INPUTS // MXFP4_GROUP
    if rows % _FOLD_ROWS or groups % per_block:
        raise ValueError(f"the sm90 scale fold needs rows % {_FOLD_ROWS} and inputs % {_FOLD_INPUTS}, got "
                         f"{rows} rows of {groups * MXFP4_GROUP} inputs")


def fold_scales_for_sm90(scales: torch.Tensor) -> torch.Tensor:
    """Torch port of FlashInfer's `interleave_moe_scales_for_sm90_mixed_gemm` for e8m0 bytes, group 32:
    uint8 [E, rows, K/32] -> [E, rows/64, K/128, 16, 16]: per 64x128 block of the weight, row i of
    its 16x16 bytes holds the four groups of rows i, i + 16, i + 32 and i + 48."""
    E, rows, groups = scales.shape
    _check_fold_shape(rows, groups)
    k128 = groups // 4
    return (scales.reshape(E, rows // 64, 4, 16, k128, 4).permute(0, 1, 4, 3, 2, 5)
            .reshape(E, rows // 64, k128, 16, 16).contiguous())


def unfold_scales_for_sm90(folded: torch.Tensor) -> torch.Tensor:
    """Inverse of `fold_scales_for_sm90` by its index formula: scale (r, c) sits at
    [r // 64, c // 4, r % 16, (r % 64) // 16 * 4 + c % 4]."""
    _, row_blocks, k128, _, _ = folded.shape
    r = torch.arange(row_blocks * 64, device=folded.device).view(-1, 1)
    c = torch.arange(k128 * 4, device=folded.device).view(1, -1)
    return folded[:, r // 64, c // 4, r % 16, (r % 64) // 16 * 4 + c % 4]


def _sm90_mxfp4_converters(device: torch.device):
    """(weight interleave, scale fold): FlashInfer's own on a GPU, the torch ports elsewhere."""
    if device.type != "cuda":
        return interleave_fp4_for_sm90, fold_scales_for_sm90
    from flashinfer.fused_moe import (
        interleave_moe_scales_for_sm90_mixed_gemm,
        interleave_moe_weights_for_sm90_mixed_gemm,
    )

    if torch.cuda.get_device_capability(device) == (9, 0):
        announce_sm90_build()  # the weight interleave is an op of FlashInfer's sm_90 fused-MoE module
    return (functools.partial(interleave_moe_weights_for_sm90_mixed_gemm, quant_type="fp4"),
            functools.partial(interleave_moe_scales_for_sm90_mixed_gemm, group_size=MXFP4_GROUP))


def _swiglu_oai_params(config: MoEConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """TRT-LLM's SwigluBias per expert: min(gate, limit) * sigmoid(alpha * min(gate, limit))
    * (clamp(up, -limit, limit) + beta); gpt-oss's "+ 1" is beta = 1."""
    act, E = config.activation, config.num_local_experts
    return {name: torch.full((E,), value, dtype=torch.float32, device=device)
            for name, value in (("swiglu_alpha", act.alpha), ("swiglu_beta", 1.0), ("swiglu_limit", act.limit))}


@dataclass(frozen=True)
class FlashInferCutlassMxfp4Processor:
    """`w31` uint8 [E, 2N, K/2] (up rows, then gate rows) and `w2` [E, K, N/2]: e2m1 code pairs in the
    sm90 interleave; `w31_scale` uint8 e8m0 [E, 2N/64, K/128, 16, 16] and `w2_scale` [E, K/64, N/128,
    16, 16], folded; with biases `w31_bias` [E, 2N] (up, gate) and `w2_bias` [E, K] in the layer dtype;
    for swiglu_oai fp32 [E] `swiglu_alpha`, `swiglu_beta` and `swiglu_limit`."""

    layout: str = "flashinfer.cutlass.mxfp4_sm90_interleaved"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        interleave, fold = _sm90_mxfp4_converters(device)
        tensors = {
            "w31": interleave(swap_gate_up(weights.w13.to(device))),
            "w2": interleave(weights.w2.to(device).contiguous()),
            "w31_scale": fold(swap_gate_up(weights.w13_scale.to(device))),
            "w2_scale": fold(weights.w2_scale.to(device).contiguous()),
        }
        if weights.has_bias:  # the binding wants both biases, in the output dtype
            tensors["w31_bias"] = swap_gate_up(weights.w13_bias.to(device, config.dtype))
            tensors["w2_bias"] = weights.w2_bias.to(device, config.dtype).contiguous()
        if config.activation.kind is ActivationKind.SWIGLU_OAI:
            tensors.update(_swiglu_oai_params(config, device))
        return PackedWeights(self.layout, tensors)


def _dequantize_sm90_mxfp4(codes: torch.Tensor, folded_scales: torch.Tensor) -> torch.Tensor:
    """fp32 [E, n, k]: the converted tensors decoded, e2m1 x 2^(e8m0 - 127)."""
    values = E2M1_VALUES.to(codes.device)[unpack_int4(deinterleave_fp4_for_sm90(codes)).long()]
    scales = torch.exp2(unfold_scales_for_sm90(folded_scales).float() - 127.0)
    return values * scales.repeat_interleave(MXFP4_GROUP, dim=-1)


def _gated(gate: torch.Tensor, up: torch.Tensor, packed: PackedWeights, e: int) -> torch.Tensor:
    """TRT-LLM's gated epilogue: SwigluBiasAdaptor when the per-expert parameters are given, else
    GLUAdaptor<SiLu>."""
    if "swiglu_alpha" not in packed.tensors:
        return torch.nn.functional.silu(gate) * up
    alpha, beta, limit = (float(packed[name][e]) for name in ("swiglu_alpha", "swiglu_beta", "swiglu_limit"))
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + beta)


def flashinfer_cutlass_mxfp4_twin(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                                  packed: PackedWeights) -> torch.Tensor:
    """What `cutlass_fused_moe` computes in W4A16 from the converted tensors, in fp32 torch: the layout
    undone (`deinterleave_fp4_for_sm90`, `unfold_scales_for_sm90`); per choice GEMM1 + bias (rows
    [up | gate]), the gated epilogue, GEMM2 + bias, times the router weight, summed."""
    b31, b2 = packed.get("w31_bias"), packed.get("w2_bias")
    out = torch.zeros(x.shape[0], packed["w2"].shape[1], dtype=torch.float32, device=x.device)
    for e in range(packed["w31"].shape[0]):
        token, slot = (topk_ids == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        w31 = _dequantize_sm90_mxfp4(packed["w31"][e:e + 1], packed["w31_scale"][e:e + 1])[0]
        w2 = _dequantize_sm90_mxfp4(packed["w2"][e:e + 1], packed["w2_scale"][e:e + 1])[0]
        h = x[token].float() @ w31.T
        if b31 is not None:
            h = h + b31[e].float()
        up, gate = h.chunk(2, dim=-1)
        y = _gated(gate, up, packed, e) @ w2.T
        if b2 is not None:
            y = y + b2[e].float()
        out.index_add_(0, token, y * topk_weights[token, slot, None].float())
    return out.to(x.dtype)


class FlashInferCutlassMxfp4Experts(_TunedOnFirstEagerCall):
    """FlashInfer's CUTLASS fused MoE with MXFP4 weights and bf16 activations (W4A16), sm90."""

    backend = "flashinfer_cutlass"
    weight_processor = FlashInferCutlassMxfp4Processor()
    capability = Capability(
        platforms=frozenset({Platform.CUDA}),
        schemes=(SchemeSupport(QuantDType.FP4_E2M1, frozenset({Granularity.GROUP}),
                               group_sizes=frozenset({MXFP4_GROUP})),),
        activations=frozenset({ActivationKind.SILU, ActivationKind.SWIGLU_OAI}),
        dtypes=frozenset({torch.bfloat16}),  # the binding refuses fp16 for the interleaved layout
        min_capability=(9, 0),
        max_capability=(9, 0),  # the interleaved layout is for the sm90 mixed-input GEMM only
        features=ROUTED_BY_CORE,
        bias=True,
        expert_parallel=False,
        hidden_multiple=_FOLD_INPUTS,  # GEMM1's scale fold (K % 128); the interleave needs K % 64
        intermediate_multiple=_FOLD_INPUTS,  # GEMM2's scale fold (N % 128); the interleave needs N % 64
        requires=("flashinfer",),
        limitations=(
            _NOT_VALIDATED,
            "sm90 (Hopper) only: FlashInfer's MXFP4 x bf16 path is the sm90 mixed-input grouped GEMM reading its "
            f"interleaved weight layout. No prebuilt sm_90 MoE: the first call JIT-compiles the module "
            f"({SM90_BUILD_COST}); the 38 files this class calls did not finish in about 19 minutes on a 64-CPU "
            "host (three of its CUTLASS mixed-input files compile for over 8 minutes each). "
            "Install flashinfer-python==0.7.2.post1",
            "bf16 activations only: FlashInfer refuses fp16 for this layout",
            "hidden and intermediate sizes multiples of 128: the e8m0 scales fold in blocks of 64 rows x 128 inputs "
            "(the byte interleave alone needs rows % 16 and inputs % 64); no padding, so gpt-oss's 2880 is refused",
            "SiLU (unclamped) or swiglu_oai gated only (swiglu_oai through TRT-LLM's SwigluBias with alpha, "
            "beta = 1 and limit per expert); no expert parallelism through this class",
            f"the first eager call on a GPU tunes FlashInfer's GEMM tactics for the layer's shape (token buckets up to "
            f"{TUNE_MAX_TOKENS}); a CUDA graph captured before any eager call runs FlashInfer's default tactics",
        ),
    )

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
              ) -> torch.Tensor:
        packed = self._packed()
        hidden_states, topk_weights = weight_on_input(self.config, hidden_states, topk_weights)
        if hidden_states.device.type == "cpu":  # no kernel on the CPU: the tests run the twin
            return flashinfer_cutlass_mxfp4_twin(hidden_states, topk_weights, topk_ids, packed)
        from flashinfer.fused_moe import cutlass_fused_moe

        announce_sm90_build()
        call = functools.partial(
            cutlass_fused_moe, input=hidden_states, token_selected_experts=topk_ids.to(torch.int32),
            token_final_scales=topk_weights.float(), fc1_expert_weights=packed["w31"],
            fc2_expert_weights=packed["w2"], output_dtype=hidden_states.dtype,
            # the scale bytes as int32 words, as FlashInfer's own W4A16 runner passes them
            quant_scales=[packed["w31_scale"].view(torch.int32), packed["w2_scale"].view(torch.int32)],
            fc1_expert_biases=packed.get("w31_bias"), fc2_expert_biases=packed.get("w2_bias"),
            swiglu_alpha=packed.get("swiglu_alpha"), swiglu_beta=packed.get("swiglu_beta"),
            swiglu_limit=packed.get("swiglu_limit"),
            use_w4_group_scaling=True,  # with bf16 input and uint8 weights: the W4A16 MXFP4 runner
            tune_max_num_tokens=TUNE_MAX_TOKENS)
        return self._call_tuned_once(call)


# ---- flashinfer_trtllm ------------------------------------------------------------------------

# TRT-LLM's row map inside each block of 32 rows (epilogue tile 128): row i goes to position _BLOCK32[i].
_BLOCK32 = tuple(8 * (i % 4) + i // 4 for i in range(32))
_BLOCK_BYTES = 128


@functools.cache
def trtllm_gemm1_rows(rows: int) -> torch.Tensor:
    """int64 [2N]: the canonical w13 row (gate rows, then up rows) each kernel row of GEMM1 holds.

    Up and gate rows alternate (up 0, gate 0, up 1, gate 1, ...: the gated epilogue reads a pair from
    one tile), then every block of 32 rows is shuffled by `_BLOCK32` for the transposed MMA output."""
    n = rows // 2
    alternating = torch.arange(rows)
    alternating = torch.where(alternating % 2 == 0, n + alternating // 2, alternating // 2)
    return alternating[_shuffle_sources(rows)]


@functools.cache
def trtllm_gemm2_rows(rows: int) -> torch.Tensor:
    """int64 [K]: the canonical w2 row each kernel row of GEMM2 holds (the 32-row shuffle only)."""
    return _shuffle_sources(rows)


def _shuffle_sources(rows: int) -> torch.Tensor:
    if rows % 32:
        raise ValueError(f"the TRT-LLM row shuffle needs rows in whole blocks of 32, got {rows}")
    old = torch.arange(rows)
    new = old // 32 * 32 + torch.tensor(_BLOCK32)[old % 32]
    sources = torch.empty_like(old)
    sources[new] = old
    return sources


def block_major_k(t: torch.Tensor) -> torch.Tensor:
    """[E, rows, cols] -> [E, cols/b, rows, b] with b = 128 bytes of columns (64 bf16): block-major."""
    E, rows, cols = t.shape
    per_block = _BLOCK_BYTES // t.element_size()
    if cols % per_block:
        raise ValueError(f"BlockMajorK needs the input dimension {cols} in whole blocks of {per_block}")
    return t.reshape(E, rows, cols // per_block, per_block).permute(0, 2, 1, 3).contiguous()


def from_block_major_k(t: torch.Tensor) -> torch.Tensor:
    """Inverse of `block_major_k`."""
    E, blocks, rows, per_block = t.shape
    return t.permute(0, 2, 1, 3).reshape(E, rows, blocks * per_block)


@dataclass(frozen=True)
class FlashInferTrtllmBf16Processor:
    """`gemm1` bf16 [E, K/64, 2N, 64] (rows `trtllm_gemm1_rows`), `gemm2` [E, N/64, K, 64] (rows
    `trtllm_gemm2_rows`), both BlockMajorK in 128-byte blocks."""

    layout: str = "flashinfer.trtllm.bf16_block_major_k"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        w13, w2 = weights.w13.to(device), weights.w2.to(device)
        rows13, rows2 = trtllm_gemm1_rows(w13.shape[1]).to(device), trtllm_gemm2_rows(w2.shape[1]).to(device)
        return PackedWeights(self.layout, {"gemm1": block_major_k(w13[:, rows13]),
                                           "gemm2": block_major_k(w2[:, rows2])})


def flashinfer_trtllm_twin(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                           packed: PackedWeights, config: MoEConfig) -> torch.Tensor:
    """The TRT-LLM kernel's result from the converted tensors, in fp32 torch (layout undone, SwiGLU)."""
    gemm1, gemm2 = from_block_major_k(packed["gemm1"]), from_block_major_k(packed["gemm2"])
    w13, w2 = torch.empty_like(gemm1), torch.empty_like(gemm2)
    w13[:, trtllm_gemm1_rows(gemm1.shape[1]).to(x.device)] = gemm1
    w2[:, trtllm_gemm2_rows(gemm2.shape[1]).to(x.device)] = gemm2
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        token, slot = (topk_ids == e).nonzero(as_tuple=True)
        if token.numel():
            h = apply_activation(x[token].float() @ w13[e].float().T, config.activation)
            out.index_add_(0, token, (h @ w2[e].float().T) * topk_weights[token, slot, None].float())
    return out.to(x.dtype)


class FlashInferTrtllmBf16Experts(Experts):
    """FlashInfer's TRT-LLM-gen bf16 fused MoE with routing done by the layer (`trtllm_bf16_routed_moe`)."""

    backend = "flashinfer_trtllm"
    router = "moe_cuda.dispatch:route"
    weight_processor = FlashInferTrtllmBf16Processor()
    capability = Capability(
        platforms=frozenset({Platform.CUDA}),
        schemes=(UNQUANTIZED,),
        activations=frozenset({ActivationKind.SILU}),
        dtypes=frozenset({torch.bfloat16}),
        min_capability=(10, 0),
        max_capability=(10, 3),
        features=ROUTED_BY_CORE,
        bias=False,
        expert_parallel=False,
        hidden_multiple=BLOCK,
        intermediate_multiple=BLOCK,  # the kernel's tiles (vLLM pads N to 128; this class refuses instead)
        requires=("flashinfer",),
        limitations=(
            _NOT_VALIDATED,
            "sm100/sm103 (Blackwell datacenter) only; needs flashinfer-python==0.7.2.post1 and its matching "
            "flashinfer-cubin",
            "bf16 SiLU gated only; no biases, no expert parallelism through this class",
        ),
    )

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
              ) -> torch.Tensor:
        packed = self._packed()
        hidden_states, topk_weights = weight_on_input(self.config, hidden_states, topk_weights)
        cfg = self.config
        if hidden_states.device.type == "cpu":  # no kernel on the CPU: the tests run the twin
            return flashinfer_trtllm_twin(hidden_states, topk_weights, topk_ids, packed, cfg)
        from flashinfer.fused_moe import trtllm_bf16_routed_moe

        out = trtllm_bf16_routed_moe(
            (topk_ids.to(torch.int32), topk_weights.float()), hidden_states, packed["gemm1"], packed["gemm2"],
            num_experts=cfg.num_experts, top_k=cfg.top_k, n_group=None, topk_group=None,
            intermediate_size=cfg.intermediate_size_per_partition, local_expert_offset=0,
            local_num_experts=cfg.num_local_experts)
        return out[0] if isinstance(out, list | tuple) else out
