"""What the vendor-parity scripts share: the run over presets and token counts (the moe-cuda layer,
its vendor's flow on the same packed weights and moe-triton's layer, compared and timed side by
side), calling a library operator by its arguments' names, and the kernels one eager call launches."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
import triton
from layer_timing import input_sets, time_layer

from moe_core import FusedMoE
from moe_core.presets import Preset, get_preset
from moe_core.quant import MoEQuantConfig
from moe_core.weights.canonical import ExpertWeights

Flow = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def call_by_schema(op, values: dict, aliases: dict[str, str] | None = None):
    """Call a library operator whose argument list changed between versions, by argument name: each
    schema argument takes `values[name]` (or `values[aliases[name]]`); an argument with a default and
    no value ends the call; one without a default and no value is an error naming the schema."""
    schema = op.default._schema
    aliases = aliases or {}
    args = []
    for arg in schema.arguments:
        name = arg.name if arg.name in values else aliases.get(arg.name)
        if name in values:
            args.append(values[name])
        elif arg.has_default_value():
            break
        else:
            raise RuntimeError(f"{schema}: no value for argument {arg.name!r}")
    return op(*args)


def kernels(fn, *inputs: torch.Tensor) -> list[tuple[str, float]]:
    """(name, us) of each kernel one eager call of `fn` runs, after one call to warm it up."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*inputs)
        torch.cuda.synchronize()
    return [(e.name[:90], round(e.device_time_total, 2)) for e in prof.events() if e.device_type == DeviceType.CUDA]


def parser(doc: str, presets: tuple[str, ...] = ("qwen3-30b-a3b", "mixtral-8x7b")) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=list(presets))
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 512, 2048])
    p.add_argument("--kernels", action="store_true", help="list each one's kernels per cell")
    p.add_argument("--out", type=Path, required=True)
    return p


def run_parity(args: argparse.Namespace, cases: list[tuple[str, str, MoEQuantConfig]], backend: str,
               peer_of: Callable[[FusedMoE], Flow], names: tuple[str, str]) -> list[dict]:
    """For each (preset, scheme label, scheme) and token count: the `backend` layer and `peer_of(layer)`
    (the vendor's flow on its packed weights) compared (relative L2 of the outputs) and timed with
    moe-triton's layer on the same weights, under the benchmark protocol (`layer_timing.time_layer`).
    Row keys: `{ours}_us`, `{peer}_us`, `triton_us`, `{ours}_over_{peer}` for `names` = (ours, peer)."""
    ours_name, peer_name = names
    dev = torch.device("cuda")
    rows = []
    for preset_name, label, quant in cases:
        preset: Preset = get_preset(preset_name)
        weights = ExpertWeights.random(preset.config, quant, seed=0, device=dev)
        # Graphs off: the benchmark captures each layer itself, and the kernel lists need plain calls.
        ours = FusedMoE(preset.config, quant, device=dev, prefer=backend, cuda_graphs=False)
        ours.load_weights(weights)
        triton_layer = FusedMoE(preset.config, quant, device=dev, prefer="triton", cuda_graphs=False)
        triton_layer.load_weights(weights)
        del weights
        peer = peer_of(ours)
        for tokens in args.tokens:
            inputs = input_sets(preset, tokens, dev)
            x, logits = inputs[0]
            with torch.inference_mode():
                a, b = ours(x, logits).float(), peer(x, logits).float()
            row = {"preset": preset_name, "scheme": label, "tokens": tokens,
                   "output_rel_diff": float((a - b).norm() / b.norm())}
            for key, fn in ((f"{ours_name}_us", ours), (f"{peer_name}_us", peer), ("triton_us", triton_layer)):
                row[key] = round(time_layer(fn, inputs)["us"], 2)
            row[f"{ours_name}_over_{peer_name}"] = round(row[f"{ours_name}_us"] / row[f"{peer_name}_us"], 3)
            if args.kernels:
                row["kernels"] = {ours_name: kernels(ours, x, logits), peer_name: kernels(peer, x, logits)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
        del ours, triton_layer, peer
        torch.cuda.empty_cache()
    return rows


def write_result(path: Path, rows: list[dict], **extra) -> None:
    """The run's JSON (device, versions, `extra`, rows), then each row's kernel lists printed."""
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              **extra, "rows": rows}
    path.write_text(json.dumps(result, indent=1))
    for row in rows:
        for who, ks in row.get("kernels", {}).items():
            print(f"{row['preset']} {row['scheme']} M={row['tokens']} {who}: " + "; ".join(f"{n} {us}" for n, us in ks))
