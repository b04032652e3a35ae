"""Row kernel between the quantized GEMMs: the expert activation, and dynamic fp8 quantization.

`act_quant` reads GEMM1's output [pairs, R] (or the layer input for GEMM1's own fp8 operand),
applies the activation in fp32 and writes either 16-bit values or fp8 codes with their scales.
fp8 scales follow `moe_core.reference.fake_quantize_activation` exactly: per row (token), per
(row, 128 columns) (group), or per tensor, where the reference's tensor is the rows one expert
sees, so per-tensor takes two passes (an amax per expert, then the quantization).
"""

from __future__ import annotations

import enum

import torch
import triton
import triton.language as tl

from moe_core.config import Activation
from moe_core.reference import apply_activation
from moe_triton._common.activation import ActKind, act_kind, activate
from moe_triton._common.intmath import next_power_of_2
from moe_triton._common.pdl import dependent_options, wait_then_release
from moe_triton._common.target import interpreting
from moe_triton.quant_gemm_details._layouts import GateUpInterleave

__all__ = ["FP8_MAX", "QMode", "act_quant", "act_quant_torch", "fp8_groups"]

FP8_MAX = 448.0
_FP8_MAX = tl.constexpr(FP8_MAX)  # the kernels' copy: jit code reads only constexpr globals


class QMode(enum.IntEnum):
    NONE = 0  # 16-bit output
    TOKEN = 1
    GROUP128 = 2
    TENSOR = 3  # per expert's rows (two passes)


@triton.jit
def _to_fp8(q, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    if INTERPRET:
        # The CPU interpreter's fp32 -> e4m3 cast loses the carry when rounding up to the next
        # power of two; round to 3 mantissa bits here (subnormal spacing 2**-9, ties to even as the
        # GPU's cast and torch's) so its cast is exact.
        step = tl.exp2(tl.maximum(tl.floor(tl.log2(tl.abs(q))), -6.0) - 3.0)
        units = tl.abs(q) / step
        r = tl.floor(units + 0.5)
        odd = r - 2.0 * tl.floor(r * 0.5) == 1.0
        r = tl.where((r - units == 0.5) & odd, r - 1.0, r) * step
        q = tl.where(q < 0, -r, r)
    return q.to(dtype, fp_downcast_rounding="rtne")


@triton.jit
def fp8_groups(y, DT: tl.constexpr, INTERPRET: tl.constexpr):
    """[G, 128] fp32 values -> (e4m3 codes in DT [G, 128], fp32 scales [G]): one scale per 128-wide
    group, as `moe_core.reference.fake_quantize_activation` computes them."""
    s = tl.maximum(tl.max(tl.abs(y), axis=1), 1e-12) / _FP8_MAX
    q = tl.clamp(tl.math.div_rn(y, tl.zeros_like(y) + s[:, None]), -_FP8_MAX, _FP8_MAX)
    return _to_fp8(q, DT, INTERPRET), s


@triton.jit
def _act_quant_kernel(h_ptr, y_ptr, s_ptr, amax_ptr, pexp_ptr, N, N_OUT, stride_h, stride_y, stride_s, in_div,
                      alpha, limit, ACT: tl.constexpr, QMODE: tl.constexpr, PHASE: tl.constexpr,
                      GATE_UP_CHUNK: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr,
                      PDL: tl.constexpr):
    # A dependent launch: it reads what the kernel ahead (GEMM1, or the routing) writes.
    wait_then_release(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    out_mask = offs < N_OUT  # columns N..N_OUT: zeros (the padding of a GEMM's K)
    src = h_ptr + (row // in_div).to(tl.int64) * stride_h
    GATED: tl.constexpr = ACT == 1 or ACT == 2 or ACT == 3 or ACT == 4
    if GATED and GATE_UP_CHUNK > 0:
        # Rows interleaved by the processor: chunk c of the gate, then chunk c of up.
        gate_offs = (offs // GATE_UP_CHUNK) * (2 * GATE_UP_CHUNK) + offs % GATE_UP_CHUNK
        up_offs = gate_offs + GATE_UP_CHUNK
    else:
        gate_offs = offs
        up_offs = offs + N
    x = tl.load(src + gate_offs, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        up = tl.load(src + up_offs, mask=mask, other=0.0).to(tl.float32)
    else:
        up = x
    y = activate(x, up, alpha, limit, ACT)
    y = tl.where(mask, y, 0.0)
    dst = y_ptr + row.to(tl.int64) * stride_y + offs
    if QMODE == 0:
        tl.store(dst, y.to(y_ptr.dtype.element_ty), mask=out_mask)
    elif QMODE == 1:
        s = tl.maximum(tl.max(tl.abs(y), axis=0), 1e-12) / _FP8_MAX
        q = tl.clamp(tl.math.div_rn(y, tl.zeros_like(y) + s), -_FP8_MAX, _FP8_MAX)
        tl.store(dst, _to_fp8(q, y_ptr.dtype.element_ty, INTERPRET), mask=out_mask)
        tl.store(s_ptr + row * stride_s, s)
    elif QMODE == 2:
        codes, s = fp8_groups(tl.reshape(y, (BLOCK // 128, 128)), y_ptr.dtype.element_ty, INTERPRET)
        # Pointers built in 2D, not reshaped from `dst`: the compiler then sees each group's 128
        # codes as contiguous and stores them in vectors (from a reshaped pointer tensor it stored
        # single bytes 128 apart across a warp, ~8x slower per row on the H200).
        g_offs = tl.arange(0, BLOCK // 128)
        cols = g_offs[:, None] * 128 + tl.arange(0, 128)[None, :]
        tl.store(y_ptr + row.to(tl.int64) * stride_y + cols, codes, mask=cols < N)
        tl.store(s_ptr + row * stride_s + g_offs, s, mask=g_offs * 128 < N)
    else:
        e = tl.load(pexp_ptr + row)
        if e >= 0:
            if PHASE == 0:
                tl.atomic_max(amax_ptr + e, tl.max(tl.abs(y), axis=0))
            else:
                s = tl.maximum(tl.load(amax_ptr + e), 1e-12) / _FP8_MAX
                q = tl.clamp(tl.math.div_rn(y, tl.zeros_like(y) + s), -_FP8_MAX, _FP8_MAX)
                tl.store(dst, _to_fp8(q, y_ptr.dtype.element_ty, INTERPRET), mask=out_mask)
                tl.store(s_ptr + row * stride_s, s)


def _out_width(h: torch.Tensor, kind: ActKind) -> int:
    gated = kind in (ActKind.SILU, ActKind.GELU, ActKind.GELU_TANH, ActKind.SWIGLU_OAI)
    if gated and h.shape[1] % 2:
        raise ValueError(f"gated activation needs an even width, got {h.shape[1]}")
    return h.shape[1] // 2 if gated else h.shape[1]


def act_quant(h: torch.Tensor, activation: Activation | None, qmode: QMode, out_dtype: torch.dtype,
              rows: int, in_div: int = 1, pair_expert: torch.Tensor | None = None,
              num_experts: int = 0, gate_up_chunk: int = 0,
              out_cols: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """rows outputs from h rows (row // in_div): (values [rows, out_cols], fp32 scales or None).

    Scales: TOKEN and TENSOR [rows, 1], GROUP128 [rows, N/128]. TENSOR needs pair_expert (the
    local expert of each output row, -1 to skip) and num_experts. gate_up_chunk > 0: gated h rows
    are in `GateUpInterleave(gate_up_chunk)` order, not [gate | up]. out_cols (default: the
    output width N): more for a GEMM whose K is padded to whole tiles, zeros past N.
    """
    kind = ActKind.NONE if activation is None else act_kind(activation)
    n = _out_width(h, kind)
    if qmode is QMode.GROUP128 and n % 128:
        raise ValueError(f"fp8 group-128 activation quantization needs a width divisible by 128, got {n}")
    out_cols = n if out_cols is None else out_cols
    if out_cols < n or (qmode is QMode.GROUP128 and out_cols != n):
        raise ValueError(f"out_cols={out_cols}: at least the output width {n}" + (
            ", and equal to it per 128-wide group" if qmode is QMode.GROUP128 else ""))
    y = torch.empty(rows, out_cols, dtype=out_dtype, device=h.device)
    scales = None
    if qmode in (QMode.TOKEN, QMode.TENSOR):
        scales = torch.empty(rows, 1, dtype=torch.float32, device=h.device)
    elif qmode is QMode.GROUP128:
        scales = torch.empty(rows, n // 128, dtype=torch.float32, device=h.device)
    if rows == 0:
        return y, scales
    alpha = activation.alpha if activation is not None and activation.alpha is not None else 0.0
    limit = activation.limit if activation is not None and activation.limit is not None else 0.0
    block = max(next_power_of_2(out_cols), 128)
    warps = min(16, max(1, block // 512))
    # Only the per-tensor mode reduces into amax; the others skip the memset launch.
    amax = (torch.zeros if qmode is QMode.TENSOR else torch.empty)(max(num_experts, 1), dtype=torch.float32,
                                                                   device=h.device)
    pexp = pair_expert if pair_expert is not None else amax
    s_arg = scales if scales is not None else amax
    for phase in ((0, 1) if qmode is QMode.TENSOR else (0,)):
        _act_quant_kernel[(rows,)](h, y, s_arg, amax, pexp, n, out_cols, h.stride(0), y.stride(0),
                                   s_arg.stride(0) if scales is not None else 0, in_div, alpha, limit,
                                   ACT=int(kind), QMODE=int(qmode), PHASE=phase, GATE_UP_CHUNK=gate_up_chunk,
                                   BLOCK=block,
                                   INTERPRET=interpreting(), num_warps=warps, **dependent_options(h.device))
    return y, scales


def act_quant_torch(h: torch.Tensor, activation: Activation | None, qmode: QMode, out_dtype: torch.dtype,
                    rows: int, in_div: int = 1, pair_expert: torch.Tensor | None = None,
                    num_experts: int = 0, gate_up_chunk: int = 0,
                    out_cols: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The twin of `act_quant`, from moe_core's reference activation."""
    x = h.float()[torch.arange(rows, device=h.device) // in_div]
    if gate_up_chunk and activation is not None and activation.gated:
        x = GateUpInterleave(gate_up_chunk).unswizzle(x)
    y = x if activation is None else apply_activation(x, activation)
    if out_cols is not None:
        y = torch.nn.functional.pad(y, (0, out_cols - y.shape[1]))
    if qmode is QMode.NONE:
        return y.to(out_dtype), None
    if qmode is QMode.TOKEN:
        s = y.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    elif qmode is QMode.GROUP128:
        s = y.view(rows, -1, 128).abs().amax(-1).clamp(min=1e-12) / FP8_MAX
    else:
        s = torch.ones(rows, 1, dtype=torch.float32, device=h.device)
        for e in range(num_experts):
            sel = pair_expert == e
            if bool(sel.any()):
                s[sel] = y[sel].abs().amax().clamp(min=1e-12) / FP8_MAX
    full = s.repeat_interleave(128, 1) if qmode is QMode.GROUP128 else s
    q = (y / full).clamp(-FP8_MAX, FP8_MAX).to(out_dtype)
    return q, s
