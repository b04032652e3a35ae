"""The `moe` command (also `python -m moe_core`): doctor, explain, run, bench, and the subcommands
that installed plugins contribute (`BackendSpec.commands`, e.g. moe-triton's `moe tune`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import sys
import textwrap
import time
from collections.abc import Sequence

import torch

from moe_core import bench
from moe_core.__about__ import PLUGIN_API, __version__
from moe_core._progress import Heartbeat
from moe_core.backends import REFERENCE_BACKEND, Platform, available_memory_bytes, detect_device, synchronize
from moe_core.config import MoEConfig, ParallelConfig
from moe_core.hf_config import load_hf_config, moe_config_from_hf, quant_from_hf
from moe_core.oracle import TEXT_WIDTH, BackendUnavailableError, NoBackendError, select
from moe_core.plugins import PluginState, registry
from moe_core.presets import PRESETS, get_preset
from moe_core.quant import SCHEME_SPELLINGS, MoEQuantConfig, parse_scheme
from moe_core.rankings import list_rankings

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_PRESET = "qwen3-30b-a3b"

# torch.Generator seeds are 64-bit (a larger one failed deep inside torch: "Overflow when unpacking long
# long"); `moe run` also seeds with seed + 1.
_MAX_SEED = 2**63 - 2


# ---- doctor ---------------------------------------------------------------------------------


def _devices() -> list[dict]:
    devices = [{"platform": "cpu", "name": detect_device("cpu").name, "threads": torch.get_num_threads()}]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            d = detect_device(torch.device("cuda", i))
            devices.append({"platform": d.platform.value, "index": i, "name": d.name,
                            "capability": list(d.capability) if d.capability else None})
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        for i in range(torch.xpu.device_count()):
            devices.append({"platform": "xpu", "index": i, "name": torch.xpu.get_device_name(i)})
    return devices


def _experts_rows(reg) -> list[dict]:
    rows = []
    for status, ref in reg.refs():
        row = {"plugin": status.name, "backend": ref.backend, "experts": ref.path.rpartition(":")[2]}
        try:
            cls = reg.resolve(ref)
        except ImportError as exc:
            row.update(error=str(exc), validated_on=[], not_validated_on=[], limitations=[])
        else:
            cap = cls.capability
            row.update(platforms=sorted(p.value for p in cap.platforms), validated_on=list(cap.validated_on),
                       not_validated_on=sorted(p.value for p in cap.unvalidated_platforms),
                       limitations=list(cap.limitations))
        rows.append(row)
    return rows


def doctor_report(require: Sequence[str] = ()) -> dict:
    reg = registry()
    dists = reg.distribution_versions()
    triton_version = bench.triton_version()
    devices = _devices()
    report = {
        "core": {"version": __version__, "plugin_api": list(PLUGIN_API)},
        "python": platform.python_version(),
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip},
        "triton": triton_version,
        "devices": devices,
        "distributions": dists,
        "plugins": [s.to_dict() for s in reg.statuses.values()],
        "experts": _experts_rows(reg),
        "rankings": list_rankings(),
        "require": {},
    }
    present = {d["platform"] for d in devices}
    for want in require:
        ready = [s.name for s in reg.statuses.values()
                 if s.state is PluginState.READY and s.spec and want in {p.value for p in s.spec.platforms}]
        ok = want in present and bool(ready)
        why = ("" if ok else f"no {want} device is visible to torch" if want not in present
               else f"no plugin serving {want} is ready")
        report["require"][want] = {"ok": ok, "plugins": ready, "reason": why}
    return report


def _print_table(rows: list[list[str]], max_lines: int | None = None) -> None:
    """Columns padded to their widest cell; the last wraps so lines stay near TEXT_WIDTH, and is cut
    after `max_lines` lines (`--json` keeps every word)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    indent = 2 + sum(w + 2 for w in widths)
    for r in rows:
        lines = textwrap.wrap(r[-1], max(TEXT_WIDTH - indent, 40), break_on_hyphens=False) or [""]
        if max_lines is not None and len(lines) > max_lines:
            lines = [*lines[:max_lines - 1], textwrap.shorten(" ".join(lines[max_lines - 1:]),
                                                              max(TEXT_WIDTH - indent, 40), placeholder=" ...")]
        head = "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  "
        print((head + ("\n" + " " * indent).join(lines)).rstrip())


def cmd_doctor(args) -> int:
    report = doctor_report(args.require)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        t = report["torch"]
        build = f"CUDA {t['cuda']}" if t["cuda"] else f"ROCm {t['hip']}" if t["hip"] else "CPU-only"
        print(f"moe-core {__version__} (plugin API {PLUGIN_API[0]}.{PLUGIN_API[1]}), Python {report['python']}, "
              f"torch {t['version']} ({build} build), triton {report['triton'] or 'not installed'}")
        print("\ndevices:")
        for d in report["devices"]:
            extra = f", sm{d['capability'][0]}{d['capability'][1]}" if d.get("capability") else ""
            print(f"  {d['platform']}: {d['name']}{extra}")
        print("\ndistributions: " + ", ".join(f"{k} {v}" for k, v in report["distributions"].items()))
        print("\nplugins:")
        if report["plugins"]:
            _print_table([["name", "distribution", "version", "state", "backends", "reason"]] + [
                [p["name"], p["distribution"], p["version"], p["state"], ",".join(p["backends"]), p["reason"]]
                for p in report["plugins"]])
        else:
            print("  none installed (pip install moe-cpu, moe-triton, ...)")
        print("\nexperts (validated = run for real on that hardware by this project's tests; notes cut short "
              "here, whole in --json):")
        rows = [["backend", "experts", "validated on -- notes"]]
        for e in report["experts"]:
            val = ", ".join(e["validated_on"]) or "NOT validated on real hardware"
            if e["validated_on"] and e.get("not_validated_on"):
                val += f"; NOT validated on {', '.join(e['not_validated_on'])}"
            notes = e.get("error", "; ".join(e["limitations"]))
            # an unvalidated class's notes begin by saying so: say it once
            rows.append([e["backend"], e["experts"], notes if notes.startswith(val) else
                         f"{val} -- {notes}" if notes else val])
        _print_table(rows, max_lines=3)
        print("\nmeasured rankings (select() orders backends by the first that covers a layer's device):")
        names = {d["name"] for d in report["devices"]}
        for r in report["rankings"] or [{"path": "none found (moe bench --backends all --save-ranking writes one)"}]:
            what = (f"ERROR {r['error']}" if "error" in r else
                    f"{r['device']}, {r['entries']} entries, measured {r['date']}"
                    f"{' (this machine)' if r['device'] in names else ''}" if "device" in r else "")
            print(f"  {r['path']}  {what}".rstrip())
        for want, r in report["require"].items():
            print(f"\nrequire {want}: {'ok' if r['ok'] else 'FAILED: ' + r['reason']}")
    return 0 if all(r["ok"] for r in report["require"].values()) else 1


# ---- layer selection from CLI arguments -----------------------------------------------------


def _add_layer_args(p: argparse.ArgumentParser, default_preset: str | None) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", default=default_preset, choices=sorted(PRESETS),
                     help=f"built-in model shape (default: {default_preset})")
    src.add_argument("--config", metavar="PATH", help="a Hugging Face config.json (or its model directory)")
    p.add_argument("--quant", "--scheme", dest="quant", metavar="SCHEME",
                   help=f"{SCHEME_SPELLINGS.replace(', ', ' | ')} (default: "
                   "unquantized for presets, the config's quantization_config for --config). As in Python: int8 "
                   "is per channel (int8_w8a16()), int8:G groups of G; fp8 activations are scaled per token "
                   "unless :tensor; int4 without G takes the preset's group size")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="activation dtype (default bf16)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, xpu (default: cpu for run, else auto)")
    p.add_argument("--backend", default=None, help="force a backend (same as env MOE_BACKEND)")
    p.add_argument("--ep-size", type=int, default=1, help="expert-parallel ranks (the layer holds rank --ep-rank)")
    p.add_argument("--ep-rank", type=int, default=0)


def _layer_from_args(args) -> tuple[MoEConfig, MoEQuantConfig, str]:
    parallel = ParallelConfig(ep_size=args.ep_size, ep_rank=args.ep_rank)
    dtype = _DTYPES[args.dtype] if args.dtype else None
    if args.config:
        hf = _read_hf_config(args.config)
        config = moe_config_from_hf(hf, dtype=dtype, parallel=parallel)
        quant = parse_scheme(args.quant) if args.quant is not None else quant_from_hf(hf)
        return config, quant, f"{hf.get('model_type')} ({args.config})"
    preset = get_preset(args.preset)
    cfg = preset.config
    config = MoEConfig(cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size, cfg.activation,
                       cfg.routing, dtype or cfg.dtype, parallel, cfg.has_bias, cfg.max_num_tokens)
    scheme = "unquantized" if args.quant is None else args.quant  # an empty --quant '' is refused, not defaulted
    if scheme == "int4":  # the group size of the model's published int4 checkpoints
        scheme = f"int4:{preset.int4_group_size}"
    return config, parse_scheme(scheme), preset.name


def _read_hf_config(path: str) -> dict:
    """`load_hf_config`, with errors that name the file and say what is expected."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        hf = load_hf_config(path)
    except FileNotFoundError:
        where = "the folder has no config.json" if os.path.isdir(path) else "no such file"
        raise ValueError(f"--config {path}: {where} (give a config.json or the model folder holding one)") from None
    except OSError as exc:
        raise ValueError(f"--config {path}: cannot read {file}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config {path}: {file} is not valid JSON: {exc}") from None
    except TypeError:  # load_hf_config looks for text_config in whatever the JSON holds
        hf = None
    if not isinstance(hf, dict):
        raise ValueError(f"--config {path}: {file} holds no JSON object (a Hugging Face config.json is one)")
    return hf


def _parallel_from_args(args, config: MoEConfig) -> tuple[MoEConfig, object]:
    """explain's --parallel/--payload/--fixed-slots/--placement: the layer's placement and mode."""
    from moe_core.parallel import AllToAll, Replicate, balanced_placement

    if args.placement == "balanced":
        if not args.expert_loads:
            raise ValueError("--placement balanced needs --expert-loads PATH (a JSON list of per-expert loads)")
        expected = f"expected a JSON list of {config.num_experts} finite numbers >= 0 (one load per expert)"
        try:
            with open(args.expert_loads, encoding="utf-8") as f:
                loads = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"--expert-loads {args.expert_loads}: not valid JSON ({exc}); {expected}") from None
        except OSError as exc:
            raise ValueError(f"--expert-loads {args.expert_loads}: cannot read it ({exc.strerror or exc}); "
                             f"{expected}") from None
        if not isinstance(loads, list) or len(loads) != config.num_experts:
            got = f"a list of {len(loads)}" if isinstance(loads, list) else f"a JSON {type(loads).__name__}"
            raise ValueError(f"--expert-loads {args.expert_loads}: {expected}, got {got}")
        bad = next(((e, v) for e, v in enumerate(loads) if isinstance(v, bool) or not isinstance(v, (int, float))
                    or not 0 <= v < float("inf")), None)
        if bad is not None:
            raise ValueError(f"--expert-loads {args.expert_loads}: {expected}, got {json.dumps(bad[1])} for expert "
                             f"{bad[0]}")
        placement = balanced_placement(loads, config.parallel.ep_size, args.redundant)
        config = dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, placement=placement))
    elif args.redundant:
        raise ValueError("--redundant needs --placement balanced")
    elif args.expert_loads:
        raise ValueError("--expert-loads is read by --placement balanced only; add it, or drop --expert-loads")
    if args.parallel == "all_to_all":
        return config, AllToAll({"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}.get(args.payload),
                                args.fixed_slots)
    if args.payload or args.fixed_slots:
        raise ValueError("--payload and --fixed-slots need --parallel all_to_all")
    return config, Replicate() if args.parallel == "replicate" else None


def cmd_explain(args) -> int:
    from moe_core.parallel import resolve_parallel

    config, quant, name = _layer_from_args(args)
    config, mode = _parallel_from_args(args, config)
    if args.tokens is not None and not 1 <= args.tokens <= config.max_num_tokens:
        raise ValueError(f"--tokens must be in [1, {config.max_num_tokens}] (the layer's max_num_tokens), got "
                         f"{args.tokens}")
    plan = select(config, quant, args.device, args.backend, num_tokens=args.tokens)
    parallel = resolve_parallel(config, mode, plan.experts_cls.monolithic, plan.experts_cls.name())
    if args.json:
        print(json.dumps({"model": name, **plan.to_dict(), "parallel": parallel.to_dict()}, indent=2))
    else:
        print(f"model:   {name}\n{plan.explain()}\n\n{parallel.explain()}")
    return 0


# ---- run ------------------------------------------------------------------------------------


def _validate_run_args(args) -> list[int]:
    """The run's arguments, checked before any weight is built; returns the token counts, deduplicated."""
    bad = [m for m in args.tokens if m < 1]
    if bad:
        raise ValueError(f"--tokens must be >= 1, got {bad}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1 (the median of no timings is undefined), got {args.repeats}")
    bench.validate_threads(args.threads)
    if not 0 <= args.seed <= _MAX_SEED:
        raise ValueError(f"--seed must be >= 0 and <= {_MAX_SEED} (torch seeds are 64-bit), got {args.seed}")
    return list(dict.fromkeys(args.tokens))


def cmd_run(args) -> int:
    from moe_core.layer import FusedMoE
    from moe_core.reference import reference_moe
    from moe_core.routing import route_torch
    from moe_core.weights import ExpertWeights

    tokens = _validate_run_args(args)
    config, quant, name = _layer_from_args(args)
    too_many = [m for m in tokens if m > config.max_num_tokens]
    if too_many:
        raise ValueError(f"--tokens {too_many} exceed the layer's max_num_tokens ({config.max_num_tokens})")
    device = args.device or "cpu"
    # One process holds one expert-parallel slice: its output is that slice's share of the layer.
    layer = FusedMoE(config, quant, device, args.backend, ep_group="partial")
    need = bench.estimate_peak_bytes(config, [quant], max(tokens), accelerator=layer.device.type != "cpu")
    have = available_memory_bytes(layer.device)
    if need > have:
        raise MemoryError(f"{name} needs about {need / 2**30:.1f} GiB ({quant.name} weights, their kernel layout and "
                          f"temporaries, up to {max(tokens)} tokens) and {layer.device} has {have / 2**30:.1f} GiB "
                          "available; try --ep-size to hold a slice of the experts, a 4-bit --quant, or a smaller "
                          "--preset")
    threads = bench.pin_threads(args.threads)
    print(f"model:   {name}\n{layer.plan.explain()}\n")
    print(f"threads: {threads} ({'--threads' if args.threads else 'default: physical cores available to this process'}"
          f"); estimated peak memory {need / 2**30:.2f} GiB", flush=True)
    # Heartbeats: a real-shape layer takes tens of seconds to draw, convert and check on a small CPU.
    with Heartbeat("preparing weights") as progress:
        weights = ExpertWeights.random(config, quant, seed=args.seed, progress=progress)
    gen = torch.Generator().manual_seed(args.seed + 1)
    bias = (torch.randn(config.num_experts, generator=gen) * bench.CORRECTION_BIAS_STD
            if config.routing.has_correction_bias else None)
    with Heartbeat(f"converting the weights for {layer.plan.experts_cls.name()}"):
        layer.load_weights(weights, correction_bias=bias)
    tol = 1e-4 if config.dtype == torch.float32 else 2e-2 if quant.activation is not None else 1e-2
    print(f"\n{'tokens':>7} {'median':>12} {'min':>12} {'tokens/s':>10} {'rel. error':>11}  verdict (tolerance {tol:g})",
          flush=True)
    failed = False
    for m in tokens:
        x = torch.randn(m, config.hidden_size, generator=gen).to(layer.device, config.dtype)
        logits = torch.randn(m, config.num_experts, generator=gen).to(layer.device)
        with Heartbeat(f"{m} tokens: running, checking against the fp32 reference, timing {args.repeats} repeats"):
            out = layer(x, logits)
            ids_w, ids = route_torch(logits, config.routing, config.top_k, layer.correction_bias)
            ref = reference_moe(x, weights, config, ids_w, ids, quant, config.expert_map(layer.device))
            finite = bool(torch.isfinite(out).all())
            err = float((out.float() - ref).norm() / ref.norm().clamp(min=1e-30)) if finite else float("nan")
            times = []
            for _ in range(args.repeats):
                synchronize(layer.device)
                t0 = time.perf_counter()
                layer(x, logits)
                synchronize(layer.device)
                times.append(time.perf_counter() - t0)
        timing = bench.summarize_timings(times)
        bench.warn_if_unsteady(f"{m} tokens", timing)
        ok = finite and err < tol
        failed |= not ok
        verdict = "ok" if ok else "FAILED" if finite else "FAILED (NaN or Inf in the output)"
        print(f"{m:>7} {timing.median * 1e3:>10.3f}ms {timing.min * 1e3:>10.3f}ms {m / timing.median:>10.0f} "
              f"{err:>11.2e}  {verdict}", flush=True)
    return 1 if failed else 0


# ---- subcommands of plugins ----------------------------------------------------------------

_CORE_COMMANDS = ("doctor", "explain", "run", "bench")


def _plugin_commands() -> dict:
    """`moe NAME` -> (plugin status, CommandRef) of the installed plugins; a name two plugins (or a plugin
    and core) claim raises ValueError naming them."""
    found = registry().commands()
    for name in _CORE_COMMANDS:
        if name in found:
            raise ValueError(f"plugin {found[name][0].name} ({found[name][0].distribution}) contributes "
                             f"`moe {name}`, which is a moe-core command")
    return found


def build_parser(commands: dict | None = None) -> argparse.ArgumentParser:
    commands = _plugin_commands() if commands is None else commands
    p = argparse.ArgumentParser(prog="moe", description="Fused Mixture-of-Experts kernels behind an explainable "
                                "backend oracle.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("doctor", help="distributions, devices, plugin status, validated hardware")
    d.add_argument("--json", action="store_true", help="machine-readable report")
    d.add_argument("--require", action="append", default=[], choices=[pl.value for pl in Platform],
                   metavar="DEVICE", help="exit 1 unless DEVICE (cpu, cuda, rocm, xpu) is present and has a ready "
                   "backend; repeatable")
    d.set_defaults(func=cmd_doctor)

    e = sub.add_parser("explain", help="the backend candidate table for a model shape, scheme and device, and "
                       "the expert-parallel mode and placement")
    _add_layer_args(e, default_preset=DEFAULT_PRESET)
    e.add_argument("--parallel", choices=["replicate", "all_to_all"], default=None,
                   help="expert-parallel mode with --ep-size > 1 (default: replicate)")
    e.add_argument("--payload", choices=["bf16", "fp8"], default=None,
                   help="all_to_all dispatch payload (default: the layer dtype)")
    e.add_argument("--fixed-slots", action="store_true", help="all_to_all with fixed slots (CUDA-graph capturable)")
    e.add_argument("--placement", choices=["contiguous", "balanced"], default="contiguous",
                   help="expert placement over the --ep-size ranks (balanced: from --expert-loads)")
    e.add_argument("--expert-loads", metavar="PATH", help="JSON list of per-expert loads for --placement balanced")
    e.add_argument("--redundant", type=int, default=0, help="extra copies of hot experts (balanced, all_to_all)")
    e.add_argument("--tokens", type=int, default=None, metavar="M",
                   help="the token count the layer is mostly called with: where a measured ranking covers the "
                        "device, that count's bucket orders the backends (default: every measured count)")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_explain)

    r = sub.add_parser("run", help="select, build a layer with random weights of the preset's real shape, run, "
                       "verify against the fp32 reference and time it")
    _add_layer_args(r, default_preset=DEFAULT_PRESET)
    r.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128],
                   help="token counts, each >= 1 (default 1 16 128)")
    r.add_argument("--repeats", type=int, default=5, help="timed repeats per token count, >= 1 (median and min "
                   "reported)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs, >= 0")
    bench.add_threads_argument(r)
    r.set_defaults(func=cmd_run)

    b = sub.add_parser("bench", help="time per layer vs the roofline floor and a naive per-expert loop; table + PNG")
    bench.add_arguments(b)
    b.set_defaults(func=bench.main)

    # Listed for `moe --help`; `main` hands `moe NAME ...` to the plugin's own parser (its --help too).
    for name, (status, ref) in sorted(commands.items()):
        sub.add_parser(name, help=f"{ref.help} (from {status.distribution})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        commands = _plugin_commands()
    except ValueError as exc:
        print(f"moe: error: {exc}", file=sys.stderr)
        return 2
    if argv[:1] and argv[0] in commands:
        return registry().load_command(commands[argv[0]][1])(argv[1:])
    args = build_parser(commands).parse_args(argv)
    try:
        return args.func(args)
    except (BackendUnavailableError, NoBackendError, ValueError, MemoryError) as exc:
        return _user_error(args, exc, str(exc))
    except BrokenPipeError:  # stdout closed early (`moe ... | head`): nothing left to say
        with contextlib.suppress(OSError, ValueError):  # nor at exit, when Python flushes stdout
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # a file named on the command line that cannot be read or written
        return _user_error(args, exc, f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
    except KeyboardInterrupt:
        print(f"moe {args.command}: interrupted", file=sys.stderr)
        return 130


def _user_error(args, exc: Exception, message: str) -> int:
    """Exit 2 with `moe CMD: error: MESSAGE` on stderr; under --json, stdout gets the error as JSON too
    (explain's with the candidate table), so a script reading stdout never sees nothing."""
    print(f"moe {args.command}: error: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        report = {"error": {"kind": type(exc).__name__, "message": message}}
        if args.command == "explain":
            report["candidates"] = _refusal_candidates(args)
        print(json.dumps(report, indent=2))
    return 2


def _refusal_candidates(args) -> list[dict]:
    """The candidate rows of a layer that was refused (the oracle's errors carry only their text):
    the verdicts with the reference forced, which serves every layer, its own row as when not forced.
    Empty when the layer itself cannot be described (a bad preset, scheme or config)."""
    try:
        config, quant, _ = _layer_from_args(args)
        plan = select(config, quant, args.device, REFERENCE_BACKEND)
    except (BackendUnavailableError, NoBackendError, ValueError, OSError):
        return []
    rows = []
    for c in plan.candidates:
        row = {**c.to_dict(), "chosen": False}
        if c.backend == REFERENCE_BACKEND:
            row.update(ok=False, reason="never chosen automatically (prefer='reference' to use it)")
        elif c.ok:
            row["reason"] = "supported"
        rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
