"""A/B of whole layers on one GPU: variants of the code alternated in one process, timed by the benchmark's protocol.

A variant is a name and the changes it makes, `NAME=CHANGE[,CHANGE...]` (a bare `NAME`: no change):
- `ENV=VALUE`: an environment variable set while the variant's layer is built and timed;
- `module:function`: a patch, `function(layer, tokens)` returning a context manager that is entered
  around the variant's output check and each of its timings (CUDA graph capture included), e.g.

      # my_patch.py, in the working directory or on PYTHONPATH
      from unittest import mock
      import moe_triton.routing

      def bigger_blocks(layer, tokens):
          return mock.patch.object(moe_triton.routing, "SOME_CONSTANT", 256)

  (contextlib.contextmanager turns a generator into one; `layer.experts.config_override`, set from
  `layer.experts.config_for(tokens).config`, forces launch shapes).

Each variant gets its own `FusedMoE` (layer_timing.py: the benchmark's layer) over the same canonical
weights; bf16 layers share their weights, quantized ones hold one kernel copy each. Per cell (preset x
dtype x M) the first variant is the baseline: each other variant's output on the first input set is
compared with it (bitwise, and the relative L2 difference), then the variants are timed in turn for
--rounds rounds, every other round in reverse order so that a drift of the clocks falls on all alike.
Reported per variant: the median and best of its rounds, baseline median / its median (>1: faster),
and the median SM clock.

    python benchmarks/gpu/ab_layer.py --preset qwen3-30b-a3b --dtype int4 --m 1 8 32 --rounds 5 \
        --variant shipped --variant new=my_patch:bigger_blocks [--out ab.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import torch
from layer_timing import AB_DTYPES, build_layer, input_sets, mhz, random_weights, time_layer

from moe_core.presets import PRESETS, get_preset

Patch = Callable[..., contextlib.AbstractContextManager]


@dataclass
class Variant:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    patches: list[tuple[str, Patch]] = field(default_factory=list)

    def describe(self) -> str:
        return ", ".join([f"{k}={v}" for k, v in self.env.items()] + [spec for spec, _ in self.patches]) or "as is"

    def environment(self) -> contextlib.AbstractContextManager:
        return mock.patch.dict(os.environ, self.env)

    @contextlib.contextmanager
    def active(self, layer, tokens: int):
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.environment())
            for _, patch in self.patches:
                stack.enter_context(patch(layer, tokens))
            yield


def load_patch(spec: str) -> Patch:
    """`module:function` -> the function; the working directory is importable."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise ValueError(f"patch {spec!r}: expected module:function")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    return getattr(importlib.import_module(module_name), function_name)


def parse_variant(text: str) -> Variant:
    """`NAME`, or `NAME=CHANGE[,CHANGE...]` with each change `ENV=VALUE` or `module:function`."""
    name, _, changes = text.partition("=")
    if not name:
        raise ValueError(f"variant {text!r}: expected NAME[=CHANGE,...]")
    variant = Variant(name)
    for change in filter(None, changes.split(",")):
        if "=" in change:
            key, _, value = change.partition("=")
            variant.env[key] = value
        else:
            variant.patches.append((change, load_patch(change)))
    return variant


def compare_outputs(layers: dict[str, object], variants: list[Variant], x, logits, tokens: int) -> dict[str, dict]:
    outputs = {}
    for v in variants:
        with v.active(layers[v.name], tokens):
            outputs[v.name] = layers[v.name](x, logits).float()
    base = outputs[variants[0].name]
    return {name: {"bitwise_equal": bool(torch.equal(out, base)),
                   "rel_l2": float((out - base).norm() / base.norm().clamp(min=1e-30))}
            for name, out in outputs.items()}


def run_cell(layers: dict[str, object], variants: list[Variant], preset, tokens: int, rounds: int,
             dev: torch.device) -> dict:
    inputs = input_sets(preset, tokens, dev)
    checks = compare_outputs(layers, variants, *inputs[0], tokens)
    samples: dict[str, list[dict]] = {v.name: [] for v in variants}
    for r in range(rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            with v.active(layers[v.name], tokens):
                samples[v.name].append(time_layer(layers[v.name], inputs))
    base = statistics.median(s["us"] for s in samples[variants[0].name])
    results = {}
    for v in variants:
        us = [s["us"] for s in samples[v.name]]
        clocks = [s["sm_clock_mhz"] for s in samples[v.name] if s["sm_clock_mhz"] is not None]
        results[v.name] = {"median_us": statistics.median(us), "best_us": min(us), "us": us,
                           "speedup_vs_baseline": base / statistics.median(us),
                           "sm_clock_mhz": statistics.median(clocks) if clocks else None, **checks[v.name]}
        config_for = getattr(layers[v.name].experts, "config_for", None)
        if config_for is not None:
            with v.active(layers[v.name], tokens):
                results[v.name]["config"] = str(config_for(tokens))
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", nargs="+", required=True, choices=list(PRESETS))
    p.add_argument("--dtype", nargs="+", default=["bf16"], choices=AB_DTYPES)
    p.add_argument("--m", nargs="+", type=int, required=True, help="token counts")
    p.add_argument("--variant", action="append", required=True, metavar="NAME[=CHANGE,...]",
                   help="repeatable; the first one is the baseline")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, help="JSON file for the results")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    if len({v.name for v in variants}) != len(variants):
        p.error("variant names must differ")
    dev = torch.device("cuda")
    for v in variants:
        print(f"variant {v.name}: {v.describe()}", flush=True)
    cells = []
    for name in args.preset:
        preset = get_preset(name)
        for dtype in args.dtype:
            weights = random_weights(preset, dtype, dev)
            layers = {}
            for v in variants:
                with v.environment():
                    layers[v.name] = build_layer(preset, dtype, dev, weights)
            for tokens in args.m:
                started = time.time()
                results = run_cell(layers, variants, preset, tokens, args.rounds, dev)
                cells.append({"preset": name, "dtype": dtype, "M": tokens, "variants": results})
                print(f"{name} {dtype} M={tokens} ({time.time() - started:.0f} s, {args.rounds} rounds):", flush=True)
                for v in variants:
                    r = results[v.name]
                    agreement = "bitwise equal" if r["bitwise_equal"] else f"rel. L2 {r['rel_l2']:.1e}"
                    print(f"  {v.name:16s} median {r['median_us']:9.1f} us  best {r['best_us']:9.1f}  "
                          f"x{r['speedup_vs_baseline']:.3f}  SM {mhz(r['sm_clock_mhz'])}  {agreement}  "
                          f"{r.get('config', '')}", flush=True)
            del layers, weights
            torch.cuda.empty_cache()
    if args.out is not None:
        payload = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "rounds": args.rounds,
                   "variants": {v.name: v.describe() for v in variants}, "cells": cells}
        args.out.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
