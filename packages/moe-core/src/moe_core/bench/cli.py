"""`moe bench`: its arguments, the run over presets, schemes, backends and token counts, and the naive
per-expert loop it compares with.

For each preset, scheme and token count it times `FusedMoE` (routing + experts) on the backend the
oracle chooses, or on every installed backend (`--backends all`, which also writes the measured
ranking `select()` reads: `moe_core.rankings`), and reports the fraction of the roofline floor it
reaches (`moe_core.bench.roofline`). The naive baseline is the loop of transformers' eager MoE
blocks: route, then `F.linear` per expert that got tokens, in the layer dtype.

On CUDA a layer is timed as engines run it (`moe_core.bench.timing.time_cuda_layer`); a layer that
cannot be captured is timed eagerly the same way, and the row says so. Elsewhere calls are timed by
the wall clock, interleaved with the naive loop.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from moe_core.backends import REFERENCE_BACKEND, available_memory_bytes, detect_device
from moe_core.bench.memory import planned_bytes
from moe_core.bench.report import _plot, format_report, moved
from moe_core.bench.results import (
    Row,
    _machine,
    _Results,
    _slug,
    claim_results_path,
    prepare_out_dir,
    save_ranking,
)
from moe_core.bench.roofline import (
    IMPOSSIBLE_FRACTION,
    Ceilings,
    QuickCeilings,
    RoutedWork,
    measure_ceilings,
    quick_ceilings,
    roofline_floor,
    routed_work,
)
from moe_core.bench.timing import (
    Progress,
    _note,
    _time,
    _time_interleaved,
    add_threads_argument,
    mean_call_seconds,
    pin_threads,
    step,
    summarize_timings,
    time_cuda_layer,
    validate_threads,
    warn_if_unsteady,
)
from moe_core.config import MoEConfig
from moe_core.layer import FusedMoE
from moe_core.oracle import BackendUnavailableError, NoBackendError, select
from moe_core.plugins import PluginState, registry
from moe_core.presets import PRESETS, Preset, get_preset
from moe_core.quant import MoEQuantConfig, int4_w4a16, parse_scheme, unquantized
from moe_core.rankings import shape_key
from moe_core.reference import apply_activation
from moe_core.routing import route_torch
from moe_core.weights.canonical import ExpertWeights

DEFAULT_PRESETS = ("tiny", "qwen3-30b-a3b")
DEFAULT_TOKENS = (1, 8, 32, 128)
DEFAULT_SCHEMES = ("bf16", "int4")
# In the current directory, not the repository's committed benchmarks/results/: a run's output is the
# user's until they decide to publish it.
DEFAULT_OUT = "moe-bench-results"
# Fraction of the available memory a preset may plan to use; the rest is for torch and the OS.
MEMORY_HEADROOM = 0.8
# The standard deviation of the random per-expert correction bias drawn for routings that take one
# (DeepSeek-V3). On random logits it concentrates the pairs on fewer experts (at 2048 tokens the
# busiest of deepseek-v3's 256 takes about 12x the mean): a harder case than a trained bias gives.
CORRECTION_BIAS_STD = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", action="append", metavar="NAME",
                        help=f"model preset, repeatable (default: {', '.join(DEFAULT_PRESETS)}; "
                             f"available: {', '.join(PRESETS)})")
    parser.add_argument("--tokens", type=int, nargs="+", metavar="M",
                        help=f"token counts per forward (default: {' '.join(map(str, DEFAULT_TOKENS))})")
    parser.add_argument("--scheme", "--quant", action="append", dest="scheme", metavar="SCHEME",
                        help="bf16 (or unquantized, fp16, none: the preset's dtype, unquantized), int4 (the preset's "
                             "group size) or any "
                             "`moe run` scheme: int4:G[:zp], int8 (per channel, as int8_w8a16()), int8:G[:zp], "
                             "fp8-tensor[:token|:tensor], fp8-channel[:token|:tensor], fp8-block, mxfp4; "
                             f"repeatable (default: {', '.join(DEFAULT_SCHEMES)})")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or xpu")
    parser.add_argument("--backends", default="chosen", metavar="chosen|all|B1,B2",
                        help="which backends to time: the one the oracle chooses (default), every installed "
                             "backend but the reference (all), or a comma-separated list; each forced backend is "
                             "timed where it serves the layer and its refusal is recorded otherwise. With all or "
                             "a list, the measured ranking is merged into ranking-<device>.json in --out")
    parser.add_argument("--save-ranking", action="store_true",
                        help="also merge the measured ranking into the user's rankings folder "
                             "(~/.cache/moe/rankings), where select() and `moe explain` find it (needs --backends "
                             "all or a list)")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"output folder for JSON and PNG (default: ./{DEFAULT_OUT}; created if missing, "
                             "checked for writing before anything is measured; each run writes files of its own, "
                             "the JSON rewritten after every measured point)")
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats per point (median and min reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    add_threads_argument(parser)
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (matplotlib not needed then)")


def _scheme(text: str, preset: Preset) -> MoEQuantConfig:
    if text == "int4":
        return int4_w4a16(preset.int4_group_size)
    return parse_scheme(text)


def naive_moe(config: MoEConfig, w13: torch.Tensor, w2: torch.Tensor, b13: torch.Tensor | None,
              b2: torch.Tensor | None, correction_bias: torch.Tensor | None
              ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """transformers' eager MoE block: route, then one F.linear pair per expert that got tokens."""

    def forward(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        weights, ids = route_torch(logits, config.routing, config.top_k, correction_bias)
        out = torch.zeros_like(x)
        mask = F.one_hot(ids.long(), config.num_experts).permute(2, 1, 0)  # [E, k, M]
        for e in (mask.sum(dim=(1, 2)) > 0).nonzero().flatten().tolist():
            slot, token = torch.where(mask[e])
            h = F.linear(x[token], w13[e], None if b13 is None else b13[e])
            y = F.linear(apply_activation(h, config.activation), w2[e], None if b2 is None else b2[e])
            out.index_add_(0, token, (y * weights[token, slot, None]).to(x.dtype))
        return out

    return forward


@dataclass(frozen=True)
class _Run:
    """What every cell of a run shares."""

    device: torch.device
    ceilings: Ceilings
    quick: QuickCeilings  # the run's start (the better of two around the ceilings), in `dtype`: the re-checks' baseline
    dtype: torch.dtype
    args: argparse.Namespace
    results: _Results


def _input_sets(config: MoEConfig, tokens: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(hidden states, router logits) sets of `tokens` tokens: one, or on CUDA the rotating sets the
    graph protocol replays in turn (8, 2 above 512 tokens), so consecutive calls read other activations.
    Every set is timed: the floor counts the experts their routing selects. Drawn from a seed of their
    own token count, so a cell's inputs (and its floor) do not depend on the other token counts run."""
    gen = torch.Generator().manual_seed(tokens)
    sets = 1 if device.type != "cuda" else (8 if tokens <= 512 else 2)
    return [(torch.randn(tokens, config.hidden_size, generator=gen).to(device, config.dtype),
             torch.randn(tokens, config.num_experts, generator=gen).to(device)) for _ in range(sets)]


def _bench_preset(preset: Preset, schemes: list[str], tokens: list[int], backends: list[str | None],
                  run: _Run) -> None:
    config, device, results = preset.config, run.device, run.results
    gen = torch.Generator().manual_seed(0)
    correction_bias = (torch.randn(config.num_experts, generator=gen).to(device) * CORRECTION_BIAS_STD
                       if config.routing.has_correction_bias else None)
    dtype_name = str(config.dtype).removeprefix("torch.")
    # Drawn where they run: a GPU draws a real-shape layer in a fraction of the CPU's time.
    dense = ExpertWeights.random(config, unquantized(), progress=Progress(f"{preset.name}: {dtype_name} weights"),
                                 device=device)
    naive = naive_moe(config, dense.w13, dense.w2, dense.w13_bias, dense.w2_bias, correction_bias)
    inputs = {m: _input_sets(config, m, device) for m in tokens}
    work = {m: routed_work(config, [logits for _, logits in sets], correction_bias) for m, sets in inputs.items()}
    naive_ms: dict[int, float] = {}  # per token count, timed once per preset on the dense weights
    for scheme in schemes:
        first_outputs: dict[int, tuple[str, torch.Tensor]] = {}  # per token count: (backend, output)
        quant = _scheme(scheme, preset)
        weights = dense
        if quant.weight.quantized:
            weights = ExpertWeights.random(config, quant, progress=Progress(f"{preset.name}: {scheme} weights"),
                                           device=device)
        for backend in backends:
            try:
                layer = FusedMoE(config, quant, device, prefer=backend)
            except BackendUnavailableError as exc:
                reason = str(exc).split("\n\n")[0]
                _note(f"{preset.name}: {scheme}: {reason}")
                results.refuse(preset.name, reason, scheme, backend)
                continue
            try:
                _bench_layer(preset, scheme, quant, layer, weights, correction_bias, inputs, work, naive, naive_ms,
                             first_outputs, run)
            except (RuntimeError, ValueError, MemoryError) as exc:
                if backend is None:  # the oracle's own choice failing is the user's error to see
                    raise
                # one backend failing to load or run (out of memory, a kernel's own refusal) is its result
                reason = f"{backend} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                _note(f"{preset.name}: {scheme}: {reason}")
                results.refuse(preset.name, reason, scheme, backend)
            del layer
            if device.type == "cuda":
                torch.cuda.empty_cache()
        results.scheme_done()
        del weights


def _stored_bytes(value: object) -> int:
    """Bytes of a packed tensor, or of the tensors of canonical weights a backend keeps as they are."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, ExpertWeights):
        return sum(_stored_bytes(t) for n, t in value.tensors().items() if not n.endswith("bias"))
    raise TypeError(f"packed weights hold a {type(value).__name__}, expected tensors")


def _bench_layer(preset: Preset, scheme: str, quant: MoEQuantConfig, layer: FusedMoE, weights: ExpertWeights,
                 correction_bias: torch.Tensor | None, inputs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]],
                 work: dict[int, RoutedWork], naive: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 naive_ms: dict[int, float], first_outputs: dict[int, tuple[str, torch.Tensor]], run: _Run) -> None:
    config, name, device, args = preset.config, layer.plan.experts_cls.name(), run.device, run.args
    with step(f"{preset.name}: {scheme}: converting the weights for {layer.plan.backend} / {name}"):
        layer.load_weights(weights, correction_bias)
    packed = layer.experts.weights
    kernel_bytes = sum(_stored_bytes(t) for n, t in packed.tensors.items() if not n.endswith("bias"))
    kernel_bytes_per_expert = kernel_bytes // config.num_local_experts
    with torch.inference_mode():  # the naive loop runs under it too: neither pays for autograd
        for m, sets in inputs.items():
            output = layer(*sets[0]).float()
            compared_with, rel_diff = first_outputs.setdefault(m, (layer.plan.backend, output))[0], None
            if compared_with != layer.plan.backend:
                reference = first_outputs[m][1]
                rel_diff = float((output - reference).norm() / reference.norm().clamp_min(1e-30))
            else:
                compared_with = None
            del output
            cell = f"{preset.name}: {scheme}: {layer.plan.backend}: {m} tokens"
            if device.type == "cuda":
                _note(f"{cell}: timing (CUDA graphs, L2 flushed before every replay)")
                samples, method = time_cuda_layer(layer, sets)
                recheck = quick_ceilings(device, run.dtype)
                if m not in naive_ms:
                    naive_ms[m] = statistics.median(_time(lambda m=m: naive(*inputs[m][0]), device, args.warmup,
                                                          args.repeats)) * 1e3
            else:
                _note(f"{cell}: timing ({args.warmup} warmup + {args.repeats} repeats, layer and naive loop in turn)")
                x, logits = sets[0]
                samples, naive_samples = _time_interleaved(
                    [lambda x=x, lg=logits: layer(x, lg), lambda x=x, lg=logits: naive(x, lg)], device, args.warmup,
                    args.repeats)
                recheck = quick_ceilings(device, run.dtype)
                naive_ms.setdefault(m, statistics.median(naive_samples) * 1e3)
                method = "wall-clock"
            timing = summarize_timings(samples)
            warn_if_unsteady(cell, timing)
            seconds = mean_call_seconds(samples, len(sets))  # the CPU times one set: its median
            floor = roofline_floor(config, quant, work[m], run.ceilings)
            row = Row(preset.name, scheme, m, layer.plan.backend, name, quant.name, quant.family.value,
                      shape_key(config), method, seconds * 1e3, timing.min * 1e3, timing.p90 * 1e3, timing.spread,
                      m / seconds, floor.seconds * 1e3, floor.bound, floor.seconds / seconds, naive_ms[m],
                      naive_ms[m] / (seconds * 1e3), round(floor.bytes_per_expert), kernel_bytes_per_expert,
                      floor.distinct_experts, floor.matmul_dtype,
                      recheck.copy_bytes_per_s / run.quick.copy_bytes_per_s,
                      recheck.matmul_flop_per_s / run.quick.matmul_flop_per_s, compared_with, rel_diff)
            run.results.add_row(row)
            _note(f"{cell}: {row.time_ms:.3f} ms (min {row.min_ms:.3f}), {row.floor_fraction:.2f} of the "
                  f"{row.floor_bound} floor ({row.distinct_experts:g} experts)")
            _warn_if_suspect(cell, row)


def _warn_if_suspect(cell: str, row: Row) -> None:
    """Say at once (the table comes at the end) when a cell's result cannot be trusted."""
    if row.floor_fraction > IMPOSSIBLE_FRACTION:
        _note(f"warning: {cell}: {row.floor_fraction:.2f} of the floor is impossible (no layer runs faster than "
              "its floor): the floor or the timing is wrong")
    if moved(row):
        _note(f"warning: {cell}: the quick copy and matmul re-measured after it ran at {row.copy_recheck:.2f}x and "
              f"{row.matmul_recheck:.2f}x their speed at the run's start, when the ceilings were measured: other "
              "processes' load, then or during the cell, moved the machine's speed; its time and floor fraction are "
              "suspect")


def _unique(values: list) -> list:
    return list(dict.fromkeys(values))


def _backends(text: str) -> list[str | None]:
    """--backends as FusedMoE's `prefer` values: [None] for the oracle's choice."""
    text = text.strip().lower()
    if text == "chosen":
        return [None]
    reg = registry()
    installed = sorted(reg.backends() - {REFERENCE_BACKEND})
    if text == "all":  # the backends of plugins that can run here; the others are listed, not timed
        not_ready = {s.name: f"{s.state.value}: {s.reason}" for s in reg.statuses.values()
                     if s.state is not PluginState.READY}
        if not_ready:
            _note("--backends all: not timed (plugin not ready here): "
                  + "; ".join(f"{name} ({why})" for name, why in sorted(not_ready.items())))
        return sorted({r.backend for s in reg.statuses.values() if s.state is PluginState.READY and s.spec
                       for r in s.spec.experts} - {REFERENCE_BACKEND})
    named = _unique([b.strip() for b in text.split(",") if b.strip()])
    unknown = [b for b in named if b not in installed and b != REFERENCE_BACKEND]
    if unknown or not named:
        raise ValueError(f"--backends {text!r}: {', '.join(unknown) or 'no backend'} not installed; expected chosen, "
                         f"all, or a comma-separated list of {', '.join([*installed, REFERENCE_BACKEND])}")
    return list(named)


def _validated(args: argparse.Namespace
               ) -> tuple[list[Preset], torch.device, list[int], list[str], list[str | None]]:
    """Every argument checked before anything is measured or allocated; ValueError says what is wrong."""
    presets = [get_preset(p) for p in _unique(args.preset or DEFAULT_PRESETS)]
    device = detect_device(args.device).torch_device
    backends = _backends(args.backends)
    tokens = _unique(args.tokens or DEFAULT_TOKENS)
    schemes = _unique(args.scheme or DEFAULT_SCHEMES)
    bad = [m for m in tokens if m < 1]
    if bad:
        raise ValueError(f"--tokens must be >= 1, got {bad}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1 (the median of no samples is undefined), got {args.repeats}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    validate_threads(args.threads)
    if args.save_ranking and backends == [None]:
        raise ValueError("--save-ranking needs --backends all or a list of backends: the oracle's choice alone "
                         "ranks nothing")
    for preset in presets:
        too_many = [m for m in tokens if m > preset.config.max_num_tokens]
        if too_many:
            raise ValueError(f"--tokens {too_many} exceed the {preset.name} layer's max_num_tokens "
                             f"({preset.config.max_num_tokens})")
        for scheme in schemes:
            refusals = []
            for backend in backends:  # the plans are made before any weight exists
                try:
                    select(preset.config, _scheme(scheme, preset), device, backend)
                except (ValueError, NoBackendError, BackendUnavailableError) as exc:
                    refusals.append(str(exc))
            # a scheme that none of several backends serves is that cell's result, recorded when run
            if refusals and backends == [None]:
                raise ValueError(f"{preset.name} with --scheme {scheme!r}: {refusals[0]}")
    return presets, device, tokens, schemes, backends


def main(args: argparse.Namespace) -> int:
    """`moe bench`: 0 when every preset ran, 1 when one was refused for memory, 2 on bad arguments
    (the message on stderr), 130 when interrupted (the points measured so far are in the JSON).
    Progress goes to stderr as the run goes; the results table to stdout once it has ended."""
    try:
        presets, device, tokens, schemes, backends = _validated(args)
        out = prepare_out_dir(args.out)
    except ValueError as exc:
        print(f"moe bench: error: {exc}", file=sys.stderr)
        return 2
    threads = pin_threads(args.threads)
    machine = _machine(device, threads)
    stem = (f"bench-{_slug(machine['device'])}-{machine['cpu_count']}cpu-{threads}t-torch{_slug(torch.__version__)}-"
            f"{datetime.datetime.now(datetime.UTC).strftime('%Y%m%dT%H%M%SZ')}")
    json_path = claim_results_path(out, stem)
    png_path = json_path.with_suffix(".png")
    title = f"{machine['device']}, {machine['cpu_count']} cpus, torch {machine['torch']}, {threads} threads"
    _note(f"{title} ({'--threads' if args.threads else 'default: physical cores available to this process'}); "
          f"results: {json_path}")
    # The oracle's choice alone ranks nothing: a ranking comes from backends timed side by side.
    results = _Results(json_path, {
        "machine": machine, "repeats": args.repeats, "warmup": args.warmup,
        "method": ("CUDA graphs over rotating input sets, L2 flushed before every replay, CUDA events"
                   if device.type == "cuda" else "wall clock") +
                  "; time = the mean over the input sets of each set's median call; min and p90 of all samples; "
                  "floor = max(distinct experts the sets' routing selects (their mean) * the scheme's stored bytes "
                  "per expert / memory bandwidth, flops / matmul rate of the scheme's compute type); naive = "
                  "per-expert F.linear loop"},
        ranking_folder=None if backends == [None] else out)
    ceilings, code = None, 0
    try:
        with step("measuring the copy bandwidth and matmul rates"):
            dtype = presets[0].config.dtype
            # The re-checks' baseline: the better of a quick measurement before and one after the
            # ceilings. Right after the ceilings' large matmuls an H200 read 0.85x and 0.83x of its
            # later re-checks, which then flagged most cells as moved; before them a GPU may not have
            # raised its clocks yet.
            before = quick_ceilings(device, dtype)
            ceilings = measure_ceilings(device, dtype, host_samples=max(args.repeats // 2, 5))
            after = quick_ceilings(device, dtype)
            quick = QuickCeilings(max(before.copy_bytes_per_s, after.copy_bytes_per_s),
                                  max(before.matmul_flop_per_s, after.matmul_flop_per_s))
        results.payload["ceilings"] = asdict(ceilings)
        results.payload["quick_ceilings"] = {**asdict(quick), "measured": [asdict(before), asdict(after)]}
        results.save()
        run = _Run(device, ceilings, quick, dtype, args, results)
        available = available_memory_bytes(device)
        for preset in presets:
            quants = [_scheme(s, preset) for s in schemes]
            need = planned_bytes(preset.config, quants, max(tokens), accelerator=device.type != "cpu")
            if need > MEMORY_HEADROOM * available:
                reason = (f"needs about {need / 2**30:.1f} GiB ({', '.join(schemes)}, up to {max(tokens)} tokens), "
                          f"{MEMORY_HEADROOM:.0%} of the {available / 2**30:.1f} GiB available is "
                          f"{MEMORY_HEADROOM * available / 2**30:.1f} GiB; not run")
                _note(f"{preset.name}: {reason}")
                results.refuse(preset.name, reason)
                continue
            _bench_preset(preset, schemes, tokens, backends, run)
        results.finish()
    except KeyboardInterrupt:
        _note(f"moe bench: interrupted; the {len(results.payload['rows'])} points measured are in {json_path}")
        code = 130
    finally:
        ranking = results.ranking() if args.save_ranking else None
        if ranking is not None and ranking["entries"]:
            _note(f"merged the measured ranking into {save_ranking(ranking)}")
    rows = results.rows
    if ceilings is not None:
        print(format_report(title, ceilings, rows, results.payload["refused"]), flush=True)
    if code:
        return code
    _note(f"wrote {json_path}" + (f" and {results.ranking_path}" if results.ranking_path else ""))
    if rows and not args.no_plot:
        _plot(rows, png_path, f"{machine['device']}, {threads} threads, torch {torch.__version__}, {machine['date']}")
        _note(f"wrote {png_path}")
    return 0 if rows or not presets else 1
