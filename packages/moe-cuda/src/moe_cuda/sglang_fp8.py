"""fp8 128x128-block experts on SGLang's CUTLASS grouped GEMM (`fp8_blockwise_scaled_grouped_mm`,
sglang-kernel 0.4.6's sm90 library): DeepSeek-V3-style fp8 weights, activations quantized on the
fly in 1x128 groups (moe-triton's row pass, `dispatch.row_pass`: its kernel on CUDA, its torch twin
elsewhere), one grouped call per GEMM over the expert-sorted rows (`moe_cuda.dispatch`). GEMM1's input is
quantized per token before the gather, its codes and scales then gathered for each pair, as SGLang's
own flow does: the top-k-fold larger gathered rows are never quantized. GEMM2's input is activated
and quantized in one pass.

The operator's arguments, as SGLang's `cutlass_fused_experts_fp8` passes them: a [P, k] fp8 rows
sorted by expert; b the canonical weights [E, n, k] seen as [E, k, n] (a transposed view: the kernel
reads B column-major); scales_a fp32 [P, k/128] row-major; scales_b the canonical block scales
[E, n/128, k/128] seen as [E, k/128, n/128]; stride_a = stride_b = k and stride_c = n per expert
(int64 [E]); problem_sizes int32 [E, 3] = (rows of expert e, n, k); expert_offsets int32 [E] = the
first row of each expert; a_ptrs, b_ptrs, out_ptrs, a_scales_ptrs, b_scales_ptrs int64 [E] and
layout_sfa, layout_sfb int32 [E, 5] are filled by the operator; workspace is CUTLASS scratch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, MoEConfig
from moe_core.experts import Capability, SchemeSupport, Support
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType
from moe_core.weights import PackedWeights
from moe_cuda.dispatch import ExpertPermutation, row_pass
from moe_cuda.grouped_mm import ALL_ACTIVATIONS, ROUTED_BY_CORE, GroupedMmProcessor, _GroupedExperts
from moe_cuda.vendor import SGLANG_SM90_LIBRARY
from moe_triton.act_quant import QMode

__all__ = ["BLOCK", "BlockwiseGemmArgs", "SglangFp8BlockExperts", "blockwise_gemm_args", "blockwise_grouped_mm_twin"]

BLOCK = 128
WORKSPACE_BYTES = 8 << 20  # CUTLASS scratch: SGLang's benchmark allocates ~7 MiB for 256 experts


@dataclass(frozen=True, eq=False)
class BlockwiseGemmArgs:
    """Everything `fp8_blockwise_scaled_grouped_mm` reads besides a, b and their scales."""

    stride_a: torch.Tensor  # int64 [E]: k (row stride of a)
    stride_b: torch.Tensor  # int64 [E]: k (column stride of the column-major b)
    stride_c: torch.Tensor  # int64 [E]: n (row stride of the output)
    problem_sizes: torch.Tensor  # int32 [E, 3]: (rows of expert e, n, k)
    expert_offsets: torch.Tensor  # int32 [E]: first row of expert e
    pointers: tuple[torch.Tensor, ...]  # int64 [E] x 5: a, b, out, a_scales, b_scales (the operator fills them)
    layouts: tuple[torch.Tensor, torch.Tensor]  # int32 [E, 5] x 2: scale-factor layouts (filled by it)


def blockwise_gemm_args(counts: torch.Tensor, starts: torch.Tensor, n: int, k: int) -> BlockwiseGemmArgs:
    """The operator's bookkeeping tensors for experts with `counts` rows starting at `starts` (int32 [E])."""
    E, dev = counts.numel(), counts.device
    sizes = torch.stack((counts, torch.full_like(counts, n), torch.full_like(counts, k)), dim=1)
    return BlockwiseGemmArgs(
        stride_a=torch.full((E,), k, dtype=torch.int64, device=dev),
        stride_b=torch.full((E,), k, dtype=torch.int64, device=dev),
        stride_c=torch.full((E,), n, dtype=torch.int64, device=dev),
        problem_sizes=sizes.to(torch.int32).contiguous(),
        expert_offsets=starts.to(torch.int32, copy=True),
        pointers=tuple(torch.empty(E, dtype=torch.int64, device=dev) for _ in range(5)),
        layouts=(torch.empty(E, 5, dtype=torch.int32, device=dev), torch.empty(E, 5, dtype=torch.int32, device=dev)),
    )


def blockwise_grouped_mm_twin(a: torch.Tensor, b: torch.Tensor, scales_a: torch.Tensor, scales_b: torch.Tensor,
                              args: BlockwiseGemmArgs, out: torch.Tensor) -> torch.Tensor:
    """What the operator writes into `out`, in fp32 torch, from the same tensors (b [E, k, n] and
    scales_b [E, k/128, n/128] as passed); rows outside every expert's range are left as they are."""
    P, k = a.shape
    a32 = (a.float().view(P, k // BLOCK, BLOCK) * scales_a[..., None]).view(P, k)
    b32 = b.float() * scales_b.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)[:, :k, :b.shape[2]]
    for e in range(b.shape[0]):
        start, rows = int(args.expert_offsets[e]), int(args.problem_sizes[e, 0])
        out[start:start + rows] = (a32[start:start + rows] @ b32[e]).to(out.dtype)
    return out


class SglangFp8BlockExperts(_GroupedExperts):
    """fp8 W8A8 with 128x128 weight blocks and 1x128 dynamic activation groups (DeepSeek-V3)."""

    backend = "sglang_fp8_block"
    weight_processor = GroupedMmProcessor("cuda.sglang.fp8_block128")
    capability = Capability(
        platforms=frozenset({Platform.CUDA}),
        schemes=(SchemeSupport(QuantDType.FP8_E4M3, frozenset({Granularity.BLOCK}),
                               block_shapes=frozenset({(BLOCK, BLOCK)}), activation=QuantDType.FP8_E4M3),),
        activations=ALL_ACTIVATIONS,
        dtypes=frozenset({torch.bfloat16, torch.float16}),
        min_capability=(9, 0),
        max_capability=(9, 0),
        features=ROUTED_BY_CORE,
        hidden_multiple=BLOCK,
        intermediate_multiple=BLOCK,
        validated_on=("cuda: NVIDIA H100 80GB HBM3", "cuda: NVIDIA H200"),
        limitations=(
            "sm90 only (the library's sm90 build); needs sglang-kernel 0.4.6's common_ops library "
            "(MOE_CUDA_SGLANG_LIB or an installed sglang-kernel==0.4.6)",
            "the sorted rows' gathers and index steps run as torch ops around the two grouped GEMMs",
        ),
    )

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> None:
        super().__init__(config, quant, device)
        self._workspace: torch.Tensor | None = None  # CUTLASS scratch, allocated on first call
        # Per GEMM, the operator's bookkeeping tensors, allocated on the first GPU call: strides and the
        # (n, k) columns of the problem sizes never change; each call writes the row counts and the
        # operator fills the pointers and layouts (the two GEMMs of a call run one after the other).
        self._gemm_args: dict[str, BlockwiseGemmArgs] = {}

    @classmethod
    def supports_extra(cls, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> Support:
        if quant.activation.scale.group_size != BLOCK:
            return Support.no(f"activation groups of {quant.activation.scale.group_size} (supported: {BLOCK})")
        return SGLANG_SM90_LIBRARY.availability()

    def _bookkeeping(self, name: str, perm: ExpertPermutation, n: int, k: int) -> BlockwiseGemmArgs:
        """GEMM `name`'s cached bookkeeping holding this call's row counts. Made outside inference mode:
        a layer first called under torch.inference_mode() updates it in place outside it too."""
        args = self._gemm_args.get(name)
        if args is None:
            with torch.inference_mode(False):
                args = self._gemm_args[name] = blockwise_gemm_args(perm.counts, perm.starts, n, k)
        else:
            args.problem_sizes[:, 0].copy_(perm.counts)
            args.expert_offsets.copy_(perm.starts)
        return args

    @staticmethod
    def _quantize(x: torch.Tensor, activation: Activation | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x's rows (after `activation`) in 1x128 dynamic fp8 groups: (codes, fp32 scales [rows, n/128])."""
        return row_pass(x, activation, QMode.GROUP128, torch.float8_e4m3fn)

    def _gemm1(self, hidden_states: torch.Tensor, packed: PackedWeights, perm: ExpertPermutation) -> torch.Tensor:
        """Each token quantized once, before the gather (a row's codes and scales do not depend on the
        other rows, so gathering them equals quantizing the gathered rows), as SGLang's flow does; a model
        that weighs the input (Llama4) has a row per pair to quantize."""
        if self.config.routing.weight_on_input:
            return super()._gemm1(hidden_states, packed, perm)
        codes, scales = self._quantize(hidden_states)
        codes = codes.view(torch.uint8)[perm.token].view(torch.float8_e4m3fn)  # index kernels take no fp8
        y = self._blockwise(codes, scales[perm.token], packed, "w13", perm, hidden_states.dtype)
        return self._with_bias(y, packed, "w13", perm)

    def _gemm2(self, h: torch.Tensor, packed: PackedWeights, perm: ExpertPermutation) -> torch.Tensor:
        """The activation and its 1x128 fp8 quantization in one pass (`act_quant`; elsewhere its twin): the
        activated rows go to fp8 from fp32, never written in 16 bits in between."""
        codes, scales = self._quantize(h, self.config.activation)
        return self._with_bias(self._blockwise(codes, scales, packed, "w2", perm, h.dtype), packed, "w2", perm)

    def _grouped(self, x, packed: PackedWeights, name, perm):
        return self._blockwise(*self._quantize(x), packed, name, perm, x.dtype)

    def _blockwise(self, codes: torch.Tensor, scales_a: torch.Tensor, packed: PackedWeights, name: str,
                   perm: ExpertPermutation, out_dtype: torch.dtype) -> torch.Tensor:
        """The grouped GEMM of fp8 rows (1x128 group scales) against weight `name`'s 128x128 blocks."""
        w, w_scale = packed[name], packed[f"{name}_scale"]
        n, k = w.shape[1], w.shape[2]
        out = torch.empty(codes.shape[0], n, dtype=out_dtype, device=codes.device)
        b, scales_b = w.transpose(1, 2), w_scale.transpose(1, 2)
        if codes.device.type == "cpu":  # no kernel on the CPU: the tests run the twin on the same arguments
            return blockwise_grouped_mm_twin(codes, b, scales_a, scales_b,
                                             blockwise_gemm_args(perm.counts, perm.starts, n, k), out)
        SGLANG_SM90_LIBRARY.load()
        if self._workspace is None or self._workspace.device != codes.device:
            self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=codes.device)
            self._gemm_args.clear()
        args = self._bookkeeping(name, perm, n, k)
        torch.ops.sgl_kernel.fp8_blockwise_scaled_grouped_mm(
            out, *args.pointers, codes, b, scales_a, scales_b, args.stride_a, args.stride_b, args.stride_c,
            *args.layouts, args.problem_sizes, args.expert_offsets, self._workspace)
        return out
