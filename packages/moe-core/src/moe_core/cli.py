"""The `moe` command (also `python -m moe_core`): doctor, explain, run, bench, and the subcommands
that installed plugins contribute (`BackendSpec.commands`, e.g. moe-triton's `moe tune`)."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence

import torch

from moe_core.__about__ import PLUGIN_API, __version__
from moe_core.backends import Platform, available_memory_bytes, detect_device, synchronize
from moe_core.config import MoEConfig, ParallelConfig
from moe_core.hf_config import load_hf_config, moe_config_from_hf, quant_from_hf
from moe_core.oracle import BackendUnavailableError, NoBackendError, select
from moe_core.plugins import PluginState, registry
from moe_core.presets import PRESETS, get_preset
from moe_core.quant import MoEQuantConfig, parse_scheme

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


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
    dists = {"moe-core": __version__}
    for s in reg.statuses.values():
        dists.setdefault(s.distribution, s.version)
    triton_version = None
    if importlib.util.find_spec("triton") is not None:
        try:
            triton_version = md.version("triton")
        except md.PackageNotFoundError:
            triton_version = "unknown"
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


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


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
        print("\nexperts (validated = run for real on that hardware by this project's tests):")
        rows = [["backend", "experts", "validated on", "notes"]]
        for e in report["experts"]:
            val = ", ".join(e["validated_on"]) or "NOT validated on real hardware"
            if e["validated_on"] and e.get("not_validated_on"):
                val += f"; NOT validated on {', '.join(e['not_validated_on'])}"
            rows.append([e["backend"], e["experts"], val, e.get("error", "; ".join(e["limitations"]))])
        _print_table(rows)
        for want, r in report["require"].items():
            print(f"\nrequire {want}: {'ok' if r['ok'] else 'FAILED: ' + r['reason']}")
    return 0 if all(r["ok"] for r in report["require"].values()) else 1


# ---- layer selection from CLI arguments -----------------------------------------------------


def _add_layer_args(p: argparse.ArgumentParser, default_preset: str | None) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", default=default_preset, choices=sorted(PRESETS),
                     help=f"built-in model shape (default: {default_preset})")
    src.add_argument("--config", metavar="PATH", help="a Hugging Face config.json (or its model directory)")
    p.add_argument("--quant", metavar="SCHEME", help="unquantized | int4[:G[:zp]] | int8[:G[:zp]] | fp8-tensor | "
                   "fp8-channel | fp8-block | mxfp4 (default: unquantized for presets, the config's "
                   "quantization_config for --config; int4 without G uses the preset's group size)")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="activation dtype (default bf16)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, xpu (default: cpu for run, else auto)")
    p.add_argument("--backend", default=None, help="force a backend (same as env MOE_BACKEND)")
    p.add_argument("--ep-size", type=int, default=1, help="expert-parallel ranks (the layer holds rank --ep-rank)")
    p.add_argument("--ep-rank", type=int, default=0)


def _layer_from_args(args) -> tuple[MoEConfig, MoEQuantConfig, str]:
    parallel = ParallelConfig(ep_size=args.ep_size, ep_rank=args.ep_rank)
    dtype = _DTYPES[args.dtype] if args.dtype else None
    if args.config:
        hf = load_hf_config(args.config)
        config = moe_config_from_hf(hf, dtype=dtype, parallel=parallel)
        quant = parse_scheme(args.quant) if args.quant else quant_from_hf(hf)
        return config, quant, f"{hf.get('model_type')} ({args.config})"
    if not args.preset:
        raise ValueError("give --preset NAME or --config PATH")
    preset = get_preset(args.preset)
    cfg = preset.config
    config = MoEConfig(cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size, cfg.activation,
                       cfg.routing, dtype or cfg.dtype, parallel, cfg.has_bias, cfg.max_num_tokens)
    scheme = args.quant or "unquantized"
    if scheme in ("int4", "int8"):
        scheme = f"{scheme}:{preset.int4_group_size}"
    return config, parse_scheme(scheme), preset.name


def cmd_explain(args) -> int:
    config, quant, name = _layer_from_args(args)
    plan = select(config, quant, args.device, args.backend)
    if args.json:
        print(json.dumps({"model": name, **plan.to_dict()}, indent=2))
    else:
        print(f"model:   {name}\n{plan.explain()}")
    return 0


# ---- run ------------------------------------------------------------------------------------


class _Progress:
    """Progress on stderr: a redrawn bar on a terminal, a line per quarter in logs (no dependency)."""

    def __init__(self, label: str) -> None:
        self.label, self.start, self.tty = label, time.perf_counter(), sys.stderr.isatty()
        self.quarter = 0

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.perf_counter() - self.start
        if self.tty:
            width = 30
            filled = width * done // total
            end = "\n" if done == total else ""
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                             f"({elapsed:.1f}s){end}")
        elif 4 * done // total > self.quarter:
            self.quarter = 4 * done // total
            sys.stderr.write(f"{self.label}: {done}/{total} ({elapsed:.1f}s)\n")
        sys.stderr.flush()


def _weight_bytes(config: MoEConfig, quant: MoEQuantConfig) -> int:
    params = config.num_local_experts * (config.w13_rows + config.intermediate_size_per_partition) * config.hidden_size
    bits = quant.weight.bits if quant.weight.quantized else torch.finfo(config.dtype).bits
    return params * bits // 8


def cmd_run(args) -> int:
    from moe_core.layer import FusedMoE
    from moe_core.reference import reference_moe
    from moe_core.routing import route_torch
    from moe_core.weights import ExpertWeights

    config, quant, name = _layer_from_args(args)
    device = args.device or "cpu"
    # One process holds one expert-parallel slice: its output is that slice's share of the layer.
    layer = FusedMoE(config, quant, device, args.backend, ep_group="partial")
    print(f"model:   {name}\n{layer.plan.explain()}\n")
    # The canonical copy, the kernel copy and the fp32 reference of one expert at a time must fit.
    need = 2 * _weight_bytes(config, quant)
    have = available_memory_bytes(layer.device)
    if need > have:
        raise MemoryError(f"{name} needs about {need / 2**30:.1f} GiB for its weights ({quant.name}) and "
                          f"{layer.device} has {have / 2**30:.1f} GiB available; try --ep-size to hold a slice "
                          "of the experts, a 4-bit --quant, or a smaller --preset")
    weights = ExpertWeights.random(config, quant, seed=args.seed, progress=_Progress("preparing weights"))
    gen = torch.Generator().manual_seed(args.seed + 1)
    bias = torch.randn(config.num_experts, generator=gen) * 0.1 if config.routing.has_correction_bias else None
    layer.load_weights(weights, correction_bias=bias)
    tol = 1e-4 if config.dtype == torch.float32 else 2e-2 if quant.activation is not None else 1e-2
    print(f"{'tokens':>7} {'time/layer':>12} {'tokens/s':>10} {'rel. error':>11}  verdict (tolerance {tol:g})")
    failed = False
    for m in args.tokens:
        x = torch.randn(m, config.hidden_size, generator=gen).to(layer.device, config.dtype)
        logits = torch.randn(m, config.num_experts, generator=gen).to(layer.device)
        out = layer(x, logits)
        ids_w, ids = route_torch(logits, config.routing, config.top_k, layer.correction_bias)
        ref = reference_moe(x, weights, config, ids_w, ids, quant, config.expert_map(layer.device))
        err = float((out.float() - ref).norm() / ref.norm().clamp(min=1e-30))
        times = []
        for _ in range(args.repeats):
            synchronize(layer.device)
            t0 = time.perf_counter()
            layer(x, logits)
            synchronize(layer.device)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        ok = err < tol
        failed |= not ok
        print(f"{m:>7} {t * 1e3:>10.3f}ms {m / t:>10.0f} {err:>11.2e}  {'ok' if ok else 'FAILED'}")
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

    e = sub.add_parser("explain", help="the backend candidate table for a model shape, scheme and device")
    _add_layer_args(e, default_preset=None)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_explain)

    r = sub.add_parser("run", help="select, build a layer with random weights of the preset's real shape, run, "
                       "verify against the fp32 reference and time it")
    _add_layer_args(r, default_preset="qwen3-30b-a3b")
    r.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128], help="token counts (default 1 16 128)")
    r.add_argument("--repeats", type=int, default=5, help="timed repeats per token count (median reported)")
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(func=cmd_run)

    from moe_core import bench

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
        print(f"moe {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
