"""gpt-oss MXFP4 experts -> canonical `ExpertWeights` (fp4e2m1 codes, e8m0 scales per 32).

Checkpoint keys under the experts prefix (experts stacked, [out, in] orientation):

| key | dtype | shape |
|---|---|---|
| `gate_up_proj_blocks` | uint8 | [E, 2N, K/32, 16] (two e2m1 codes a byte, even element in the low nibble) |
| `gate_up_proj_scales` | uint8 | [E, 2N, K/32] (E8M0 biased exponents: scale = 2**(s - 127)) |
| `gate_up_proj_bias` | bf16/fp16/fp32 | [E, 2N] |
| `down_proj_blocks` | uint8 | [E, K, N/32, 16] |
| `down_proj_scales` | uint8 | [E, K, N/32] |
| `down_proj_bias` | bf16/fp16/fp32 | [E, K] |

The 2N rows alternate gate, up (gate = rows 0::2); canonical w13 wants gate rows then up rows, so
rows of blocks, scales and bias are de-interleaved. Verified against transformers 5.23
`integrations/mxfp4.py::_convert_moe_packed_tensors` (the producing side's own dequantization:
`lut[blk & 0x0F]` to even columns, `lut[blk >> 4]` to odd, `ldexp(·, scales - 127)`, then
`transpose(1, 2)` into `GptOssExperts`' [in, out] tensors whose last dim is split `::2` / `1::2`).
The 16-byte blocks flatten to canonical [E, R, K/2] bytes unchanged: same nibble order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from moe_core.quant import MXFP4_WEIGHT
from moe_core.weights._source import CheckpointError, TensorSource, expert_ids, join_key
from moe_core.weights.canonical import ExpertWeights
from moe_core.weights.hf import deinterleave_gate_up

__all__ = ["gpt_oss_mxfp4_experts"]

_MX_BLOCK = 32
_BYTES_PER_BLOCK = _MX_BLOCK // 2


def gpt_oss_mxfp4_experts(source: TensorSource, prefix: str, num_experts: int,
                          experts: Sequence[int] | None = None) -> ExpertWeights:
    """Read a gpt-oss MXFP4 experts module; `experts` selects expert ids (default all)."""
    E = num_experts
    ids = expert_ids(E, experts)
    k = {name: join_key(prefix, name) for name in (
        "gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias",
        "down_proj_blocks", "down_proj_scales", "down_proj_bias")}
    gu_blocks = source.get(k["gate_up_proj_blocks"], (E, None, None, _BYTES_PER_BLOCK), (torch.uint8,))
    _, R, k_blocks, _ = gu_blocks.shape
    if R % 2:
        raise CheckpointError(f"{source.what}: {k['gate_up_proj_blocks']!r} has {R} rows; gate/up interleaved "
                              "rows must be even")
    N, K = R // 2, k_blocks * _MX_BLOCK
    if N % _MX_BLOCK:
        raise CheckpointError(f"{source.what}: intermediate size {N} (from {k['gate_up_proj_blocks']!r}) is not a "
                              f"multiple of the MXFP4 block {_MX_BLOCK}")
    down_blocks = source.get(k["down_proj_blocks"], (E, K, N // _MX_BLOCK, _BYTES_PER_BLOCK), (torch.uint8,))
    gu_scales = source.get(k["gate_up_proj_scales"], (E, R, k_blocks), (torch.uint8,))
    down_scales = source.get(k["down_proj_scales"], (E, K, N // _MX_BLOCK), (torch.uint8,))
    gu_bias = source.get_float(k["gate_up_proj_bias"], (E, R))
    down_bias = source.get_float(k["down_proj_bias"], (E, K))
    if gu_bias.dtype != down_bias.dtype:
        raise CheckpointError(f"{source.what}: {k['gate_up_proj_bias']!r} is {gu_bias.dtype} but "
                              f"{k['down_proj_bias']!r} is {down_bias.dtype}; expected one dtype")

    sel = torch.tensor(ids)  # after the shape checks: E is then the experts the tensors hold

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, sel)

    return ExpertWeights(
        MXFP4_WEIGHT,
        w13=deinterleave_gate_up(pick(gu_blocks).reshape(len(sel), R, K // 2), 1).contiguous(),
        w2=pick(down_blocks).reshape(len(sel), K, N // 2).contiguous(),
        w13_scale=deinterleave_gate_up(pick(gu_scales), 1).contiguous(),
        w2_scale=pick(down_scales).contiguous(),
        w13_bias=deinterleave_gate_up(pick(gu_bias), 1).contiguous(),
        w2_bias=pick(down_bias).contiguous(),
    )
