"""The bf16 / fp16 / fp32 expert GEMMs: launchers and their torch twins.

`grouped_gemm` runs one GEMM over align-sorted rows (`moe_triton.align`) on the tl.dot kernel
(`gemm_details._kernel`) or, for a `TileConfig.wgmma` tile, on the Gluon wgmma kernels
(`gemm_details._wgmma`, Hopper only); `grouped_gemm_torch` is its twin over the same sorted ids.
`direct_gemm` runs one direct (decode) kernel over topk_ids (`gemm_details._direct`);
`direct_gemm_torch` is its twin. A config may mix them per GEMM: both write the intermediate in
choice order (row t*top_k + s).
"""

from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from moe_core.config import Activation
from moe_triton._common.activation import ActKind, act_kind
from moe_triton._common.intmath import cdiv, next_power_of_2
from moe_triton._common.pdl import dependent_options
from moe_triton._common.target import interpreting, wgmma_capable
from moe_triton.configs import TileConfig
from moe_triton.gemm_details._direct import moe_gemv1_kernel, moe_gemv2_kernel
from moe_triton.gemm_details._kernel import moe_gemm_kernel

__all__ = ["direct_gemm", "direct_gemm_torch", "grouped_gemm", "grouped_gemm_torch"]


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
             topk_weights: torch.Tensor, sorted_ids: torch.Tensor, expert_ids: torch.Tensor, total: torch.Tensor,
             *, top_k: int, block_m: int, tile: TileConfig, activation: Activation | None,
             mul_weight: bool, zero_foreign: bool) -> None:
    """out[id] = epilogue(a[id // a_row_div] @ w[expert].T) for every valid sorted id.

    activation None: GEMM2 (rows of `a` are choices, N = w.shape[1]); else GEMM1 (rows of `a` are
    tokens, gated activations read w rows [0, N) as gate and [N, 2N) as up). A `tile.wgmma` runs
    on the Gluon kernel (`gemm_details._wgmma`, Hopper only; `tile.persistent`: its persistent form),
    any other on the tl.dot kernel (`gemm_details._kernel`).
    """
    gated = activation is not None and activation.gated
    N = w.shape[1] // 2 if gated else w.shape[1]
    K = w.shape[2]
    num_valid = topk_weights.numel()
    # A row can only appear in one block, so at most num_valid blocks hold work.
    EM = min(sorted_ids.numel(), num_valid * block_m)
    if tile.wgmma:
        _grouped_gemm_wgmma(a, w, bias, out, topk_weights, sorted_ids, expert_ids, total, N=N, K=K, EM=EM,
                        top_k=top_k, block_m=block_m, tile=tile, activation=activation, mul_weight=mul_weight,
                        zero_foreign=zero_foreign)
        return
    grid = (cdiv(EM, block_m) * cdiv(N, tile.block_n),)
    if tile.tma:
        if not w.is_contiguous():
            raise ValueError("tma tiles need contiguous weights (viewed as [E * out, in])")
        b_desc = TensorDescriptor.from_tensor(w.view(-1, K), [tile.block_n, tile.block_k])
    else:
        b_desc = w  # never read without B_TMA
    moe_gemm_kernel[grid](
        a, w, b_desc, bias if bias is not None else w, out, topk_weights, sorted_ids, expert_ids, total,
        N, K, EM, num_valid,
        a.stride(0), w.stride(0), w.stride(1), w.stride(2), bias.stride(0) if bias is not None else 0, out.stride(0),
        float(activation.alpha or 0.0) if activation else 0.0, float(activation.limit or 0.0) if activation else 0.0,
        A_ROW_DIV=top_k if activation is not None else 1, GATED=gated,
        ACT=int(act_kind(activation)) if activation is not None else int(ActKind.NONE),
        HAS_BIAS=bias is not None, MUL_WEIGHT=mul_weight, ZERO_FOREIGN=zero_foreign,
        EVEN_K=K % tile.block_k == 0, B_TMA=tile.tma, UPCAST=interpreting(),
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
        NARROW=tile.narrow, **dependent_options(a.device), num_warps=tile.num_warps, num_stages=tile.num_stages,
    )


def _grouped_gemm_wgmma(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                    topk_weights: torch.Tensor, sorted_ids: torch.Tensor, expert_ids: torch.Tensor,
                    total: torch.Tensor, *, N: int, K: int, EM: int, top_k: int, block_m: int, tile: TileConfig,
                    activation: Activation | None, mul_weight: bool, zero_foreign: bool) -> None:
    """`grouped_gemm` on the Gluon wgmma kernel (`gemm_details._wgmma`); a clear error for what it does not take."""
    gated = activation is not None and activation.gated
    rows = 2 * tile.block_n if gated else tile.block_n  # weight rows per program
    wants = []
    if not wgmma_capable(a.device):
        wants.append(f"an NVIDIA Hopper GPU (sm_90), got {a.device}")
    if a.dtype not in (torch.bfloat16, torch.float16) or w.dtype != a.dtype or out.dtype != a.dtype:
        wants.append(f"bf16 or fp16 activations, weights and output of one dtype, got {a.dtype}, {w.dtype}, {out.dtype}")
    if rows not in (128, 256) or block_m not in (64, 128):
        wants.append(f"128 or 256 weight rows per program (block_n, gated twice that) and blocks of 64 or 128 "
                     f"rows, got {rows} rows and block_m={block_m}")
    # cp.async and the copy engine move 16-byte pieces of the activation and weight rows.
    if not w.is_contiguous() or a.stride(1) != 1 or out.stride(1) != 1 or K % 8 or a.stride(0) % 8:
        wants.append(f"contiguous weights and unit-stride rows that split into 16-byte pieces (K and the "
                     f"activation row stride multiples of 8), got K={K}, activation strides {a.stride()}, weight "
                     f"strides {w.stride()}")
    if wants:
        raise ValueError("the wgmma GEMM (TileConfig.wgmma) needs " + "; ".join(wants))
    # Gluon is imported only when a configuration asks for this kernel.
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    from moe_triton.gemm_details import _wgmma as gemm_wgmma

    block_k = gemm_wgmma.BLOCK_K.value
    copy_rows = rows // 4 if gated else rows // 2  # one copy: a warpgroup's gate (or up) rows, or all its rows
    layout = gl.NVMMASharedLayout.get_default_for([copy_rows, block_k], gl.bfloat16 if a.dtype == torch.bfloat16
                                                  else gl.float16)
    w_desc = GluonDescriptor.from_tensor(w.view(-1, K), [copy_rows, block_k], layout)
    tiles = cdiv(EM, block_m) * cdiv(N, rows // 2 if gated else rows)
    alpha = float(activation.alpha or 0.0) if activation else 0.0
    limit = float(activation.limit or 0.0) if activation else 0.0
    strides = (a.stride(0), bias.stride(0) if bias is not None else 0, out.stride(0))
    common = dict(A_ROW_DIV=top_k if activation is not None else 1, GATED=gated,
                  ACT=int(act_kind(activation)) if activation is not None else int(ActKind.NONE),
                  HAS_BIAS=bias is not None, MUL_WEIGHT=mul_weight, ZERO_FOREIGN=zero_foreign, BLOCK_M=block_m,
                  BLOCK_N=rows, GROUP_M=tile.group_m, STAGES=tile.num_stages, K_TAIL=K % block_k != 0, num_warps=4)
    if tile.persistent:
        # One program per SM at most; each loops over the tiles the alignment's total holds.
        grid = (min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count),)
        gemm_wgmma.moe_gemm_wgmma_persistent_kernel[grid](
            a, w_desc, bias if bias is not None else w, out, topk_weights, sorted_ids, expert_ids, total,
            torch.zeros(1, dtype=torch.int32, device=a.device),
            N, K, topk_weights.numel(), alpha, limit, *strides, **common,
            TAIL=tile.tail, CONSUMER_REGS=gemm_wgmma.PERSISTENT_REGS, LOADER_REGS=gemm_wgmma.LOADER_REGS,
            maxnreg=gemm_wgmma.PERSISTENT_MAXNREG)
        return
    gemm_wgmma.moe_gemm_wgmma_kernel[(tiles,)](
        a, w_desc, bias if bias is not None else w, out, topk_weights, sorted_ids, expert_ids, total,
        N, K, EM, topk_weights.numel(), alpha, limit, *strides, **common,
        CONSUMER_REGS=gemm_wgmma.REGS, maxnreg=gemm_wgmma.REGS)


def grouped_gemm_torch(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                   topk_weights: torch.Tensor, sorted_ids: torch.Tensor, expert_ids: torch.Tensor,
                   total: torch.Tensor, *, top_k: int, block_m: int, activation: Activation | None,
                   mul_weight: bool, zero_foreign: bool) -> None:
    """The twin of `grouped_gemm`, block by block in fp32."""
    from moe_core.reference import apply_activation

    num_valid = topk_weights.numel()
    flat_w = topk_weights.flatten().float()
    for b in range(int(total.item()) // block_m):
        ids = sorted_ids[b * block_m:(b + 1) * block_m].long()
        ids = ids[ids < num_valid]
        if ids.numel() == 0:
            continue
        e = int(expert_ids[b])
        if e == -1:
            if zero_foreign:
                out[ids] = 0
            continue
        rows = ids // top_k if activation is not None else ids
        h = a[rows].float() @ w[e].float().T
        if activation is not None:
            if mul_weight:
                h = h * flat_w[ids, None]
            if bias is not None:
                h = h + bias[e].float()
            h = apply_activation(h, activation)
        else:
            if bias is not None:
                h = h + bias[e].float()
            if mul_weight:
                h = h * flat_w[ids, None]
        out[ids] = h.to(out.dtype)


def direct_gemm(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
             topk_weights: torch.Tensor, topk_ids: torch.Tensor, expert_map: torch.Tensor | None, *,
             tile: TileConfig, activation: Activation | None, mul_weight: bool) -> None:
    """activation given (GEMM1): out[c] = act(a[c // top_k] @ w[e_c].T) for every choice c of a local expert.
    activation None (GEMM2): out[t] = sum over t's local choices c of epilogue(a[c] @ w[e_c].T).
    """
    if a.stride(1) != 1 or w.stride(2) != 1:
        raise ValueError("direct_gemm needs a contiguous inner dimension in a and w")
    M, top_k = topk_ids.shape
    gated = activation is not None and activation.gated
    N = w.shape[1] // 2 if gated else w.shape[1]
    K = w.shape[2]
    common = dict(HAS_BIAS=bias is not None, MUL_WEIGHT=mul_weight, HAS_MAP=expert_map is not None,
                  EVEN_K=K % tile.block_k == 0, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
                  num_warps=tile.num_warps, num_stages=tile.num_stages, **dependent_options(a.device))
    args = (a, w, bias if bias is not None else w, out, topk_weights, topk_ids,
            expert_map if expert_map is not None else topk_ids, N, K, a.stride(0), w.stride(0), w.stride(1),
            bias.stride(0) if bias is not None else 0, out.stride(0))
    if activation is not None:
        moe_gemv1_kernel[(cdiv(N, tile.block_n), M * top_k)](
            *args, float(activation.alpha or 0.0), float(activation.limit or 0.0), TOP_K=top_k, GATED=gated,
            ACT=int(act_kind(activation)), **common)
    else:
        moe_gemv2_kernel[(cdiv(N, tile.block_n), M)](
            *args, TOP_K=top_k, K_P2=next_power_of_2(top_k), **common)


def direct_gemm_torch(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor, expert_map: torch.Tensor | None, *,
                   activation: Activation | None, mul_weight: bool) -> None:
    """The twin of `direct_gemm`, choice by choice in fp32."""
    from moe_core.reference import apply_activation

    M, top_k = topk_ids.shape
    if activation is None:
        acc = torch.zeros(M, w.shape[1], dtype=torch.float32, device=a.device)
    for c in range(M * top_k):
        t, s = divmod(c, top_k)
        e = int(topk_ids[t, s])
        if expert_map is not None:
            e = int(expert_map[e])
        if e < 0:
            continue
        rw = float(topk_weights[t, s])
        h = a[t if activation is not None else c].float() @ w[e].float().T
        if activation is not None:
            if mul_weight:
                h = h * rw
            if bias is not None:
                h = h + bias[e].float()
            out[c] = apply_activation(h, activation).to(out.dtype)
        else:
            if bias is not None:
                h = h + bias[e].float()
            acc[t] += h * rw if mul_weight else h
    if activation is None:
        out.copy_(acc)
