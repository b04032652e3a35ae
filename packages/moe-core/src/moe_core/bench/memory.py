"""The memory a `moe run` or `moe bench` plans to use, checked against the device's before anything
is allocated (`estimate_peak_bytes`, `planned_bytes`)."""

from __future__ import annotations

from moe_core.bench.roofline import weight_bytes_per_param
from moe_core.config import MoEConfig
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType, unquantized

# Temporaries per parameter of the one expert being drawn, quantized or checked against the fp32
# reference at a time: its fp32 draw and scaled copy, and the fp32/int64 temporaries of quantizing and
# dequantizing it (measured on the CPU: about 9 bytes unquantized, 13 to 21 quantized).
_EXPERT_TEMPORARY_BYTES = {False: 12, True: 24}
# Weights dequantized at load are converted a few experts at a time (7 to 15 bytes per parameter of
# those experts measured, fp8 blocks and mxfp4 the most).
_DEQUANTIZED_CHUNK_EXPERTS = 4
_DEQUANTIZED_CHUNK_BYTES = 16
# Packing integer codes into a kernel layout makes whole-tensor temporaries (moe-cpu: an unpacked uint8
# copy of int4 codes, int16 copies of int8 codes), per parameter of the larger weight tensor.
_PACKING_BYTES = {QuantDType.INT4: 2, QuantDType.INT8: 4}
# What the allocator keeps of freed temporaries and the libraries' workspaces (oneDNN, the reference):
# measured up to about 50 MiB above the terms above on layers of 50M parameters.
_FIXED_OVERHEAD_BYTES = 64 << 20
# Per token and top-k slot, in fp32 elements: the routed input, the gate/up and activated rows, the
# expert output, and their copies in the reference and the naive loop.
_ACTIVATION_COPIES = 4


def _activation_bytes(config: MoEConfig, tokens: int) -> int:
    R, K, N = config.w13_rows, config.hidden_size, config.intermediate_size_per_partition
    return tokens * (config.top_k * _ACTIVATION_COPIES * (R + N + K) + config.num_experts) * 4


def estimate_peak_bytes(config: MoEConfig, quants: list[MoEQuantConfig], tokens: int = 0,
                        dense_baseline: bool = False, accelerator: bool = False) -> int:
    """Peak memory, above what the process held before, of building and running `config` under each
    of `quants` in turn (`moe run`: one scheme; `moe bench`: several, one at a time) for up to
    `tokens` tokens per call.

    Per scheme, the larger of drawing its weights (`ExpertWeights.random` holds the per-expert parts
    and their concatenation: the canonical form twice) and running them (the canonical form and the
    kernel layout, `_packed_bytes_per_param`, with the temporaries of packing integer codes), plus the
    temporaries of one expert (or of the chunk of experts dequantized at once), the activations and a
    fixed allowance for the allocator and libraries. `dense_baseline`: the layer-dtype weights of the
    naive loop stay loaded throughout, and unquantized layers load those (`moe bench`). `accelerator`:
    the layer runs on a GPU, whose kernels keep every scheme's codes (`_packed_bytes_per_param`).
    """
    E = config.num_local_experts
    params = E * (config.w13_rows * config.hidden_size + config.hidden_size * config.intermediate_size_per_partition)
    dense = params * weight_bytes_per_param(config, unquantized())
    activations = _activation_bytes(config, tokens)
    per_scheme = []
    for q in quants:
        canonical = params * weight_bytes_per_param(config, q)
        packed = params * _packed_bytes_per_param(config, q, accelerator)
        if dense_baseline and not q.weight.quantized:  # the layer loads the naive loop's weights
            per_scheme.append(packed + activations)
            continue
        temporaries = params / E * _EXPERT_TEMPORARY_BYTES[q.weight.quantized]
        packing = 0
        if _packs_codes(q) and not accelerator:  # the CPU's ATen packing temporaries
            larger = max(config.w13_rows, config.intermediate_size_per_partition) * config.hidden_size
            packing = E * larger * _PACKING_BYTES[q.weight.dtype]
        if packed > canonical:
            chunk = min(_DEQUANTIZED_CHUNK_EXPERTS, E) / E * params * _DEQUANTIZED_CHUNK_BYTES
            temporaries = max(temporaries, chunk)
        per_scheme.append(max(2 * canonical, canonical + packed + packing) + temporaries + activations)
    if dense_baseline:
        # drawing the dense weights themselves, before they are held
        per_scheme.append(dense + params / E * _EXPERT_TEMPORARY_BYTES[False])
    return int((dense if dense_baseline else 0) + max(per_scheme, default=0) + _FIXED_OVERHEAD_BYTES)


def planned_bytes(config: MoEConfig, quants: list[MoEQuantConfig], tokens: int = 0, accelerator: bool = False) -> int:
    """Peak memory of `moe bench` on `config`: `estimate_peak_bytes` with the naive loop's dense weights."""
    return estimate_peak_bytes(config, quants, tokens, dense_baseline=True, accelerator=accelerator)


# GPU layouts keep the codes but may pad them (K to whole tiles, e.g. gpt-oss's 2880 to 2944).
_ACCELERATOR_PADDING = 1.1


def _packed_bytes_per_param(config: MoEConfig, quant: MoEQuantConfig, accelerator: bool = False) -> float:
    """Upper bound of a kernel layout's size per parameter: on GPUs the codes, padded; on the CPU,
    grouped int4 and per-channel int8 codes repack at their own size and every other format may be
    dequantized at load (where no packed kernel serves it), to the layer dtype, or to fp32 where
    activations are quantized."""
    own = weight_bytes_per_param(config, quant)
    if accelerator:
        return own * _ACCELERATOR_PADDING
    if not quant.weight.quantized or _packs_codes(quant):
        return own
    return max(own, 4.0 if quant.activation is not None else weight_bytes_per_param(config, unquantized()))


def _packs_codes(quant: MoEQuantConfig) -> bool:
    """Whether packed kernels keep the integer codes (grouped int4, per-channel int8) rather than
    dequantizing them at load."""
    key = quant.weight
    return key.quantized and (
        (key.dtype is QuantDType.INT4 and key.scale.granularity is Granularity.GROUP)
        or (key.dtype is QuantDType.INT8 and key.scale.granularity is Granularity.CHANNEL))
