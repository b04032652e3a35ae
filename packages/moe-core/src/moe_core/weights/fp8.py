"""Block FP8 checkpoints (DeepSeek-V3 style, `quant_method: fp8` + `weight_block_size`) -> `ExpertWeights`.

Per expert projection (N = out_features, K = in_features, block (br, bc), usually 128 x 128):

| tensor | dtype | shape |
|---|---|---|
| `weight` | float8_e4m3fn | [N, K] |
| `weight_scale_inv` | fp32 (or bf16, or float8_e8m0fnu) | [ceil(N / br), ceil(K / bc)] |

Despite its name the scale multiplies: w = weight * weight_scale_inv[n // br, k // bc]. Verified
against transformers 5.23 `integrations/finegrained_fp8.py` (`weight.mul_(scale)` after
`repeat_interleave(block_size[0])` over rows; scale grids in fp32 or UE8M0). Canonical w13 stacks
gate rows over up rows, so N must be a multiple of br: otherwise one scale block would straddle
gate and up. Activations are quantized dynamically per 1 x bc group (`activation_scheme: dynamic`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from moe_core.quant import MoEQuantConfig, QuantKey, fp8_w8a8
from moe_core.weights._intquant import expert_projection_names
from moe_core.weights._source import CheckpointError, TensorSource, expert_ids, join_key
from moe_core.weights.canonical import ExpertWeights

__all__ = ["BlockFP8Format", "block_fp8_experts", "stack_fp8_experts"]

_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float8_e8m0fnu)


@dataclass(frozen=True)
class BlockFP8Format:
    block_shape: tuple[int, int]  # (rows, cols) of the weight per scale

    def __post_init__(self) -> None:
        bs = self.block_shape
        if not (isinstance(bs, tuple) and len(bs) == 2 and all(isinstance(b, int) and b > 0 for b in bs)):
            raise ValueError(f"weight_block_size={bs!r} is invalid: expected two positive ints")

    @staticmethod
    def from_config(qc: Mapping[str, object]) -> BlockFP8Format:
        """From config.json's `quantization_config` (quant_method "fp8")."""
        if qc.get("quant_method") != "fp8":
            raise ValueError(f"quantization_config.quant_method={qc.get('quant_method')!r}: expected 'fp8'")
        if qc.get("fmt", "e4m3") != "e4m3":
            raise ValueError(f"fp8 fmt={qc.get('fmt')!r} is not supported: expected 'e4m3'")
        if qc.get("activation_scheme", "dynamic") != "dynamic":
            raise ValueError(f"fp8 activation_scheme={qc.get('activation_scheme')!r} is not supported: only "
                             "dynamic activation scales are")
        block = qc.get("weight_block_size")
        if block is None:
            raise ValueError("fp8 checkpoints without weight_block_size (per-tensor scales) are not supported: "
                             "only block-wise FP8 (DeepSeek-V3 style) is read")
        if not (isinstance(block, list | tuple) and len(block) == 2
                and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise ValueError(f"fp8 quantization_config.weight_block_size={block!r} is invalid: expected two positive "
                             "ints [rows, cols], e.g. [128, 128]")
        return BlockFP8Format(tuple(block))

    def quant_config(self) -> MoEQuantConfig:
        return fp8_w8a8("block", block=self.block_shape)


def block_fp8_experts(source: TensorSource, prefix: str, num_experts: int, fmt: BlockFP8Format,
                      experts: Sequence[int] | None = None) -> ExpertWeights:
    return stack_fp8_experts(source, prefix, expert_ids(num_experts, experts), fmt.quant_config().weight,
                             "weight_scale_inv", lambda module: _projection(source, module, fmt))


def stack_fp8_experts(source: TensorSource, prefix: str, ids: Sequence[int], key: QuantKey, scale_suffix: str,
                      projection: Callable[[str], tuple[torch.Tensor, torch.Tensor]]) -> ExpertWeights:
    """Per-expert fp8 projections -> canonical `ExpertWeights` of `key`: gate rows over up rows.

    projection(module) gives (codes [N, K], fp32 scales in canonical form: [N] per row or the block
    grid); `scale_suffix` names the scale tensor, by which the projections' names are found."""
    gate, up, down = expert_projection_names(source, prefix, ids[0], scale_suffix)
    block = key.scale.block_shape
    w13s, w2s, s13s, s2s = [], [], [], []
    for e in ids:
        parts = {n: projection(join_key(prefix, f"{e}.{n}")) for n in (gate, up) if n}
        N = parts[up][0].shape[0]
        if gate is not None and block is not None and N % block[0]:
            raise CheckpointError(f"{source.what}: {join_key(prefix, f'{e}.{up}.weight')} has {N} rows, not a "
                                  f"multiple of the block rows {block[0]}: gate and up cannot share one block grid")
        parts[down] = projection(join_key(prefix, f"{e}.{down}"))
        w13s.append(torch.cat([parts[n][0] for n in (gate, up) if n], 0))
        s13s.append(torch.cat([parts[n][1] for n in (gate, up) if n], 0))
        w2s.append(parts[down][0])
        s2s.append(parts[down][1])
    return ExpertWeights(key, torch.stack(w13s), torch.stack(w2s), w13_scale=torch.stack(s13s),
                         w2_scale=torch.stack(s2s))


def _projection(source: TensorSource, module: str, fmt: BlockFP8Format) -> tuple[torch.Tensor, torch.Tensor]:
    weight = source.get(f"{module}.weight", (None, None), (torch.float8_e4m3fn,))
    N, K = weight.shape
    br, bc = fmt.block_shape
    scale = source.get(f"{module}.weight_scale_inv", (-(-N // br), -(-K // bc)), _SCALE_DTYPES)
    return weight, scale.float()  # e8m0 and bf16 scales are exact in fp32
