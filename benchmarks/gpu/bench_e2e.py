"""End to end, as users see it: a transformers model of a real MoE shape, random weights on the GPU.

One process per (model, experts, mode), so each starts from a fresh GPU and a crash of one cannot hide
another's numbers. experts: `transformers` (its default experts implementation) or a scheme that
`fuse()` runs on the triton backend (bf16, int4, int8, fp8-block, fp8-channel, mxfp4). mode: `eager`
(`generate` as it is), `compiled` (a static cache, and `generate` compiling the model's call in
--compile-mode, "reduce-overhead" by default, as transformers compiles decode: `compile_for_generate`),
or `graphed` (no generate: a static cache and one decode step, forward + argmax, captured whole in a
CUDA graph and replayed, as engines that graph their decode run it; the replayed step's logits are
checked against the same step run eagerly).

Measured: prefill of one 2048-token sequence (tokens/s, median of 3 after a warm-up); greedy decode of
NEW tokens after a 16-token prompt at batch 1, 16 and 64 (ms per step from two `generate` calls of
different lengths, median of 3 each, so the prompt's prefill cancels; compiled, both into one static
cache); peak GPU memory of the whole run
and of `fuse()`; the relative L2 error of the prefill's last 16 positions' logits against the transformers run of the
same model (same seed, same weights), when that run saved them (in /tmp/moe-e2e, on the same machine).

    python3 bench_e2e.py --model qwen3-30b-a3b --experts bf16 --mode eager --out DIR [--layers N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from hf_models import build_model

PREFILL = 2048
PROMPT = 16
BATCHES = (1, 16, 64)
LOGIT_POSITIONS = 16
SCRATCH = Path("/tmp/moe-e2e")  # the transformers run's logits, for the fused runs of the same machine


def median_seconds(fn, repeats: int = 3) -> float:
    """Median wall time of `fn` over `repeats` calls after a warm-up one, the device drained around each."""
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def generate_greedy(model, ids: torch.Tensor, new: int, cache=None) -> torch.Tensor:
    """Greedy decode of `new` tokens; into `cache` (reset first) where given."""
    if cache is not None:
        cache.reset()
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=0, past_key_values=cache)


def static_cache(model, length: int):
    """transformers' StaticCache of up to `length` tokens a sequence (its layers allocate on the first
    update, with that call's batch size: one cache serves one batch size)."""
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=length)


def decode_cache(model, new: int):
    """The static cache the timed `generate_greedy` calls of a batch write into: the prompt and up to
    2 + `new` tokens (both timed lengths replay one compiled step)."""
    return static_cache(model, PROMPT + 2 + new)


def compile_for_generate(model, mode: str) -> None:
    """Decode compiled the way transformers compiles it: given a static cache, `generate` compiles the
    model's call itself (`GenerationConfig.compile_config`, once). Compiling `model.forward` by hand as
    well would nest a second compile inside generate's."""
    from transformers import CompileConfig

    model.generation_config.compile_config = CompileConfig(mode=mode)


def graphed_decode(model, prompt: torch.Tensor, new: int) -> dict:
    """One decode step (forward, greedy argmax, position + 1) captured whole in a CUDA graph over a
    static cache, as engines that graph their decode run a model, then `new` steps timed as replays.

    Checked first: the replayed step's logits against the same step run eagerly on the same cache
    (relative L2). Returns ms per step and that error, or the reason the capture failed."""
    length = prompt.shape[1]
    dev = prompt.device
    cache = static_cache(model, length + new + 8)
    host_counted = [type(layer).__name__ for layer in cache.layers if hasattr(layer, "cumulative_length_int")]
    if host_counted:  # a captured step would replay the window decisions of the step it captured
        return {"error": f"static cache layers {sorted(set(host_counted))} keep their length on the host "
                         "(sliding windows): one captured step cannot serve later steps"}
    with torch.inference_mode():
        out = model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(length, device=dev),
                    use_cache=True)
        ids = out.logits[:, -1:].argmax(-1)
        position = torch.full((1,), length, dtype=torch.long, device=dev)

        def step() -> torch.Tensor:
            return model(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True).logits

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: kernels compiled, the fused blocks' first calls made
            for _ in range(2):
                ids.copy_(step()[:, -1:].argmax(-1))
                position.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        start_ids, start_position = ids.clone(), position.clone()
        # transformers' static cache layers place each update by a device counter of their own
        # (`cumulative_length`, advanced in place), not by cache_position: the replay checked below
        # must start from the counters this eager step starts from.
        counters = [layer.cumulative_length for layer in cache.layers
                    if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
        start_counters = [c.clone() for c in counters]
        expected = step().float()  # this step run eagerly
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                logits = step()
                ids.copy_(logits[:, -1:].argmax(-1))
                position.add_(1)
        except Exception as exc:  # say how it failed
            return {"error": f"{type(exc).__name__}: {exc}"[:400]}
        ids.copy_(start_ids)
        position.copy_(start_position)
        for counter, start in zip(counters, start_counters):
            counter.copy_(start)
        graph.replay()  # the same step again, replayed: the cache slot is rewritten with the same values
        error = float((logits.float() - expected).norm() / expected.norm())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(new):
            graph.replay()
        torch.cuda.synchronize()
        return {"ms_per_step": round((time.perf_counter() - t0) / new * 1e3, 3), "replay_logits_rel_err": error}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--experts", required=True)
    parser.add_argument("--mode", choices=["eager", "compiled", "graphed"], default="eager")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the real model's)")
    parser.add_argument("--new", type=int, default=16, help="decode steps timed")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help="decode batch sizes")
    parser.add_argument("--compile-mode", default="reduce-overhead", help="torch.compile mode of --mode compiled")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    row: dict = {"model": args.model, "experts": args.experts, "mode": args.mode, "device": torch.cuda.get_device_name(),
                 "torch": torch.__version__}
    import transformers

    row["transformers"] = transformers.__version__
    mode = args.mode if args.mode != "compiled" else f"compiled-{args.compile_mode}"
    row["mode"] = mode
    model_tag = args.model if args.layers is None else f"{args.model}-{args.layers}l"
    path = args.out / f"e2e-{model_tag}-{args.experts}-{mode}.json"

    def save() -> None:
        path.write_text(json.dumps(row, indent=1))

    t0 = time.perf_counter()
    model = build_model(args.model, args.layers, dev)
    row["layers"] = model.config.num_hidden_layers
    row["build_s"] = round(time.perf_counter() - t0, 1)
    row["model_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
    if args.experts != "transformers":
        from layer_timing import layer_quant

        from moe_core.integrations.transformers import fuse
        from moe_core.presets import get_preset

        preset = get_preset(args.model if args.model != "gpt-oss-20b" else "gpt-oss-120b")
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        report = fuse(model, quant=layer_quant(preset, args.experts), prefer="triton")
        torch.cuda.synchronize()
        row["fuse_s"] = round(time.perf_counter() - t0, 1)
        row["fuse_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        row["fused_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
        row["backend"] = report.layers[0].plan.backend
    if args.mode == "compiled":
        compile_for_generate(model, args.compile_mode)
    save()
    torch.cuda.reset_peak_memory_stats()
    gen = torch.Generator(device=dev).manual_seed(0)
    vocab = model.config.vocab_size
    with torch.inference_mode():
        ids = torch.randint(0, vocab, (1, PREFILL), device=dev, generator=gen)
        if args.mode == "eager":
            seconds = median_seconds(lambda: model(input_ids=ids, use_cache=False))
            row["prefill_tokens_per_s"] = round(PREFILL / seconds, 1)
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=LOGIT_POSITIONS).logits.float()
            ref_path = SCRATCH / f"logits-{model_tag}.pt"  # not under --out: that comes back from the device
            if args.experts == "transformers":
                torch.save(logits.cpu(), ref_path)
            elif ref_path.exists():
                ref = torch.load(ref_path).to(dev)
                row["logits_rel_err"] = float((logits - ref).norm() / ref.norm())
            save()
        for batch in args.batches:
            prompt = torch.randint(0, vocab, (batch, PROMPT), device=dev, generator=gen)
            if args.mode == "graphed":
                result = graphed_decode(model, prompt, args.new)
                row.update({f"decode_b{batch}_{k}": v for k, v in result.items()})
                if "ms_per_step" in result:
                    row[f"decode_b{batch}_tokens_per_s"] = round(batch / result["ms_per_step"] * 1e3, 1)
                save()
                continue
            # Compiled: one static cache of one length for both runs, so they replay the same compiled
            # step (a cache per generate call, of its own length, would compile or record anew).
            cache = decode_cache(model, args.new) if args.mode == "compiled" else None
            try:
                short = median_seconds(lambda p=prompt, c=cache: generate_greedy(model, p, 2, c))
                long = median_seconds(lambda p=prompt, c=cache: generate_greedy(model, p, 2 + args.new, c))
                if args.mode == "compiled":
                    row["generate_compiled_its_call"] = hasattr(model, "_compiled_call")
            except Exception as exc:  # say how it failed, measure the rest
                row[f"decode_b{batch}_error"] = f"{type(exc).__name__}: {exc}"[:400]
                save()
                continue
            step = (long - short) / args.new
            row[f"decode_b{batch}_ms_per_step"] = round(step * 1e3, 2)
            row[f"decode_b{batch}_tokens_per_s"] = round(batch / step, 1)
            save()
    row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    save()
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
