"""One quantized nn.Linear of a checkpoint (outside the experts) -> its float weight.

GPTQ, AWQ and compressed-tensors checkpoints usually quantize attention and shared-expert linears
too; fp8 ones (block FP8, compressed-tensors float-quantized) every linear but the router and head.
Where transformers' quantizer does not take them (see `from_pretrained`), it runs those as float
linears of the model dtype, dequantized here through the experts' own readers (one projection each), so the values are exactly the ones the readers define:
(code - zero) * scale per group, or fp8 times its tensor, row or block scale.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from moe_core.weights._intquant import QuantizedProjection
from moe_core.weights._source import CheckpointError, TensorSource
from moe_core.weights.packing import unpack_int4

__all__ = ["dequantized_linear"]


def dequantized_linear(source: TensorSource, module: str, method: str, qc: Mapping, parsed: object) -> torch.Tensor:
    """The fp32 weight [out, in] of the quantized linear `module`; every tensor it reads is marked
    consumed in `source`, and any other tensor of the module (except a float bias) is refused."""
    if method == "gptq":
        from moe_core.weights import gptq

        weight = _integer(gptq._projection(source, module, parsed, parsed.act_order), parsed.bits, parsed.group_size)
    elif method == "awq":
        from moe_core.weights import awq

        weight = _integer(awq._projection(source, module, parsed), 4, parsed.group_size)
    elif method == "compressed-tensors":
        from moe_core.weights import compressed_tensors as ct

        scheme = ct.compressed_tensors_scheme_for(qc, [module])
        if scheme is None:
            raise CheckpointError(f"{source.what}: {module!r} holds quantized tensors but quantization_config "
                                  "ignores it")
        if isinstance(scheme, ct.CompressedTensorsFP8Scheme):
            weight = _fp8(*ct.fp8_projection(source, module, scheme), scheme.block)
        else:
            weight = _integer(ct._projection(source, module, scheme), scheme.bits, scheme.group_size)
    elif method == "fp8":
        from moe_core.weights import fp8

        weight = _fp8(*fp8._projection(source, module, parsed), parsed.block_shape)
    else:
        raise CheckpointError(f"{source.what}: {module!r} is quantized, but {method!r} checkpoints quantize experts only")
    prefix = module + "."
    left = [k for k in source.names_under(prefix) if k not in source.consumed
            and k.removeprefix(prefix) != "bias" and "." not in k.removeprefix(prefix)]
    if left:
        raise CheckpointError(f"{source.what}: tensor(s) {', '.join(sorted(left))} of the quantized linear "
                              f"{module!r} are not part of the {method} format and would be ignored")
    return weight


def _integer(p: QuantizedProjection, bits: int, group_size: int) -> torch.Tensor:
    """(code - zero) * scale, with the group of each input column from g_idx or its position."""
    codes = unpack_int4(p.codes) if p.packed else p.codes
    _, K = codes.shape
    if p.g_idx is not None:
        groups = p.g_idx.long()
    elif group_size > 0:
        groups = torch.arange(K) // group_size
    else:
        groups = torch.zeros(K, dtype=torch.long)
    zero = p.zero[:, groups].float() if p.zero is not None else float(1 << (bits - 1))
    return (codes.float() - zero) * p.scale[:, groups].float()


def _fp8(codes: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None) -> torch.Tensor:
    """codes times their scale: one per row ([out]) or one per block of the grid."""
    if block is None:
        return codes.float() * scale[:, None]
    (br, bc), (rows, cols) = block, codes.shape
    return codes.float() * scale.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
