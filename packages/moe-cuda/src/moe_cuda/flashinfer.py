"""FlashInfer's fused-MoE kernels (flashinfer-python 0.7.2.post1): their weight layouts and capability
records. NOT validated on real hardware: their device tests have not passed on a GPU here. The CUTLASS
class ran on an H100 in `moe bench` only (FlashInfer's sm_90 module built from source, narrowed to
the kernels called here; its default tactics, before the tuning pass below was added), its outputs
matching torch's grouped GEMM and moe-triton's; the TRT-LLM kernels run on sm100/sm103 only. The
converters are written from FlashInfer's API and checked on the CPU against their definitions and,
through torch twins that read the converted tensors, against moe-core's reference.

- `flashinfer_cutlass` (`cutlass_fused_moe`, sm90+): GEMM1 weights with the up rows first, then the
  gate rows ("w31"), as TRT-LLM's SwiGLU reads them; fp8 128x128 block scales reordered alike.
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
from moe_cuda.grouped_mm import ROUTED_BY_CORE
from moe_cuda.sglang_fp8 import BLOCK, quantize_groups_fp8

__all__ = [
    "FlashInferCutlassExperts",
    "FlashInferCutlassProcessor",
    "FlashInferTrtllmBf16Experts",
    "FlashInferTrtllmBf16Processor",
    "block_major_k",
    "from_block_major_k",
    "swap_gate_up",
    "trtllm_gemm1_rows",
    "trtllm_gemm2_rows",
]

# FlashInfer's default: the token buckets its tuner profiles run up to this many tokens.
TUNE_MAX_TOKENS = 8192
_NOT_VALIDATED = ("NOT validated on real hardware: written from FlashInfer 0.7.2.post1's API; its layouts are "
                  "checked on the CPU; its device tests have not passed on a GPU here")


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
    codes, scale = quantize_groups_fp8(a)
    return (codes.float().view(a.shape[0], -1, BLOCK) * scale[..., None]).view_as(a)


# FlashInfer's sm_90 fused-MoE module, as measured (benchmarks/results/flashinfer_sm90_jit_2026-11-27.md).
SM90_MODULE = "fused_moe_90"
SM90_BUILD_COST = ("248 CUDA files, about 8.6 CPU-hours; MAX_JOBS sets the parallel compiles, each up to 8 GB. "
                   "The 44 that moe-cuda calls took 7-8 minutes on a 64-CPU host")


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
          "moe-cuda calls (44 files).", file=sys.stderr, flush=True)


class FlashInferCutlassExperts(Experts):
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
        limitations=(
            _NOT_VALIDATED,
            f"FlashInfer has no prebuilt sm_90 MoE: the first call JIT-compiles its CUTLASS module ({SM90_BUILD_COST}); "
            "install flashinfer-python==0.7.2.post1",
            "SiLU gated only; no biases, no expert parallelism through this class (FlashInfer's own ep_size/ep_rank "
            "are not wired)",
            f"the first eager call on a GPU tunes FlashInfer's GEMM tactics for the layer's shape (token buckets up to "
            f"{TUNE_MAX_TOKENS}); a CUDA graph captured before any eager call runs FlashInfer's default tactics, which "
            "were 2.3-4.1x slower than torch's grouped GEMM in bf16 on an H100. The tuning pass has not run here",
        ),
    )

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> None:
        super().__init__(config, quant, device)
        self._tuned = False  # FlashInfer's tactics chosen for this layer's shape (first eager GPU call)

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> Support:
        if quant.weight.quantized and config.dtype != torch.bfloat16:
            # The binding makes a runner for bf16 x fp8 only (CutlassMoeFCRunner<__nv_bfloat16, __nv_fp8_e4m3>).
            return Support.no(f"fp8 128x128 blocks with {config.dtype} activations (supported: torch.bfloat16)")
        return Support.yes()

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
              ) -> torch.Tensor:
        packed = self._packed()
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
        if not self._tuned and not torch.cuda.is_current_stream_capturing():
            # Untuned, FlashInfer runs its default GEMM tactics (in bf16 on an H100, 2.3-4.1x slower
            # than torch's grouped GEMM). One tuning pass covers every token bucket up to
            # TUNE_MAX_TOKENS for this layer shape; later calls, CUDA graph captures included, read
            # FlashInfer's cache.
            from flashinfer.autotuner import autotune

            with autotune(True):
                out = call()
            self._tuned = True
        else:
            out = call()
        return out[0] if isinstance(out, list | tuple) else out


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
