"""Unquantized Hugging Face expert layouts -> canonical `ExpertWeights`.

`experts_from_state_dict(tensors, prefix, num_experts)` reads one MoE layer's experts from any
name -> tensor mapping (a model's `state_dict()`, or safetensors opened lazily) and recognises, by
the keys under `prefix` (the experts module, e.g. "model.layers.3.mlp.experts"):

| keys under prefix | models | orientation |
|---|---|---|
| `{e}.w1.weight`, `{e}.w3.weight`, `{e}.w2.weight` | Mixtral checkpoints (w1 gate, w3 up, w2 down) | nn.Linear [out, in] |
| `{e}.gate_proj.weight`, `{e}.up_proj.weight`, `{e}.down_proj.weight` | Qwen2/3-MoE, DeepSeek-V3, OLMoE checkpoints | nn.Linear [out, in] |
| `{e}.up_proj.weight`, `{e}.down_proj.weight` (no gate) | non-gated experts (relu2) | nn.Linear [out, in] |
| `gate_up_proj` [E, 2N, K], `down_proj` [E, K, N] | transformers 5.x fused experts (Qwen3-MoE, Mixtral, ...) | [out, in] |
| `gate_up_proj` [E, K, 2N], `down_proj` [E, N, K] | transformers `is_transposed=True` (gpt-oss, Llama4) | [in, out] |
| `up_proj`, `down_proj` (no gate_up_proj) | transformers fused non-gated | pass `transposed` |
| `gate_up_proj_blocks`, `gate_up_proj_scales`, `down_proj_*` | gpt-oss MXFP4 (see `mxfp4.py`) | [out, in] |

Verified against transformers 5.23: `MixtralExperts`/`Qwen3MoeExperts` declare `gate_up_proj`
[E, 2N, K] split by `.chunk(2, dim=-1)` (gate first) and `conversion_mapping.py` builds it by
concatenating per-expert w1/gate_proj then w3/up_proj along dim 1; `GptOssExperts` is decorated
`use_experts_implementation(is_concatenated=False, is_transposed=True, has_bias=True)`: `x @
gate_up_proj[e]` with gate = `[..., ::2]`, up = `[..., 1::2]`. Llama4 is transposed but concatenated,
so the interleave cannot be read from shapes: pass `interleaved_gate_up=True` for gpt-oss (the
`is_concatenated` flag of a transformers experts module says it). Orientation of a gated fused pair
is read from the shapes, which is unambiguous (both orientations would need N = 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from moe_core.quant import unquantized
from moe_core.weights._source import FLOAT_DTYPES, CheckpointError, TensorSource, expert_ids, join_key
from moe_core.weights.canonical import ExpertWeights

__all__ = ["deinterleave_gate_up", "experts_from_state_dict", "unquantized_experts_from_source"]


def experts_from_state_dict(tensors: Mapping[str, torch.Tensor], prefix: str, num_experts: int, *,
                            interleaved_gate_up: bool = False, transposed: bool | None = None,
                            experts: Sequence[int] | None = None,
                            dtype: torch.dtype | None = None) -> ExpertWeights:
    """One MoE layer's experts (any layout in the module table) as canonical `ExpertWeights`.

    tensors: name -> tensor (a model's state_dict, or a lazy safetensors mapping).
    prefix: the experts module's name, with or without the trailing dot.
    num_experts: global experts of the layer; fused tensors must have exactly this many.
    interleaved_gate_up: fused `gate_up_proj` rows alternate gate, up (gpt-oss); else gate then up.
    transposed: fused tensors are [in, out]; None reads it from the shapes (gated layouts only).
    experts: the expert ids to keep, in order (expert parallelism); default all.
    dtype: cast floats to this dtype; default keep the checkpoint's (all tensors must agree).
    MXFP4 keys (`*_blocks`) return MXFP4 weights (see `moe_core.weights.mxfp4`), never dequantized.
    """
    return unquantized_experts_from_source(
        TensorSource(tensors, "state dict"), prefix, num_experts, interleaved_gate_up=interleaved_gate_up,
        transposed=transposed, experts=experts, dtype=dtype)


def unquantized_experts_from_source(source: TensorSource, prefix: str, num_experts: int, *,
                                    interleaved_gate_up: bool = False, transposed: bool | None = None,
                                    experts: Sequence[int] | None = None,
                                    dtype: torch.dtype | None = None) -> ExpertWeights:
    """`experts_from_state_dict` over a `TensorSource` (used by the directory loader)."""
    ids = expert_ids(num_experts, experts)
    if join_key(prefix, "gate_up_proj_blocks") in source:
        from moe_core.weights.mxfp4 import gpt_oss_mxfp4_experts

        return gpt_oss_mxfp4_experts(source, prefix, num_experts, experts=ids)
    if join_key(prefix, "gate_up_proj") in source:
        return _fused(source, prefix, num_experts, ids, gated=True, interleaved=interleaved_gate_up,
                      transposed=transposed, dtype=dtype)
    if join_key(prefix, "up_proj") in source and join_key(prefix, "down_proj") in source:
        return _fused(source, prefix, num_experts, ids, gated=False, interleaved=False,
                      transposed=transposed, dtype=dtype)
    for gate, up, down in (("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj")):
        if join_key(prefix, f"{ids[0]}.{down}.weight") in source:
            gated = gate == "w1" or join_key(prefix, f"{ids[0]}.{gate}.weight") in source
            return _per_expert(source, prefix, ids, gate if gated else None, up, down, dtype)
    raise CheckpointError(
        f"{source.what}: no expert weights under {prefix!r}: expected '{join_key(prefix, 'gate_up_proj')}' "
        f"(+ 'down_proj'), '{join_key(prefix, f'{ids[0]}.w1.weight')}' (Mixtral), "
        f"'{join_key(prefix, f'{ids[0]}.gate_proj.weight')}' or '{join_key(prefix, 'gate_up_proj_blocks')}' (gpt-oss)")


def deinterleave_gate_up(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows gate0, up0, gate1, up1, ... along `dim` -> gate rows then up rows (canonical w13)."""
    if t.shape[dim] % 2:
        raise CheckpointError(f"interleaved gate/up dimension {dim} has odd size {t.shape[dim]}")
    pairs = t.unflatten(dim, (-1, 2))
    return torch.cat((pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)), dim)


def _result_dtype(found: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None, what: str) -> torch.dtype:
    if dtype is not None:
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype={dtype} is invalid: expected bfloat16, float16 or float32")
        return dtype
    dtypes = {t.dtype for _, t in found}
    if len(dtypes) != 1:
        listing = ", ".join(f"{k}: {t.dtype}" for k, t in found)
        raise CheckpointError(f"{what}: expert tensors have mixed dtypes ({listing}); pass dtype= to cast them")
    return dtypes.pop()


def _fused(source: TensorSource, prefix: str, num_experts: int, ids: list[int], *, gated: bool,
           interleaved: bool, transposed: bool | None, dtype: torch.dtype | None) -> ExpertWeights:
    first_name = "gate_up_proj" if gated else "up_proj"
    k_first, k_down = join_key(prefix, first_name), join_key(prefix, "down_proj")
    first = source.get_float(k_first, (num_experts, None, None))
    down = source.get_float(k_down, (num_experts, None, None))
    (_, a, b), (_, c, d) = first.shape, down.shape
    mult = 2 if gated else 1
    if transposed is None:
        if not gated:
            raise CheckpointError(f"{source.what}: non-gated fused experts {k_first!r} {list(first.shape)} and "
                                  f"{k_down!r} {list(down.shape)}: orientation cannot be read from shapes; "
                                  "pass transposed=True ([in, out]) or False ([out, in])")
        transposed = b == 2 * c and a == d
    if transposed:
        K, N = a, c
        want_first, want_down = (num_experts, K, mult * N), (num_experts, N, K)
    else:
        K, N = b, d
        want_first, want_down = (num_experts, mult * N, K), (num_experts, K, N)
    if tuple(first.shape) != want_first or tuple(down.shape) != want_down:
        raise CheckpointError(
            f"{source.what}: fused experts {k_first!r} {list(first.shape)} and {k_down!r} {list(down.shape)} "
            f"do not pair up: expected {list(want_first)} and {list(want_down)} "
            f"({'[in, out]' if transposed else '[out, in]'}, {'2N' if gated else 'N'} rows for w13)")
    found = [(k_first, first), (k_down, down)]
    bias_keys = (join_key(prefix, f"{first_name}_bias"), join_key(prefix, "down_proj_bias"))
    biases = None
    if any(k in source for k in bias_keys):
        biases = (source.get_float(bias_keys[0], (num_experts, mult * N)),
                  source.get_float(bias_keys[1], (num_experts, K)))
        found += list(zip(bias_keys, biases))
    out_dtype = _result_dtype(found, dtype, source.what)
    if list(ids) == list(range(num_experts)):  # every expert in order: views, no copy (fuse() of a large model)
        w13, w2 = first, down
        b13, b2 = biases if biases is not None else (None, None)
    else:
        sel = torch.tensor(ids, device=first.device)  # the tensors may live on an accelerator (fuse on cuda)
        w13, w2 = first.index_select(0, sel), down.index_select(0, sel)
        b13, b2 = (biases[0].index_select(0, sel), biases[1].index_select(0, sel)) if biases is not None \
            else (None, None)
    if transposed:
        w13, w2 = w13.transpose(1, 2), w2.transpose(1, 2)
    if interleaved:
        if not gated:
            raise ValueError("interleaved_gate_up=True needs a gated layout (gate_up_proj)")
        w13 = deinterleave_gate_up(w13, 1)
        b13 = deinterleave_gate_up(b13, 1) if b13 is not None else None
    return _weights(w13, w2, b13, b2, out_dtype)


def _per_expert(source: TensorSource, prefix: str, ids: list[int], gate: str | None, up: str, down: str,
                dtype: torch.dtype | None) -> ExpertWeights:
    names = ([gate] if gate else []) + [up, down]
    k0 = {n: join_key(prefix, f"{ids[0]}.{n}.weight") for n in names}
    first_down = source.get_float(k0[down], (None, None))
    K, N = first_down.shape
    want = {n: (N, K) for n in names}
    want[down] = (K, N)
    has_bias = join_key(prefix, f"{ids[0]}.{down}.bias") in source
    found, w13s, w2s, b13s, b2s = [], [], [], [], []
    for e in ids:
        ws = {}
        for n in names:
            key = join_key(prefix, f"{e}.{n}.weight")
            ws[n] = source.get_float(key, want[n])
            found.append((key, ws[n]))
            if has_bias:
                bkey = join_key(prefix, f"{e}.{n}.bias")
                ws[f"{n}.bias"] = source.get_float(bkey, (want[n][0],))
                found.append((bkey, ws[f"{n}.bias"]))
        w13s.append(torch.cat([ws[n] for n in names[:-1]], 0))
        w2s.append(ws[down])
        if has_bias:
            b13s.append(torch.cat([ws[f"{n}.bias"] for n in names[:-1]], 0))
            b2s.append(ws[f"{down}.bias"])
    out_dtype = _result_dtype(found, dtype, source.what)
    b13 = torch.stack(b13s) if has_bias else None
    b2 = torch.stack(b2s) if has_bias else None
    return _weights(torch.stack(w13s), torch.stack(w2s), b13, b2, out_dtype)


def _weights(w13: torch.Tensor, w2: torch.Tensor, b13: torch.Tensor | None, b2: torch.Tensor | None,
             dtype: torch.dtype) -> ExpertWeights:
    # Unquantized weights carry the BF16 key by convention (see `moe_core.quant.unquantized`);
    # the tensors' own dtype is the layer dtype.
    def cast(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(dtype).contiguous()

    return ExpertWeights(unquantized().weight, cast(w13), cast(w2), w13_bias=cast(b13), w2_bias=cast(b2))
