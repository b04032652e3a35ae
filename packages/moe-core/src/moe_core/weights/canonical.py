"""`ExpertWeights`: the one canonical form every checkpoint reader produces and every backend reads.

Layout (E = local experts, R = w13 rows = 2N gated (gate rows, then up rows) or N, K = hidden):

| key dtype | w13 | w2 |
|---|---|---|
| bf16/fp16/fp32 | float [E, R, K] | float [E, K, N] |
| int8 | uint8 codes [E, R, K] | uint8 [E, K, N] |
| int4 | uint8 [E, R, K/2], two codes per byte, even k low | uint8 [E, K, N/2] |
| fp8e4m3 | float8_e4m3fn [E, R, K] | float8_e4m3fn [E, K, N] |
| fp4e2m1 (MXFP4) | uint8 [E, R, K/2] packed like int4 | uint8 [E, K, N/2] |

Scales per granularity (shown for w13; w2 alike with (K, N)): TENSOR fp32 [E]; CHANNEL [E, R];
GROUP [E, R, K/g] (e8m0 as uint8 biased exponents); BLOCK fp32 [E, ceil(R/br), ceil(K/bc)].
Integer zero points: uint8 codes shaped like the scales; float zero points: floats shaped like the
scales. g_idx (act-order): int32 [E, K] for w13 (one grouping for all its rows) or, for gated layers
whose gate and up rows were calibrated apart, [E, 2, K] (gate's, then up's); [E, N] for w2.
Biases: [E, R] and [E, K].
Dequantization: value = (code - zero) * scale, zero = 2**(bits-1) when symmetric.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch

from moe_core._progress import LoggedProgress
from moe_core.config import MoEConfig
from moe_core.quant import Granularity, MoEQuantConfig, QuantDType, QuantKey, ZeroPoint
from moe_core.weights.packing import decode_e2m1, decode_e8m0, encode_e2m1, pack_int4, unpack_int4

__all__ = ["ExpertWeights", "quantize_expert_tensor"]

_log = logging.getLogger(__name__)

_FP8_MAX = 448.0
# Largest code magnitude of the float value types (integer types: from bits and zero point).
_LARGEST_CODE = {QuantDType.FP4_E2M1: 6, QuantDType.FP8_E4M3: 448}


@dataclass(frozen=True, eq=False)
class ExpertWeights:
    key: QuantKey  # the weight key; fixes the meaning of every tensor below
    w13: torch.Tensor  # [E, R, K] in the key's storage (see the module table)
    w2: torch.Tensor  # [E, K, N] likewise
    w13_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None
    w13_zero: torch.Tensor | None = None  # only with ZeroPoint.INTEGER / FLOAT
    w2_zero: torch.Tensor | None = None
    # Only with act_order: int32 group of each input channel. [E, K] when all of w13's rows share one
    # grouping; [E, 2, K] (gate rows' grouping, then up rows') for gated layers whose halves may
    # differ. Readers give [E, K] whenever every expert's halves agree; backends accept both.
    w13_g_idx: torch.Tensor | None = None
    w2_g_idx: torch.Tensor | None = None  # int32 [E, N]
    w13_bias: torch.Tensor | None = None  # [E, R]
    w2_bias: torch.Tensor | None = None  # [E, K]

    # ---- shape facts ----------------------------------------------------------------------

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.w2.shape[1]

    @property
    def w13_rows(self) -> int:
        return self.w13.shape[1]

    @property
    def intermediate_size(self) -> int:
        n = self.w2.shape[2]
        return n * 2 if self.key.dtype in (QuantDType.INT4, QuantDType.FP4_E2M1) else n

    @property
    def has_bias(self) -> bool:
        return self.w13_bias is not None

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "key" and getattr(self, f.name) is not None}

    def narrow(self, start: int, length: int) -> ExpertWeights:
        """Experts [start, start + length) as views (no copy)."""
        return dataclasses.replace(self, **{k: v.narrow(0, start, length) for k, v in self.tensors().items()})

    def to(self, device: torch.device | str, copy: bool = False) -> ExpertWeights:
        """On `device`; `copy=True` copies even tensors already there (no aliasing of the caller's)."""
        return dataclasses.replace(self, **{k: v.to(device, copy=copy) for k, v in self.tensors().items()})

    # ---- validation -----------------------------------------------------------------------

    def validate(self, config: MoEConfig, quant: MoEQuantConfig | None = None) -> None:
        """Raise ValueError naming the first tensor whose shape or dtype does not fit `config`, or whose
        scales would overflow the layer dtype."""
        key = self.key
        if quant is not None and quant.weight != key:
            raise ValueError(f"ExpertWeights hold {key} weights but the layer was built for {quant.weight}")
        E, R, K, N = config.num_local_experts, config.w13_rows, config.hidden_size, config.intermediate_size_per_partition
        packed = key.dtype in (QuantDType.INT4, QuantDType.FP4_E2M1)
        want_dtype = {
            QuantDType.INT4: torch.uint8, QuantDType.INT8: torch.uint8, QuantDType.FP4_E2M1: torch.uint8,
            QuantDType.FP8_E4M3: torch.float8_e4m3fn,
        }.get(key.dtype)
        for name, rows, cols in (("w13", R, K), ("w2", K, N)):
            t = getattr(self, name)
            if packed and cols % 2:
                raise ValueError(f"{name}: input dimension {cols} must be even for 4-bit packing")
            shape = (E, rows, cols // 2 if packed else cols)
            _expect(name, t, shape, want_dtype, "float" if want_dtype is None else None)
            self._validate_scales(name, rows, cols, config.activation.gated, config.dtype)
        if config.has_bias != self.has_bias or (self.w13_bias is None) != (self.w2_bias is None):
            raise ValueError(f"config.has_bias={config.has_bias} but w13_bias is "
                             f"{'set' if self.w13_bias is not None else 'None'} and w2_bias is "
                             f"{'set' if self.w2_bias is not None else 'None'}")
        if self.has_bias:
            _expect("w13_bias", self.w13_bias, (E, R), None, "float")
            _expect("w2_bias", self.w2_bias, (E, K), None, "float")

    def _validate_scales(self, name: str, rows: int, cols: int, gated: bool, dtype: torch.dtype) -> None:
        key, E = self.key, self.w13.shape[0]
        scale, zero, g_idx = (getattr(self, f"{name}_{s}") for s in ("scale", "zero", "g_idx"))
        if not key.quantized:
            for role, t in (("scale", scale), ("zero", zero), ("g_idx", g_idx)):
                if t is not None:
                    raise ValueError(f"{name}_{role}: unquantized weights take no {role}")
            return
        spec = key.scale
        g = spec.granularity
        if g is Granularity.TENSOR:
            sshape = (E,)
        elif g is Granularity.CHANNEL:
            sshape = (E, rows)
        elif g is Granularity.GROUP:
            if cols % spec.group_size:
                raise ValueError(f"{name}: group size {spec.group_size} does not divide its input dimension {cols}")
            sshape = (E, rows, cols // spec.group_size)
        elif g is Granularity.BLOCK:
            br, bc = spec.block_shape
            sshape = (E, -(-rows // br), -(-cols // bc))
        else:
            raise ValueError(f"{name}_scale: {g.value} granularity is for activations, not weights")
        _expect(f"{name}_scale", scale, sshape, torch.uint8 if spec.dtype == "e8m0" else None,
                None if spec.dtype == "e8m0" else "float")
        self._refuse_overflowing_scales(name, dtype)
        if key.zero_point is ZeroPoint.INTEGER:
            _expect(f"{name}_zero", zero, sshape, torch.uint8, None)
        elif key.zero_point is ZeroPoint.FLOAT:
            _expect(f"{name}_zero", zero, sshape, None, "float")
        elif zero is not None:
            raise ValueError(f"{name}_zero: the key {key} has no zero points but a tensor was given")
        if key.act_order:
            per_half = name == "w13" and gated and g_idx is not None and g_idx.dim() == 3
            _expect(f"{name}_g_idx", g_idx, (E, 2, cols) if per_half else (E, cols), torch.int32, None)
            ngroups = sshape[2]
            if bool((g_idx < 0).any()) or bool((g_idx >= ngroups).any()):
                raise ValueError(f"{name}_g_idx: values must lie in [0, {ngroups})")
        elif g_idx is not None:
            raise ValueError(f"{name}_g_idx: the key {key} has no act-order but g_idx was given")

    def _refuse_overflowing_scales(self, name: str, dtype: torch.dtype) -> None:
        """Scales whose largest weight (code times scale) exceeds what the layer dtype holds would make
        every output those experts touch Inf or NaN with no error (e8m0 byte 254 is 2**127): refuse
        them, naming the experts. One reduction per scale tensor, at load."""
        key, scale = self.key, getattr(self, f"{name}_scale")
        if key.zero_point is ZeroPoint.FLOAT or scale.is_meta or scale.numel() == 0:
            return  # float zeros add to the product: no bound from the scale alone
        largest = torch.finfo(dtype).max
        code = _LARGEST_CODE.get(key.dtype) or (
            (1 << key.bits) - 1 if key.zero_point is ZeroPoint.INTEGER else 1 << (key.bits - 1))
        e8m0 = key.scale.dtype == "e8m0"
        flat = scale.reshape(scale.shape[0], -1)  # TENSOR scales are [E]
        per_expert = flat.amax(1) if e8m0 else flat.float().abs().amax(1)
        if e8m0:
            limit = 127 + math.floor(math.log2(largest / code))  # the largest byte whose product fits
            bad = (per_expert > limit) & (per_expert != 0xFF)  # 0xFF (NaN) is refused as NaN at load
            accepted = f"e8m0 bytes <= {limit} (scales <= 2**{limit - 127})"
        else:
            bad = (per_expert * code > largest) & per_expert.isfinite()  # NaN and Inf: refused as such at load
            accepted = f"|scale| <= {largest / code:.4g}"
        experts = bad.nonzero().flatten().tolist()
        if experts:
            shown = ", ".join(map(str, experts[:8])) + (f" and {len(experts) - 8} more" if len(experts) > 8 else "")
            found = f"byte {int(per_expert[experts[0]])}" if e8m0 else f"{float(per_expert[experts[0]]):.4g}"
            dtype_name = str(dtype).removeprefix("torch.")
            raise ValueError(f"ExpertWeights.{name}_scale: experts {shown} have scales (expert {experts[0]}: up to "
                             f"{found}) whose product with the largest {key.dtype.value} code ({code}) exceeds the "
                             f"largest {dtype_name} value {largest:.4g}: their outputs would be Inf or NaN. Accepted "
                             f"for a {dtype_name} layer: {accepted}")

    # ---- dequantization -------------------------------------------------------------------

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 (w13 [E, R, K], w2 [E, K, N]): the values every backend must reproduce."""
        return (self._dequantize("w13"), self._dequantize("w2"))

    def _dequantize(self, name: str) -> torch.Tensor:
        key = self.key
        codes = getattr(self, name)
        if not key.quantized:
            return codes.float()
        scale, zero, g_idx = (getattr(self, f"{name}_{s}") for s in ("scale", "zero", "g_idx"))
        if key.dtype is QuantDType.FP4_E2M1:
            values = decode_e2m1(codes)
        elif key.dtype is QuantDType.INT4:
            values = unpack_int4(codes).float()
        else:
            values = codes.float()
        rows, cols = values.shape[1], values.shape[2]
        scale_f = decode_e8m0(scale) if key.scale.dtype == "e8m0" else scale.float()
        s = _expand(scale_f, key, rows, cols, g_idx)
        if key.zero_point is ZeroPoint.INTEGER:
            return (values - _expand(zero.float(), key, rows, cols, g_idx)) * s
        values = (values - key.code_offset) * s
        if key.zero_point is ZeroPoint.FLOAT:
            values = values + _expand(zero.float(), key, rows, cols, g_idx)
        return values

    # ---- construction ---------------------------------------------------------------------

    @staticmethod
    def from_float(w13: torch.Tensor, w2: torch.Tensor, quant: MoEQuantConfig,
                   w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None,
                   g_idx: tuple[torch.Tensor, torch.Tensor] | None = None,
                   dtype: torch.dtype = torch.bfloat16) -> ExpertWeights:
        """Quantize float weights (w13 [E, R, K], w2 [E, K, N]) to `quant`'s weight key.

        Unquantized keys cast to `dtype`. For act-order keys `g_idx` gives (w13 [E, K] or per half
        [E, 2, K], w2 [E, N]).
        """
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"from_float: dtype={dtype!r} is invalid: expected the float dtype of unquantized weights "
                             "(torch.bfloat16, torch.float16 or torch.float32)")
        for name, w in (("w13", w13), ("w2", w2)):
            if not isinstance(w, torch.Tensor) or w.dim() != 3 or not w.dtype.is_floating_point:
                got = f"{w.dtype} {list(w.shape)}" if isinstance(w, torch.Tensor) else type(w).__name__
                raise ValueError(f"from_float: {name} must be a float tensor [experts, out, in] (w13 [E, R, K], "
                                 f"w2 [E, K, N]), got {got}; one expert's matrix needs a leading expert dimension "
                                 "(unsqueeze(0))")
        if w13.shape[0] != w2.shape[0] or w13.shape[2] != w2.shape[1]:
            raise ValueError(f"from_float: w13 {list(w13.shape)} and w2 {list(w2.shape)} disagree: expected w13 "
                             "[E, R, K] and w2 [E, K, N] with the same E and K")
        key = quant.weight
        fields: dict[str, torch.Tensor | None] = {"w13_bias": w13_bias, "w2_bias": w2_bias}
        for i, (name, w) in enumerate((("w13", w13), ("w2", w2))):
            if not key.quantized:
                fields[name] = w.to(dtype)
                continue
            gi = g_idx[i] if (key.act_order and g_idx is not None) else None
            if key.act_order and gi is None:
                raise ValueError("from_float: act-order keys need g_idx=(w13_g_idx [E, K], w2_g_idx [E, N])")
            E, cols = w.shape[0], w.shape[2]
            shapes = [(E, cols), (E, 2, cols)] if name == "w13" else [(E, cols)]
            if gi is not None and (not isinstance(gi, torch.Tensor) or tuple(gi.shape) not in shapes
                                   or gi.dtype.is_floating_point):
                got = f"{gi.dtype} {list(gi.shape)}" if isinstance(gi, torch.Tensor) else type(gi).__name__
                raise ValueError(f"from_float: {name}_g_idx must be an integer tensor of shape "
                                 f"{' or '.join(str(list(s)) for s in shapes)} (one group per input channel), "
                                 f"got {got}")
            if name == "w13" and gi is not None and gi.dim() == 3:  # each half quantized by its own grouping
                halves = [_quantize_by_expert(part, key, gi[:, h]) for h, part in enumerate(w.chunk(2, dim=1))]
                codes, scale, zero = (None if parts[0] is None else torch.cat(parts, 1) for parts in zip(*halves))
            else:
                codes, scale, zero = _quantize_by_expert(w, key, gi)
            fields.update({name: codes, f"{name}_scale": scale, f"{name}_zero": zero, f"{name}_g_idx": gi})
        return ExpertWeights(key, **fields)

    @staticmethod
    def random(config: MoEConfig, quant: MoEQuantConfig, seed: int = 0,
               progress: Callable[[int, int], None] | None = None,
               device: torch.device | str = "cpu") -> ExpertWeights:
        """Weights of `config`'s real shape, drawn N(0, 1/fan_in) and quantized expert by expert.

        Memory stays near the final size: one expert is drawn in fp32 at a time and written into
        the result. `progress(done, total)` is called after each expert (default: a line at INFO on
        the "moe_core" logger every few seconds, see `moe_core._progress`). `device`: where they are
        drawn and quantized, and live (a GPU draws a real-shape layer in a fraction of the CPU's
        time); one seed draws other weights on another kind of device.
        """
        if not isinstance(config, MoEConfig):
            raise TypeError(f"ExpertWeights.random: config must be a MoEConfig, got {type(config).__name__}")
        if not isinstance(quant, MoEQuantConfig):
            raise TypeError(f"ExpertWeights.random: quant must be a MoEQuantConfig (moe_core.quant's factories; "
                            f"unquantized() for float weights), got {quant!r}")
        # torch.Generator takes 64-bit seeds; past that, or a float, it failed with torch's own message
        try:
            index = operator.index(seed) if not isinstance(seed, bool) else None
        except TypeError:
            index = None
        if index is None or not -(2**63) <= index < 2**64:
            raise ValueError(f"ExpertWeights.random: seed={seed!r} is invalid: expected an int in [-2**63, 2**64)")
        seed = index
        E, R, K, N = config.num_local_experts, config.w13_rows, config.hidden_size, config.intermediate_size_per_partition
        if torch.device(device).type == "meta":
            raise ValueError("ExpertWeights.random: device='meta' holds no values; draw them on the CPU or an "
                             "accelerator")
        if progress is None:
            progress = LoggedProgress(_log, f"drawing random {quant.name} weights of {E} experts")
        gen = torch.Generator(device=device).manual_seed(seed)
        draw = functools.partial(torch.randn, generator=gen, device=gen.device)
        fields: dict[str, torch.Tensor] = {}
        for e in range(E):
            w13 = draw(1, R, K) * K ** -0.5
            w2 = draw(1, K, N) * N ** -0.5
            b13 = draw(1, R) * 0.1 if config.has_bias else None
            b2 = draw(1, K) * 0.1 if config.has_bias else None
            gi = None
            if quant.weight.act_order:
                g = quant.weight.group_size
                gi = (_random_g_idx(K, g, gen).unsqueeze(0), _random_g_idx(N, g, gen).unsqueeze(0))
            bias_dtype = config.dtype if config.has_bias else None
            part = ExpertWeights.from_float(
                w13, w2, quant, b13.to(bias_dtype) if b13 is not None else None,
                b2.to(bias_dtype) if b2 is not None else None, gi, dtype=config.dtype)
            if not fields:  # the result's tensors, filled expert by expert (no second copy to stack)
                fields = {name: t.new_empty((E, *t.shape[1:])) for name, t in part.tensors().items()}
            for name, t in part.tensors().items():
                fields[name][e] = t[0]
            progress(e + 1, E)
        return ExpertWeights(quant.weight, **fields)

    @staticmethod
    def stack(parts: list[ExpertWeights]) -> ExpertWeights:
        """Concatenate per-expert (or per-shard) weights along the expert dimension."""
        if not parts:
            raise ValueError("ExpertWeights.stack: no parts")
        if not all(isinstance(p, ExpertWeights) for p in parts):
            kinds = sorted({type(p).__name__ for p in parts if not isinstance(p, ExpertWeights)})
            raise TypeError(f"ExpertWeights.stack takes a list of ExpertWeights, got {', '.join(kinds)}")
        key = parts[0].key
        if any(p.key != key for p in parts):
            raise ValueError("ExpertWeights.stack: parts have different quantization keys")
        fields = {}
        for f in dataclasses.fields(ExpertWeights):
            if f.name == "key":
                continue
            ts = [getattr(p, f.name) for p in parts]
            if f.name == "w13_g_idx" and len({t.dim() for t in ts if t is not None}) > 1:
                ts = [_per_half(t) for t in ts]  # one part's halves differ: every part in the [E, 2, K] form
            if all(t is None for t in ts):
                continue
            if any(t is None for t in ts):
                raise ValueError(f"ExpertWeights.stack: {f.name} is set on some parts but not others")
            first = ts[0]
            for i, t in enumerate(ts):  # torch.cat would promote a dtype silently
                if (t.shape[1:], t.dtype, t.device) != (first.shape[1:], first.dtype, first.device):
                    raise ValueError(f"ExpertWeights.stack: {f.name} of part {i} is {t.dtype} {list(t.shape)} on "
                                     f"{t.device}, of part 0 {first.dtype} {list(first.shape)} on {first.device}; "
                                     "parts may differ in the expert dimension only")
            fields[f.name] = torch.cat(ts, 0)
        return ExpertWeights(key, **fields)


def _expect(name: str, t: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype | None,
            kind: str | None) -> None:
    if t is None:
        raise ValueError(f"{name} is missing: expected a tensor of shape {list(shape)}")
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {list(t.shape)}, expected {list(shape)}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}, expected {dtype}")
    if kind == "float" and not t.dtype.is_floating_point:
        raise ValueError(f"{name} has dtype {t.dtype}, expected a floating-point dtype")


def _expand(per_group: torch.Tensor, key: QuantKey, rows: int, cols: int,
            g_idx: torch.Tensor | None) -> torch.Tensor:
    """Broadcast scales or zeros [E, ...] to the weight's [E, rows, cols]."""
    g = key.scale.granularity
    E = per_group.shape[0]
    if g is Granularity.TENSOR:
        return per_group.view(E, 1, 1)
    if g is Granularity.CHANNEL:
        return per_group.view(E, rows, 1)
    if g is Granularity.GROUP:
        if g_idx is not None:
            if g_idx.dim() == 3:  # per half: gate rows take g_idx[:, 0], up rows g_idx[:, 1]
                index = g_idx.long().repeat_interleave(rows // 2, dim=1)
            else:
                index = g_idx.long().unsqueeze(1).expand(E, rows, cols)
            return torch.gather(per_group, 2, index)
        return per_group.repeat_interleave(key.scale.group_size, dim=2)
    br, bc = key.scale.block_shape
    return per_group.repeat_interleave(br, 1).repeat_interleave(bc, 2)[:, :rows, :cols]


def _per_half(g_idx: torch.Tensor | None) -> torch.Tensor | None:
    """A w13 g_idx in the per-half form [E, 2, K]."""
    return g_idx.unsqueeze(1).expand(-1, 2, -1).contiguous() if g_idx is not None and g_idx.dim() == 2 else g_idx


def _random_g_idx(k: int, group_size: int, gen: torch.Generator) -> torch.Tensor:
    """An act-order assignment: each group still holds `group_size` channels, in shuffled positions."""
    return (torch.randperm(k, generator=gen, device=gen.device) // group_size).to(torch.int32)


def _quantize_by_expert(w: torch.Tensor, key: QuantKey, g_idx: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`quantize_expert_tensor` one expert at a time into preallocated outputs (every scale is per
    expert, so the result is the same): its fp32 temporaries are one expert's, not the layer's, which
    bounds `fuse(quant=...)`'s peak memory."""
    first = quantize_expert_tensor(w[:1], key, None if g_idx is None else g_idx[:1])
    outs = tuple(None if t is None else t.new_empty((w.shape[0], *t.shape[1:])) for t in first)
    for e in range(w.shape[0]):
        parts = first if e == 0 else quantize_expert_tensor(w[e:e + 1], key, None if g_idx is None else g_idx[e:e + 1])
        for out, part in zip(outs, parts):
            if out is not None:
                out[e:e + 1] = part
    return outs


def quantize_expert_tensor(w: torch.Tensor, key: QuantKey, g_idx: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Round-to-nearest quantization of float w [E, rows, cols] to `key`: (codes, scale, zero).

    Used for tests, benchmarks and random weights; real checkpoints come through the readers.
    """
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        got = list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"quantize_expert_tensor: w must be [experts, rows, cols], got {got}")
    w = w.float()
    E, rows, cols = w.shape
    spec = key.scale
    if key.dtype is QuantDType.FP8_E4M3:
        if spec.granularity is Granularity.TENSOR:
            amax = w.abs().amax(dim=(1, 2))
        elif spec.granularity is Granularity.CHANNEL:
            amax = w.abs().amax(dim=2)
        elif spec.granularity is Granularity.BLOCK:
            br, bc = spec.block_shape
            pr, pc = -rows % br, -cols % bc
            wp = torch.nn.functional.pad(w.abs(), (0, pc, 0, pr))
            amax = wp.view(E, (rows + pr) // br, br, (cols + pc) // bc, bc).amax(dim=(2, 4))
        else:
            raise ValueError(f"fp8 weights with {spec.granularity.value} scales are not supported")
        scale = amax.clamp(min=1e-12) / _FP8_MAX
        codes = (w / _expand(scale, key, rows, cols, None)).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
        return codes, scale.float(), None

    if key.dtype is QuantDType.FP4_E2M1:
        g = spec.group_size
        if cols % g:
            raise ValueError(f"group size {g} does not divide the input dimension {cols}")
        blocks = w.view(E, rows, cols // g, g)
        amax = blocks.abs().amax(dim=-1).clamp(min=2.0 ** -126)
        # Largest e2m1 magnitude is 6 = 1.5 * 2**2: pick the exponent that keeps amax representable.
        exp = (torch.floor(torch.log2(amax)) - 2).clamp(-127, 127)
        codes = encode_e2m1(blocks / torch.exp2(exp).unsqueeze(-1)).view(E, rows, cols)
        return pack_int4(codes), (exp + 127).to(torch.uint8), None

    if key.dtype not in (QuantDType.INT4, QuantDType.INT8):
        raise ValueError(f"cannot quantize to {key}")
    bits = key.bits
    qmax = (1 << bits) - 1
    group = cols if spec.granularity is Granularity.CHANNEL else spec.group_size
    if cols % group:
        raise ValueError(f"group size {group} does not divide the input dimension {cols}")
    order = None
    if key.act_order:
        order = torch.argsort(g_idx.long(), dim=1, stable=True)  # channels sorted by group
        w = torch.gather(w, 2, order.unsqueeze(1).expand(E, rows, cols))
    blocks = w.reshape(E, rows, cols // group, group)
    scale_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    if key.zero_point is ZeroPoint.INTEGER:
        lo = blocks.amin(-1).clamp(max=0)
        hi = blocks.amax(-1).clamp(min=0)
        # Codes are computed against the scale as stored, so dequantization reproduces them exactly.
        scale = ((hi - lo) / qmax).clamp(min=1e-6).to(scale_dtype).float()
        zero = torch.round(-lo / scale).clamp(0, qmax)
        codes = torch.round(blocks / scale.unsqueeze(-1) + zero.unsqueeze(-1)).clamp(0, qmax)
    elif key.zero_point is ZeroPoint.NONE:
        half = 1 << (bits - 1)
        scale = (blocks.abs().amax(-1) / (half - 1)).clamp(min=1e-6).to(scale_dtype).float()
        zero = None
        codes = torch.round(blocks / scale.unsqueeze(-1)).clamp(-half, half - 1) + half
    else:
        raise ValueError("float zero points are read from checkpoints only; quantize_expert_tensor does not make them")
    codes = codes.reshape(E, rows, cols).to(torch.uint8)
    if order is not None:
        codes = torch.empty_like(codes).scatter_(2, order.unsqueeze(1).expand(E, rows, cols), codes)
    if spec.granularity is Granularity.CHANNEL:
        scale = scale.squeeze(-1)
        zero = zero.squeeze(-1) if zero is not None else None
    scale = scale.to(scale_dtype)
    if key.dtype is QuantDType.INT4:
        codes = pack_int4(codes)
    return codes, scale, zero.to(torch.uint8) if zero is not None else None
