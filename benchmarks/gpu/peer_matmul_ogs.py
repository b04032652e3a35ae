"""Peer benchmark (issue 47): OpenAI's triton_kernels `matmul_ogs` MXFP4 MoE, as vLLM 0.26.0 runs gpt-oss.

The peer is the triton_kernels copy vendored in the vLLM 0.26.0 wheel (vllm/third_party/triton_kernels,
"v3.5.1" in vLLM's words; benchmarks/gpu/extract_triton_kernels.sh takes it out), called the way
vLLM's TRITON MXFP4 backend calls it: weights transposed to [E, K, N] (reduction on dim 1), values
and scales in the device's default MXFP4 layouts (Hopper: HopperMXValueLayout and HopperMXScaleLayout
with mx_axis=1 and 8 warps, split_k pinned to 1 and the scale groups padded to a multiple of 4, as
vLLM's `_swizzle_mxfp4` does on capability 9.0), biases in fp32, w13's gate and up rows interleaved;
routing by triton_kernels' fused `routing()` (top-k of the logits, softmax over the k: the routing
of vLLM's legacy path without an expert map); then `matmul_ogs` with the gather indices and the
gpt-oss SwiGLU (alpha 1.702, limit 7.0) fused, and `matmul_ogs` with the scatter indices and the
routing weights as gammas (the top-k sum fused into the scatter).

Each preset's layer is drawn through this project's API (`ExpertWeights.random`, seed 0, MXFP4:
e2m1 codes, an e8m0 scale per 32, exactly the weights benchmarks/gpu/bench_layer.py --dtypes mxfp4
times) and converted here, so the same weights feed `moe_core.reference.reference_moe`. The whole
layer (routing + both matmul_ogs) is timed by bench_layer.py's protocol,
`moe_core.bench.time_cuda_layer`: CUDA graphs over 8 rotating input sets (2 above 512 tokens, the same
inputs as bench_layer.py), the L2 flushed before every replay, CUDA events, median; a layer that
cannot be captured is timed eagerly the same way and the row says so. floor = bench_layer.py's
roofline floor (`moe_core.bench.roofline_floor`: the experts the timed inputs' routing selects, MXFP4
bytes, ceilings measured in this run).

    python peer_matmul_ogs.py --triton-kernels DIR --out OUT [--preset ...] [--m ...] [--check]
                              [--layout vllm|strided] [--compile-only]

Presets beyond gpt-oss run where the kernels take their shape (K and N multiples of 32, a
power-of-two top-k), with what vLLM does not do noted on every row: a SiLU-gated layer gets
`silu(gate) * up` as a fused activation of our own (vLLM runs matmul_ogs only for gpt-oss's SwiGLU),
and a routing that `routing()` cannot compute (DeepSeek-V3's grouped sigmoid with a correction
bias) is computed by `moe_core.routing.route_torch`, its choices then sorted by triton_kernels'
`topk(y_indx=...)` + `routing_from_bitmatrix`. With --check every cell's output is compared with
`reference_moe` (fp32, dequantized weights) under the routing the peer chose: `err` = relative L2
error (as bench_layer.py's), `max_err` = max |out - ref| / max |ref|; the agreement of that routing
with this project's `route_torch` is reported too. Writes OUT/peer_matmul_ogs.json after every cell.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import triton
import triton.language as tl

from moe_core.config import ActivationKind, MoEConfig, RoutingMethod
from moe_core.quant import QuantDType
from moe_core.weights.canonical import ExpertWeights

ORIGIN = "vllm 0.26.0 third_party"
MX_BLOCK = 32
# Experts converted at a time: the Hopper value swizzle makes int32 temporaries of several times the
# codes' size, which for DeepSeek-V3's whole w13 (3.8 GB of codes) would not fit beside the layer.
CONVERT_CHUNK_EXPERTS = 16


# ---- triton_kernels on the path -----------------------------------------------------------------


def use_triton_kernels(path: str | Path) -> str:
    """Put the triton_kernels package at `path` (the package folder, or the folder holding it) first
    on sys.path and import it; returns its origin line (the ORIGIN file extract_triton_kernels.sh
    writes). Refuses a triton_kernels imported from anywhere else."""
    path = Path(path).resolve()
    package = path if (path / "matmul_ogs.py").is_file() else path / "triton_kernels"
    if not (package / "matmul_ogs.py").is_file():
        raise FileNotFoundError(
            f"{path}: no triton_kernels package (matmul_ogs.py) there or in triton_kernels/"
        )
    root = str(package.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module("triton_kernels")
    found = Path(module.__file__).resolve().parent
    if found != package:
        raise ImportError(f"triton_kernels was imported from {found}, not {package}")
    origin = package / "ORIGIN"
    return origin.read_text().strip() if origin.is_file() else f"{ORIGIN} (no ORIGIN file in {package})"


# ---- weights: canonical MXFP4 -> matmul_ogs --------------------------------------------------------


def interleave_gate_up(t: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Gate rows then up rows along `dim` (canonical w13) -> gate0, up0, gate1, up1, ... (the order
    the fused SwiGLU of matmul_ogs reads: gate in the even output columns)."""
    gate, up = t.chunk(2, dim)
    return torch.stack((gate, up), dim + 1).flatten(dim, dim + 1)


@dataclass(frozen=True)
class Layouts:
    """The triton_kernels layouts of MXFP4 weight values and scales, and vLLM's Hopper scale padding."""

    name: str
    value: type
    value_opts: dict
    scale: type
    scale_opts: dict
    pad_scale_groups: int = 1  # scale groups per row padded to a multiple of this
    constraints: dict = field(default_factory=dict)  # matmul_ogs opt_flags constraints vLLM sets


def strided_layouts() -> Layouts:
    """No swizzling (vLLM's choice on Hopper with torch < 2.8.1); what the Triton interpreter can run."""
    from triton_kernels.tensor_details.layout import StridedLayout

    return Layouts("strided", StridedLayout, {}, StridedLayout, {})


def hopper_layouts(num_warps: int = 8) -> Layouts:
    """vLLM's Hopper layouts (mx_axis=1: the reduction dimension of the [E, K, N] weight)."""
    from triton_kernels.tensor_details.layout import HopperMXScaleLayout, HopperMXValueLayout

    return Layouts(
        "hopper",
        HopperMXValueLayout,
        {"mx_axis": 1},
        HopperMXScaleLayout,
        {"mx_axis": 1, "num_warps": num_warps},
        pad_scale_groups=4,
        constraints={"split_k": 1},
    )


def vllm_layouts(device: torch.device) -> Layouts:
    """What vLLM 0.26.0's `_swizzle_mxfp4` picks on this CUDA device (torch >= 2.8.1)."""
    from triton_kernels.tensor_details import layout

    cap = torch.cuda.get_device_capability(device)
    value, value_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    scale, scale_opts = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    pad, constraints = 1, {}
    if cap == (9, 0):
        pad, constraints = 4, {"split_k": 1}
    elif cap[0] == 10:
        constraints = {"is_persistent": True, "epilogue_subtile": 1}
    return Layouts(
        f"vllm default for sm{cap[0]}{cap[1]}: {value.__name__} + {scale.__name__}",
        value,
        value_opts,
        scale,
        scale_opts,
        pad,
        constraints,
    )


def _convert(data: torch.Tensor, dtype, layout_cls: type, opts: dict, chunk: int | None):
    """triton_kernels Tensor of `data` (uint8 [E, rows, cols]) in `layout_cls`, converted `chunk` experts
    at a time (the swizzles act on the last two dimensions only)."""
    from triton_kernels.tensor import Storage, Tensor, convert_layout, wrap_torch_tensor

    E = data.shape[0]
    if chunk is None or chunk >= E:
        return convert_layout(wrap_torch_tensor(data, dtype=dtype), layout_cls, **opts)
    parts = [
        convert_layout(wrap_torch_tensor(data[i : i + chunk], dtype=dtype), layout_cls, **opts)
        for i in range(0, E, chunk)
    ]
    stored = [p.storage.data for p in parts]
    if stored[0].dim() >= 2 and not stored[0].is_contiguous() and stored[0].mT.is_contiguous():
        joined = torch.cat([s.mT for s in stored]).mT  # keep the swizzle's (transposed) strides
    else:
        joined = torch.cat(stored)
    # The layout as convert_layout would have made it for the whole tensor (it keeps the unswizzled shape).
    whole = layout_cls(torch.Size((E, *data.shape[1:])), **opts)
    return Tensor(Storage(joined, whole), dtype=parts[0].dtype, shape=[E, *parts[0].shape[1:]])


def to_matmul_ogs_mxfp4(
    codes: torch.Tensor, scales: torch.Tensor, layouts: Layouts, chunk: int | None = CONVERT_CHUNK_EXPERTS
):
    """Canonical MXFP4 (uint8 codes [E, rows, cols/2], even column in the low nibble; uint8 e8m0 scales
    [E, rows, cols/32]) -> (weight, scale) triton_kernels Tensors of the [E, cols, rows] matrix that
    matmul_ogs multiplies by (reduction over cols), as vLLM's `_swizzle_mxfp4` makes them."""
    from triton_kernels.tensor import FP4

    E, rows, half_cols = codes.shape
    if scales.shape != (E, rows, 2 * half_cols // MX_BLOCK):
        raise ValueError(f"scales {list(scales.shape)} do not match codes {list(codes.shape)}")
    pad = -scales.shape[-1] % layouts.pad_scale_groups
    if pad:
        scales = torch.nn.functional.pad(scales, (0, pad))
    w = _convert(codes.transpose(-2, -1), FP4, layouts.value, layouts.value_opts, chunk)
    s = _convert(scales.transpose(-2, -1), None, layouts.scale, layouts.scale_opts, chunk)
    return w, s


def dequantize_matmul_ogs(w, scale) -> torch.Tensor:
    """fp32 [E, cols, rows] of matmul_ogs MXFP4 (weight, scale) Tensors, through triton_kernels' own
    unswizzling and `upcast_from_mxfp_torch` (for checking a conversion)."""
    from triton_kernels.numerics_details.mxfp import upcast_from_mxfp_torch

    values = w.storage.layout.unswizzle_data(w.storage.data)
    scales = scale.storage.layout.unswizzle_data(scale.storage.data)
    K, N = w.shape[-2:]
    scales = scales[..., : K // MX_BLOCK, :N]  # the Hopper scale layout and vLLM's padding
    return upcast_from_mxfp_torch(values, scales, torch.float32, axis=1)


# ---- the peer layer -----------------------------------------------------------------------------


@triton.jit(repr=lambda _: "_silu_and_mul")
def _silu_and_mul(input):
    """silu(gate) * up over interleaved (gate, up) columns: matmul_ogs's fused-activation contract."""
    gate, up = tl.split(tl.reshape(input, (input.shape[0], input.shape[1] // 2, 2)))
    gate = gate.to(tl.float32)
    return gate / (1.0 + tl.exp(-gate)) * up.to(tl.float32)


def unsupported(config: MoEConfig) -> str | None:
    """Why the matmul_ogs MXFP4 path cannot run `config`, or None."""
    K, N, k = config.hidden_size, config.intermediate_size_per_partition, config.top_k
    if K % MX_BLOCK or N % MX_BLOCK:
        return f"K={K} and N={N} must be multiples of the MXFP4 block {MX_BLOCK}"
    if k & (k - 1):
        return f"top_k={k} is not a power of two (triton_kernels' topk and routing kernels need one)"
    act = config.activation
    if act.kind not in (ActivationKind.SWIGLU_OAI, ActivationKind.SILU) or act.clamp is not None:
        return f"activation {act} has no fused matmul_ogs form here (swiglu_oai and silu only)"
    if config.routing.weight_on_input or config.parallel.use_ep or config.parallel.tp_size > 1:
        return "routing weights on the input and parallel layers are not benchmarked"
    return None


class MatmulOgsMoE:
    """One MoE layer on matmul_ogs: `layer(hidden_states [M, K] bf16, router_logits [M, E])` -> [M, K]."""

    def __init__(
        self,
        config: MoEConfig,
        weights: ExpertWeights,
        layouts: Layouts,
        correction_bias: torch.Tensor | None = None,
    ):
        from triton_kernels.matmul_ogs import FlexCtx, FnSpecs, FusedActivation, PrecisionConfig
        from triton_kernels.numerics import InFlexData
        from triton_kernels.swiglu import swiglu_fn

        why = unsupported(config)
        if why:
            raise ValueError(why)
        if weights.key.dtype is not QuantDType.FP4_E2M1:
            raise ValueError(f"MXFP4 weights expected, got {weights.key}")
        self.config, self.layouts, self.correction_bias = config, layouts, correction_bias
        self.w13, w13_scale = to_matmul_ogs_mxfp4(
            interleave_gate_up(weights.w13), interleave_gate_up(weights.w13_scale), layouts
        )
        self.w2, w2_scale = to_matmul_ogs_mxfp4(weights.w2, weights.w2_scale, layouts)
        self.pc13 = PrecisionConfig(weight_scale=w13_scale, flex_ctx=FlexCtx(rhs_data=InFlexData()))
        self.pc2 = PrecisionConfig(weight_scale=w2_scale, flex_ctx=FlexCtx(rhs_data=InFlexData()))
        self.b13 = interleave_gate_up(weights.w13_bias).float().contiguous() if weights.has_bias else None
        self.b2 = weights.w2_bias.float().contiguous() if weights.has_bias else None
        act = config.activation
        if act.kind is ActivationKind.SWIGLU_OAI:  # vLLM's legacy (v3.5.1 API) form of gpt-oss's SwiGLU
            self.activation = FusedActivation(
                FnSpecs("swiglu", swiglu_fn, ("alpha", "limit")), (act.alpha, act.limit), 2
            )
        else:
            self.activation = FusedActivation(FnSpecs("silu_and_mul", _silu_and_mul, ()), (), 2)
        r = config.routing
        self.fused_routing = (
            r.method in (RoutingMethod.SOFTMAX_TOPK, RoutingMethod.SOFTMAX_TOPK_RENORM) and not r.features
        )

    def describe(self) -> dict:
        act, routing = self.config.activation, self.config.routing
        if self.fused_routing:
            how = "top-k of the logits, softmax over the k" if routing.renormalize else "softmax, then top-k"
            routed = f"triton_kernels.routing.routing(sm_first={not routing.renormalize}): {how}, as vLLM"
        else:
            routed = (
                f"moe_core.routing.route_torch ({routing}) in torch ops, then triton_kernels topk(y_indx=ids, "
                "apply_softmax=False) + routing_from_bitmatrix to sort by expert: routing() has no such "
                "scoring; not a vLLM path"
            )
        if act.kind is ActivationKind.SWIGLU_OAI:
            activation = f"triton_kernels swiglu_fn fused (alpha={act.alpha}, limit={act.limit}), as vLLM"
        else:
            activation = (
                "silu(gate) * up fused through matmul_ogs's FusedActivation (our jit function; vLLM runs "
                "matmul_ogs only for gpt-oss's SwiGLU)"
            )
        return {
            "routing": routed,
            "activation": activation,
            "layouts": self.layouts.name,
            "opt_flags_constraints": self.layouts.constraints,
            "bias": "fp32, both GEMMs" if self.b13 is not None else "none",
            "router_logits": "fp32 (bench_layer.py's inputs; vLLM's gpt-oss router emits bf16)",
            "notes": [
                *([] if self.fused_routing else ["routing not vLLM's (see routing)"]),
                *(
                    []
                    if act.kind is ActivationKind.SWIGLU_OAI
                    else ["activation not vLLM's (see activation)"]
                ),
            ],
        }

    def route(self, logits: torch.Tensor):
        """(RoutingData, GatherIndx, ScatterIndx) of router logits [M, E]."""
        from triton_kernels.routing import routing, routing_from_bitmatrix
        from triton_kernels.topk import topk

        cfg = self.config
        if self.fused_routing:
            return routing(logits, cfg.top_k, sm_first=not cfg.routing.renormalize)
        from moe_core.routing import route_torch

        weights, ids = route_torch(logits, cfg.routing, cfg.top_k, self.correction_bias)
        # int32 for topk: it packs its bitmatrix with 1 << (id % 32) in the ids' own type, which in
        # int16 loses every expert whose id % 32 is 16 or more; the sort takes int16 ids, as routing() gives.
        ids = ids.to(torch.int32)
        # topk with given ids reads x at them: x holds the weights there, so no softmax, values as chosen.
        x = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(
            1, ids.long(), weights
        )
        vals, ids, bitmatrix = topk(x, cfg.top_k, apply_softmax=False, y_indx=ids)
        return routing_from_bitmatrix(bitmatrix, vals, ids.to(torch.int16), cfg.num_experts, cfg.top_k)

    def experts(self, x: torch.Tensor, routing_data, gather, scatter) -> torch.Tensor:
        from triton_kernels.matmul_ogs import matmul_ogs

        M, K = x.shape
        k, N = self.config.top_k, self.config.intermediate_size_per_partition
        inter = torch.empty((1, M * k, N), dtype=x.dtype, device=x.device)
        out = torch.empty((1, M, K), dtype=x.dtype, device=x.device)
        matmul_ogs(
            x,
            self.w13,
            self.b13,
            routing_data,
            gather_indx=gather,
            precision_config=self.pc13,
            fused_activation=self.activation,
            y=inter,
        )
        matmul_ogs(
            inter.view(M * k, N),
            self.w2,
            self.b2,
            routing_data,
            scatter_indx=scatter,
            precision_config=self.pc2,
            gammas=routing_data.gate_scal,
            y=out,
        )
        return out.view(M, K)

    def __call__(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return self.experts(x, *self.route(logits))


def routing_topk(routing_data, gather, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights fp32 [M, k], expert ids int64 [M, k]) that a triton_kernels routing chose: row i of the
    expert-sorted order is choice gather.src_indx[i] (token * k + slot), of the expert whose count in
    expt_hist covers i, with weight gate_scal[i]."""
    k, E = routing_data.n_expts_act, routing_data.n_expts_tot
    hist = routing_data.expt_hist[:E].long()
    expert_of_row = torch.repeat_interleave(torch.arange(E, device=hist.device), hist)
    flat = gather.src_indx.long()[: tokens * k]
    if expert_of_row.numel() != tokens * k:
        raise RuntimeError(f"routing holds {expert_of_row.numel()} choices, expected {tokens} x {k}")
    ids = torch.empty(tokens * k, dtype=torch.long, device=hist.device)
    weights = torch.empty(tokens * k, dtype=torch.float32, device=hist.device)
    ids[flat] = expert_of_row
    weights[flat] = routing_data.gate_scal[: tokens * k].float()
    return weights.view(tokens, k), ids.view(tokens, k)


def check(layer: MatmulOgsMoE, weights: ExpertWeights, x: torch.Tensor, logits: torch.Tensor) -> dict:
    """The peer's output against moe_core's fp32 reference under the routing the peer chose, and that
    routing against moe_core's route_torch."""
    from moe_core.reference import reference_moe
    from moe_core.routing import route_torch

    cfg = layer.config
    routed = layer.route(logits)
    out = layer.experts(x, *routed).float()
    tw, ti = routing_topk(routed[0], routed[1], x.shape[0])
    ref = reference_moe(x, weights, cfg, tw, ti)
    ours_w, ours_i = route_torch(logits, cfg.routing, cfg.top_k, layer.correction_bias)
    ours_i, order = ours_i.long().sort(-1)
    ti, torder = ti.sort(-1)
    same = bool(torch.equal(ti, ours_i))
    return {
        "err": float((out - ref).norm() / ref.norm()),
        "max_err": float((out - ref).abs().max() / ref.abs().max()),
        "routing_same_experts": float((ti == ours_i).all(-1).float().mean()),
        "routing_max_weight_diff": float((tw.gather(1, torder) - ours_w.float().gather(1, order)).abs().max())
        if same
        else None,
    }


# ---- the benchmark ----------------------------------------------------------------------------------


def run(args) -> int:
    from layer_timing import correction_bias, input_sets, layer_quant, mhz, random_weights

    from moe_core.backends import detect_device
    from moe_core.bench import (
        SmClockSampler,
        mean_call_seconds,
        measure_ceilings,
        roofline_floor,
        routed_work,
        time_cuda_layer,
        write_json_atomic,
    )
    from moe_core.presets import get_preset

    origin = use_triton_kernels(args.triton_kernels)
    from triton_kernels.matmul_ogs_details import opt_flags

    dev = torch.device(args.device)
    info = detect_device(dev)
    layouts = vllm_layouts(dev) if args.layout == "vllm" and dev.type == "cuda" else strided_layouts()
    if layouts.constraints:
        opt_flags.update_opt_flags_constraints(layouts.constraints)
    if args.compile_only:
        return compile_only(args, layouts)
    ceilings = measure_ceilings(dev, torch.bfloat16)
    print(
        f"device {info.name}: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s, matmul "
        + ", ".join(f"{t} {r / 1e12:.0f}" for t, r in ceilings.matmul_flop_per_s.items())
        + f" TFLOP/s at {mhz(ceilings.matmul_sm_clock_mhz)}; "
        f"triton_kernels: {origin}; layouts: {layouts.name}",
        flush=True,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "peer_matmul_ogs.json"
    result = {
        "peer": "triton_kernels matmul_ogs MXFP4 (OpenAI), as vLLM 0.26.0 calls it for gpt-oss",
        "triton_kernels": ORIGIN,
        "triton_kernels_origin": origin,
        "device": info.name,
        "capability": list(info.capability or ()),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "layouts": layouts.name,
        "opt_flags_constraints": layouts.constraints,
        "ceilings": dataclasses.asdict(ceilings),
        "protocol": __doc__.split("\n\n")[2].replace("\n", " "),
        "rows": [],
    }
    rows = result["rows"]

    def add(row: dict) -> None:
        rows.append({"triton_kernels": ORIGIN, **row})
        write_json_atomic(path, result)

    for name in args.preset:
        preset = get_preset(name)
        cfg = preset.config
        why = unsupported(cfg)
        if why:
            add({"preset": name, "M": None, "skipped": why})
            print(f"{name}: skipped: {why}", flush=True)
            continue
        layer = weights = None
        try:
            weights = random_weights(preset, "mxfp4", dev)
            bias = correction_bias(preset, dev)
            layer = MatmulOgsMoE(cfg, weights, layouts, bias)
        except Exception as exc:  # recorded in the results, never hidden
            add({"preset": name, "M": None, "error": f"{type(exc).__name__}: {exc}"[:500]})
            print(f"{name}: layer not built: {rows[-1]['error']}", flush=True)
            del layer, weights
            torch.cuda.empty_cache()
            continue
        notes = layer.describe()
        for M in args.m:
            row = {"preset": name, "M": M, **notes}
            try:
                inputs = input_sets(preset, M, dev)
                work = routed_work(cfg, [logits for _, logits in inputs], bias)
                floor = roofline_floor(cfg, layer_quant(preset, "mxfp4"), work, ceilings)
                row.update(floor_us=floor.seconds * 1e6, bound=floor.bound[0], distinct_experts=floor.distinct_experts)
                if args.check:
                    row.update(check(layer, weights, *inputs[0]))
                with SmClockSampler(dev) as clock:
                    samples, method = time_cuda_layer(layer, inputs)
                row.update(us=mean_call_seconds(samples, len(inputs)) * 1e6, timing=method, sm_clock_mhz=clock.median)
                row["floor_fraction"] = row["floor_us"] / row["us"]
                if method != "cuda-graph":
                    row["notes"] = [*row["notes"], f"timed eagerly: {method}"]
            except Exception as exc:  # recorded in the results, never hidden
                row["error"] = f"{type(exc).__name__}: {exc}"[:500]
                print(f"{name:16s} M={M:5d} error: {row['error']}", flush=True)
                add(row)
                torch.cuda.empty_cache()
                continue
            add(row)
            err = (
                f"err {row['err']:.1e} max {row['max_err']:.1e} routing {row['routing_same_experts']:.3f}"
                if "err" in row
                else "err -"
            )
            print(
                f"{name:16s} M={M:5d} {row['us']:9.1f} us  floor {row['floor_us']:8.1f} ({row['bound']}) "
                f"frac {row['floor_fraction']:.2f}  {err}  SM {mhz(row['sm_clock_mhz'])}  {method}",
                flush=True,
            )
        del layer, weights
        torch.cuda.empty_cache()
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_json_atomic(path, result)
    print(f"wrote {path}", flush=True)
    return 0 if all("error" not in r for r in rows) else 1


def compile_only(args, layouts: Layouts) -> int:
    """Each cell's layer called once on one input set, nothing timed or written: the kernels land in
    Triton's on-disk cache (several such processes side by side take compiling off a timed run)."""
    from layer_timing import correction_bias, input_sets, random_weights

    from moe_core.presets import get_preset

    dev = torch.device(args.device)
    for name in args.preset:
        preset = get_preset(name)
        if unsupported(preset.config):
            continue
        started = time.time()
        weights = random_weights(preset, "mxfp4", dev)
        layer = MatmulOgsMoE(preset.config, weights, layouts, correction_bias(preset, dev))
        for M in args.m:
            layer(*input_sets(preset, M, dev, sets=1)[0])
        torch.cuda.synchronize()
        print(f"{name}: compiled M={args.m} in {time.time() - started:.0f} s", flush=True)
        del layer, weights
        torch.cuda.empty_cache()
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    from layer_timing import PRESETS, TOKEN_COUNTS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--triton-kernels",
        required=True,
        type=Path,
        metavar="DIR",
        help="the extracted triton_kernels package (or the folder holding it): "
        "benchmarks/gpu/extract_triton_kernels.sh",
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--preset",
        nargs="+",
        default=list(PRESETS),
        metavar="NAME",
        help=f"moe_core presets (default: {' '.join(PRESETS)})",
    )
    p.add_argument("--m", nargs="+", type=int, default=list(TOKEN_COUNTS), metavar="M")
    p.add_argument(
        "--check",
        action="store_true",
        help="compare every cell's output with moe_core's fp32 reference (same routing)",
    )
    p.add_argument(
        "--layout",
        choices=("vllm", "strided"),
        default="vllm",
        help="MXFP4 layouts: vLLM's default for the device (default), or unswizzled",
    )
    p.add_argument(
        "--device",
        default="cuda",
        help="cuda (default); cpu only for a dry run under TRITON_INTERPRET=1 (strided layouts, nothing timed "
        "by CUDA events: see test_peer_matmul_ogs.py)",
    )
    p.add_argument(
        "--compile-only",
        action="store_true",
        help="call each cell's layer once (filling Triton's cache); time and write nothing",
    )
    args = p.parse_args(argv)
    if any(m < 1 for m in args.m):
        p.error(f"--m must be >= 1, got {args.m}")
    return args


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
