"""Several experts implementations of one model in one process, timed in interleaved rounds.

Each variant (`transformers`, its own experts, or a scheme `fuse()` runs) is its own copy of the model,
built from the same seed (the same weights) and held at once. Variant `none` replaces every MoE block
with one that returns zeros (one launch, no experts, no router): the rest of the model's step alone,
the floor under any experts implementation in the same process and mode (its logits are meaningless).
Every round times each variant once, in an order that rotates from round to round, so the host's
drift over a run reaches every variant alike: eager steps are host-bound, and separate processes of
the same variant have differed by 1.3-2x (`benchmarks/results/call_path_2026-11-29.md`). Per
variant: the median over rounds of prefill tokens/s and of ms per decode step, and the median (and
range) over rounds of its speed-up against the first variant named, each round's numbers against that
round's; the memory `fuse()` held above the unfused model at its peak.

Decode at batch B: greedy decode of 2 and of 2 + NEW tokens after a 16-token prompt, the difference
divided by NEW (the prompt's prefill cancels). Mode `compiled`: a static cache per variant and batch,
`generate` compiling decode itself (`bench_e2e.compile_for_generate`); no prefill timed (generate
compiles decode only).

    python3 bench_e2e_interleaved.py --model qwen3-30b-a3b --experts transformers bf16 --rounds 5 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from bench_e2e import BATCHES, PREFILL, PROMPT, compile_for_generate, decode_cache, generate_greedy
from hf_models import build_model


class NoExperts(torch.nn.Module):
    """An MoE block that costs one launch: zeros in the shape of its input (the residual stream
    carries on unchanged)."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return torch.zeros_like(hidden_states)


def without_experts(model: torch.nn.Module) -> None:
    """Swap every MoE block `fuse()` would fuse for `NoExperts`."""
    from moe_core.integrations.transformers import model_table, moe_blocks

    blocks = moe_blocks(model)  # refuses what fuse() refuses
    if model_table()[model.config.model_type].router_output:
        raise SystemExit(f"variant none: {model.config.model_type}'s block also returns its router's output "
                         "(only blocks returning one tensor)")
    for name, _ in blocks:
        model.set_submodule(name, NoExperts())


def rotated(names: list[str], round_index: int) -> list[str]:
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def summarize(samples: dict[str, list[float]], higher_is_faster: bool) -> dict[str, dict]:
    """Per variant: median, and its speed-up against the first variant, round by round."""
    names = list(samples)
    base = samples[names[0]]
    out = {}
    for name, values in samples.items():
        speedups = [(v / b) if higher_is_faster else (b / v) for v, b in zip(values, base)]
        out[name] = {"median": round(statistics.median(values), 3), "samples": [round(v, 3) for v in values],
                     f"speedup_vs_{names[0]}": round(statistics.median(speedups), 3),
                     "speedup_range": [round(min(speedups), 3), round(max(speedups), 3)]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--experts", nargs="+", required=True, help="variants; the first is the baseline")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the real model's)")
    parser.add_argument("--mode", choices=["eager", "compiled"], default="eager")
    parser.add_argument("--compile-mode", default="reduce-overhead", help="torch.compile mode of --mode compiled")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prefill", type=int, default=PREFILL, help="prefill tokens (eager mode)")
    parser.add_argument("--new", type=int, default=16, help="decode steps timed")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prefer", default="triton", help="fuse()'s backend")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if len(set(args.experts)) != len(args.experts):
        parser.error(f"--experts names a variant twice: {args.experts}")
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    import transformers
    from layer_timing import layer_quant

    from moe_core.integrations.transformers import fuse
    from moe_core.presets import get_preset

    preset = get_preset(args.model if args.model != "gpt-oss-20b" else "gpt-oss-120b")
    # One compiled call per variant and batch; dynamo's default limit on recompiles of one code object is 8.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               4 * len(args.experts) * len(args.batches))
    row: dict = {"model": args.model, "mode": args.mode if args.mode == "eager" else f"compiled-{args.compile_mode}",
                 "experts": args.experts, "rounds": args.rounds, "torch": torch.__version__,
                 "transformers": transformers.__version__,
                 "device": torch.cuda.get_device_name() if cuda else args.device}
    models = {}
    # Built smallest-kept first: each variant is built whole in bf16 before fuse() shrinks it, so the
    # quantized ones go first and the 16-bit ones (which keep that size) last.
    for name in sorted(args.experts, key=lambda n: n in ("transformers", "bf16")):
        before = torch.cuda.memory_allocated() if cuda else 0
        model = build_model(args.model, args.layers, dev)
        if name == "none":
            without_experts(model)
        elif name != "transformers":
            built = torch.cuda.memory_allocated() if cuda else 0
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            fuse(model, quant=layer_quant(preset, name), prefer=args.prefer)
            if cuda:  # what fuse() held above the unfused model at its peak (issue: 1.2x the largest layer)
                row.setdefault("fuse_above_model_gib", {})[name] = round(
                    (torch.cuda.max_memory_allocated() - built) / 2**30, 2)
        if args.mode == "compiled":
            compile_for_generate(model, args.compile_mode)
        models[name] = model
        if cuda:
            torch.cuda.empty_cache()
            row.setdefault("model_gib", {})[name] = round((torch.cuda.memory_allocated() - before) / 2**30, 2)
    models = {name: models[name] for name in args.experts}
    row["layers"] = next(iter(models.values())).config.num_hidden_layers
    names = list(models)
    path = args.out / f"e2e-interleaved-{args.model}-{row['layers']}l-{row['mode']}.json"

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    gen = torch.Generator(device=dev).manual_seed(0)
    vocab = next(iter(models.values())).config.vocab_size
    with torch.inference_mode():
        if args.mode == "eager":
            ids = torch.randint(0, vocab, (1, args.prefill), device=dev, generator=gen)
            for model in models.values():  # warm-up: kernels compiled, graphs captured (a signature's 2nd call)
                for _ in range(2):
                    model(input_ids=ids, use_cache=False)
            prefill = {name: [] for name in names}
            for r in range(args.rounds):
                for name in rotated(names, r):
                    seconds = timed(lambda m=models[name]: m(input_ids=ids, use_cache=False))
                    prefill[name].append(args.prefill / seconds)
            row["prefill_tokens_per_s"] = summarize(prefill, higher_is_faster=True)
        for batch in args.batches:
            prompt = torch.randint(0, vocab, (batch, PROMPT), device=dev, generator=gen)
            caches = {name: decode_cache(model, args.new) if args.mode == "compiled" else None
                      for name, model in models.items()}
            for name, model in models.items():  # warm-up: compiled, graphs captured for both lengths
                for _ in range(2):
                    for n in (2, 2 + args.new):
                        generate_greedy(model, prompt, n, caches[name])
            steps = {name: [] for name in names}
            for r in range(args.rounds):
                for name in rotated(names, r):
                    model, cache = models[name], caches[name]
                    short = timed(lambda m=model, c=cache, p=prompt: generate_greedy(m, p, 2, c))
                    long = timed(lambda m=model, c=cache, p=prompt: generate_greedy(m, p, 2 + args.new, c))
                    steps[name].append((long - short) / args.new * 1e3)
            row[f"decode_b{batch}_ms_per_step"] = summarize(steps, higher_is_faster=False)
            path.write_text(json.dumps(row, indent=1))
    if cuda:
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    path.write_text(json.dumps(row, indent=1))
    base = names[0]
    for key in [k for k in row if k.startswith(("prefill", "decode"))]:
        cells = "  ".join(f"{n} {v['median']} ({v[f'speedup_vs_{base}']}x)" for n, v in row[key].items())
        print(f"{key}: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
