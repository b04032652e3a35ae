"""GPTQ (AutoGPTQ / GPTQModel "gptq" and "gptq_v2" checkpoint formats) -> canonical `ExpertWeights`.

Per expert projection (`{prefix}.{e}.{gate_proj|up_proj|down_proj}` or Mixtral `w1|w3|w2`),
K = in_features, N = out_features, pf = 32 / bits codes per int32, G = K / group_size (1 if -1):

| tensor | dtype | shape | layout |
|---|---|---|---|
| `qweight` | int32 | [K / pf, N] | packed along K: input k = pf*r + i sits at bits i*bits of word r |
| `qzeros` | int32 | [G, N / pf] | packed along N, same field order; "gptq" (v1) stores zero - 1 |
| `scales` | fp16/bf16/fp32 | [G, N] | |
| `g_idx` | int32 | [K] | group of each input channel (permuted with desc_act) |

Dequantization: w[n, k] = (q[k, n] - z[g_idx[k], n]) * scales[g_idx[k], n]. With `sym: true` the
zero is the implicit 2**(bits-1) (vLLM's uint4b8 / uint8b128) and qzeros are ignored, as vLLM's
gptq_marlin does. Verified against the format notes in the shared reference (auto-gptq 0.7.1
`qlinear_cuda_old.pack`, gptqmodel `pack_original`: v1 subtracts one from the zeros before packing;
`checkpoint_format: gptq_v2` stores them as they are, which vLLM's gptq_v2 support also assumes).
No GPTQ packer installs cheaply on CPU (auto-gptq needs transformers < 5, gptqmodel torch >= 2.14 +
CUDA stack), so the tests build tensors from this documented packing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from moe_core.quant import MoEQuantConfig, int4_w4a16, int8_w8a16
from moe_core.weights._config import config_bool
from moe_core.weights._intquant import (
    QuantizedProjection,
    assemble_int_experts,
    check_trivial_g_idx,
    expert_projection_names,
    int4_words_as_packed,
    unpack_int32,
)
from moe_core.weights._source import FLOAT_DTYPES, CheckpointError, TensorSource, expert_ids, join_key
from moe_core.weights.canonical import ExpertWeights

__all__ = ["GPTQFormat", "gptq_experts"]


@dataclass(frozen=True)
class GPTQFormat:
    bits: int  # 4 or 8
    group_size: int  # -1 = one group spanning all input channels
    sym: bool  # zeros implicit at 2**(bits-1)
    desc_act: bool  # act-order: g_idx is a permuted grouping
    zeros_stored_minus_one: bool  # checkpoint_format "gptq" (v1) stores zero - 1; "gptq_v2" stores zero

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"GPTQ bits={self.bits} is not supported: expected 4 or 8")
        if self.group_size != -1 and (not isinstance(self.group_size, int) or self.group_size < 1):
            raise ValueError(f"GPTQ group_size={self.group_size!r} is invalid: expected a positive int or -1")

    @staticmethod
    def from_config(qc: Mapping[str, object]) -> GPTQFormat:
        """From config.json's `quantization_config` (quant_method "gptq")."""
        if qc.get("quant_method") != "gptq":
            raise ValueError(f"quantization_config.quant_method={qc.get('quant_method')!r}: expected 'gptq'")
        fmt = qc.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"GPTQ checkpoint_format={fmt!r} is not supported: expected 'gptq' or 'gptq_v2' "
                             "(kernel-specific formats such as marlin are repacked layouts, not GPTQ)")
        if qc.get("dynamic"):
            raise ValueError("GPTQ 'dynamic' per-module overrides are not supported: every expert must share "
                             "one bits/group_size")
        for field in ("bits", "group_size"):
            if field not in qc:
                raise ValueError(f"quantization_config has no {field!r}; a GPTQ config needs bits and group_size")
        for field in ("bits", "group_size"):
            if isinstance(qc[field], bool) or not isinstance(qc[field], int):
                raise ValueError(f"GPTQ quantization_config.{field}={qc[field]!r}: expected an integer")
        where = "GPTQ quantization_config"
        return GPTQFormat(bits=qc["bits"], group_size=qc["group_size"], sym=config_bool(qc, "sym", True, where),
                          desc_act=config_bool(qc, "desc_act", False, where), zeros_stored_minus_one=fmt == "gptq")

    @property
    def act_order(self) -> bool:
        return self.desc_act and self.group_size != -1  # one group: the order cannot matter

    def quant_config(self, scale_dtype: str = "fp16") -> MoEQuantConfig:
        """The scheme these weights load as (scale storage: GPTQ writes fp16)."""
        factory = int4_w4a16 if self.bits == 4 else int8_w8a16
        return factory(self.group_size, zero_point=not self.sym, act_order=self.act_order, scale_dtype=scale_dtype)


def gptq_experts(source: TensorSource, prefix: str, num_experts: int, fmt: GPTQFormat,
                 experts: Sequence[int] | None = None) -> ExpertWeights:
    ids = expert_ids(num_experts, experts)
    names = expert_projection_names(source, prefix, ids[0], "qweight")
    act_order = fmt.act_order
    per_expert = [{n: _projection(source, join_key(prefix, f"{e}.{n}"), fmt, act_order)
                   for n in names if n is not None} for e in ids]
    return assemble_int_experts(per_expert, names, bits=fmt.bits, group_size=fmt.group_size,
                                zero_point=not fmt.sym, act_order=act_order, where=f"{source.what}: {prefix}")


def _projection(source: TensorSource, module: str, fmt: GPTQFormat, act_order: bool) -> QuantizedProjection:
    per_word = 32 // fmt.bits
    qweight = source.get(f"{module}.qweight", (None, None), (torch.int32,))
    K, N = qweight.shape[0] * per_word, qweight.shape[1]
    if fmt.group_size != -1 and K % fmt.group_size:
        raise CheckpointError(f"{source.what}: {module}.qweight gives in_features {K}, not a multiple of "
                              f"group_size {fmt.group_size}")
    G = 1 if fmt.group_size == -1 else K // fmt.group_size
    scales = source.get(f"{module}.scales", (G, N), FLOAT_DTYPES)
    packed = int4_words_as_packed(qweight, 0, K) if fmt.bits == 4 else None
    codes = packed if packed is not None else unpack_int32(qweight, fmt.bits, dim=0).t()  # [N, K]
    zero = None
    if fmt.sym and f"{module}.qzeros" in source:
        # Symmetric checkpoints still carry qzeros (the implicit zero, stored); checked, then unused.
        source.get(f"{module}.qzeros", (G, -(-N // per_word)), (torch.int32,))
    if not fmt.sym:
        if N % per_word:
            raise CheckpointError(f"{source.what}: {module}: out_features {N} is not a multiple of {per_word}, "
                                  "so qzeros cannot be packed along it")
        qzeros = source.get(f"{module}.qzeros", (G, N // per_word), (torch.int32,))
        stored = unpack_int32(qzeros, fmt.bits, dim=1).to(torch.int32)
        # v1 wrote zero - 1 masked to `bits`; adding one back modulo 2**bits recovers zero 0 as well.
        zero = ((stored + int(fmt.zeros_stored_minus_one)) % (1 << fmt.bits)).to(torch.uint8).t()
    g_idx = None
    key = f"{module}.g_idx"
    if act_order:
        g_idx = source.get(key, (K,), (torch.int32, torch.int64))
        if int(g_idx.min()) < 0 or int(g_idx.max()) >= G:
            raise CheckpointError(f"{source.what}: {key!r} holds groups outside [0, {G})")
        g_idx = g_idx.to(torch.int32)
    elif key in source:
        check_trivial_g_idx(source.get(key, (K,), (torch.int32, torch.int64)), fmt.group_size, key, source.what)
    return QuantizedProjection(codes.contiguous(), scales.t().contiguous(), zero, g_idx, packed=packed is not None)
