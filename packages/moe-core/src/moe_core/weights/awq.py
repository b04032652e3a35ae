"""AWQ GEMM checkpoints (AutoAWQ `version: gemm`, 4-bit, zero points) -> canonical `ExpertWeights`.

Per expert projection, K = in_features, N = out_features, G = K / group_size:

| tensor | dtype | shape | layout |
|---|---|---|---|
| `qweight` | int32 | [K, N / 8] | packed along N; field i of word c holds column 8c + [0,2,4,6,1,3,5,7][i] |
| `qzeros` | int32 | [G, N / 8] | same packing; zeros stored as they are (no minus one) |
| `scales` | fp16 | [G, N] | |

Dequantization: w[n, k] = (q[k, n] - z[k // g, n]) * scales[k // g, n]. Verified against AutoAWQ
0.2.9's own code: `WQLinear_GEMM.from_linear` (the `order_map` above, `intweight.t()` so rows are
in_features) and `awq/utils/packing_utils.py::dequantize_gemm` (`AWQ_REVERSE_ORDER`, zeros used
verbatim). The test fixture in tests/fixtures/awq was packed by that code (scripts/make_awq_fixtures.py).
Refused: `version: gemv` / `gemv_fast` / `marlin` (other packings), `zero_point: false`, bits other than 4.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from moe_core.quant import MoEQuantConfig, int4_w4a16
from moe_core.weights._config import config_bool, config_int
from moe_core.weights._intquant import (
    QuantizedProjection,
    assemble_int_experts,
    expert_projection_names,
    unpack_int32,
)
from moe_core.weights._source import FLOAT_DTYPES, CheckpointError, TensorSource, expert_ids, join_key
from moe_core.weights.canonical import ExpertWeights

__all__ = ["AWQ_PACK_ORDER", "AWQFormat", "awq_experts"]

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # column (within 8) held by each 4-bit field, low bits first


@dataclass(frozen=True)
class AWQFormat:
    group_size: int
    modules_to_not_convert: tuple[str, ...] = ()  # substrings of module names left unquantized

    def __post_init__(self) -> None:
        if not isinstance(self.group_size, int) or self.group_size < 1:
            raise ValueError(f"AWQ group_size={self.group_size!r} is invalid: expected a positive int")

    @staticmethod
    def from_config(qc: Mapping[str, object]) -> AWQFormat:
        """From config.json's `quantization_config` (quant_method "awq")."""
        if qc.get("quant_method") != "awq":
            raise ValueError(f"quantization_config.quant_method={qc.get('quant_method')!r}: expected 'awq'")
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"AWQ version={version!r} is not supported: only 'gemm' packing is read")
        if qc.get("bits", 4) != 4:
            raise ValueError(f"AWQ bits={qc.get('bits')!r} is not supported: AWQ GEMM packing is 4-bit")
        if not config_bool(qc, "zero_point", True, "AWQ quantization_config"):
            raise ValueError("AWQ zero_point=false is not supported: the GEMM format stores zero points")
        if "group_size" not in qc:
            raise ValueError("quantization_config has no 'group_size'")
        group_size = config_int(qc, "group_size", "AWQ quantization_config", "a positive int (AutoAWQ writes 128)")
        skip = qc.get("modules_to_not_convert") or ()
        if not isinstance(skip, list | tuple) or not all(isinstance(m, str) for m in skip):
            raise ValueError(f"AWQ quantization_config.modules_to_not_convert={skip!r} is invalid: expected a list "
                             "of module-name substrings (or null)")
        return AWQFormat(group_size, tuple(skip))

    def quant_config(self, scale_dtype: str = "fp16") -> MoEQuantConfig:
        """The scheme these weights load as (scale storage: AutoAWQ writes fp16)."""
        return int4_w4a16(self.group_size, zero_point=True, scale_dtype=scale_dtype)

    def converts(self, module: str) -> bool:
        """Whether AutoAWQ quantized `module` (it skips names containing any not-convert entry)."""
        return not any(skip in module for skip in self.modules_to_not_convert)


def awq_experts(source: TensorSource, prefix: str, num_experts: int, fmt: AWQFormat,
                experts: Sequence[int] | None = None) -> ExpertWeights:
    ids = expert_ids(num_experts, experts)
    names = expert_projection_names(source, prefix, ids[0], "qweight")
    per_expert = [{n: _projection(source, join_key(prefix, f"{e}.{n}"), fmt) for n in names if n is not None}
                  for e in ids]
    return assemble_int_experts(per_expert, names, bits=4, group_size=fmt.group_size, zero_point=True,
                                act_order=False, where=f"{source.what}: {prefix}")


def _projection(source: TensorSource, module: str, fmt: AWQFormat) -> QuantizedProjection:
    qweight = source.get(f"{module}.qweight", (None, None), (torch.int32,))
    K, N = qweight.shape[0], qweight.shape[1] * 8
    if K % fmt.group_size:
        raise CheckpointError(f"{source.what}: {module}.qweight has in_features {K}, not a multiple of "
                              f"group_size {fmt.group_size}")
    G = K // fmt.group_size
    qzeros = source.get(f"{module}.qzeros", (G, N // 8), (torch.int32,))
    scales = source.get(f"{module}.scales", (G, N), FLOAT_DTYPES)
    codes = unpack_int32(qweight, 4, dim=1, order=AWQ_PACK_ORDER).t()  # [N, K]
    zero = unpack_int32(qzeros, 4, dim=1, order=AWQ_PACK_ORDER).t()  # [N, G]
    return QuantizedProjection(codes.contiguous(), scales.t().contiguous(), zero.contiguous(), None)
