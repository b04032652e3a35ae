"""Load a real-shape Qwen3-30B-A3B GPTQ int4 checkpoint with `from_pretrained`, then generate.

    python benchmarks/gpu/bench_load_checkpoint.py [--dir /tmp/qwen3-30b-a3b-gptq] [--layers 48] [--out DIR]
                                                   [--device cuda|cpu] [--profile FILE]
                                                   [--format gptq|fp8|ct-w4a16|mxfp4]

--format other than gptq writes that format's checkpoint with bench_checkpoint_loaders.py's writer
(fine-grained fp8 and compressed-tensors W4A16 at qwen3-30b-a3b's shape, MXFP4 at gpt-oss-20b's) and
measures its load the same way; the bound's 16-bit expert tensor is that checkpoint's w13.

1. write (skipped where --dir already holds it): config.json of Qwen3-30B-A3B (48 layers, 128 experts,
   top-8, hidden 2048, expert width 768, vocab 151936) with GPTQ int4 (group 128, sym, v1 zeros), its
   experts drawn directly in GPTQ's packing (`moe_core.weights.writers.random_gptq_int4_tensors`), its
   attention linears quantized from random bf16 (`quantized_linear_tensors`), as the published
   GPTQ checkpoint has them; one safetensors shard per layer plus an index;
2. load, in a fresh process: `from_pretrained(dir, device="cuda", dtype=torch.bfloat16)` (or
   `--device cpu`: the load's time and host memory only); wall time,
   peak host memory (peak anonymous RSS sampled every 20 ms: the process's own allocations; file pages
   the memory-mapped shards leave resident are reported apart, the kernel reclaims them), against the
   RSS once loaded (what imports, compiled kernels and the CUDA libraries keep; peak - after is what
   the load held only while loading), peak GPU
   memory (torch.cuda.max_memory_allocated) against the model's own size after loading, and the bound:
   the loaded model plus one layer's largest expert tensor in 16 bits (w13, 128 x 1536 x 2048 x 2 B);
3. generate: greedy decoding from a random 16-token prompt, 1 and 33 new tokens, decode tokens/s from
   the difference: once as the first request reaching those cache lengths (after a 4-token warm-up),
   then warm, under bench_e2e.py's protocol (median of 3 after a warm-up call). Weights are random, so
   the tokens mean nothing: this measures the path, not quality.

Prints a table and writes DIR/load_checkpoint_<device>.json where --out is given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

E, TOP_K, K, N, HEADS, KV_HEADS, HEAD_DIM, VOCAB, GROUP = 128, 8, 2048, 768, 32, 4, 128, 151936, 128


def config(layers: int) -> dict:
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": K,
        "intermediate_size": 6144, "moe_intermediate_size": N, "num_experts": E, "num_experts_per_tok": TOP_K,
        "num_hidden_layers": layers, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "vocab_size": VOCAB, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "tie_word_embeddings": False, "dtype": "bfloat16",
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "sym": True,
                                "desc_act": False, "checkpoint_format": "gptq"},
    }


def write(directory: Path, layers: int) -> None:
    import torch
    from safetensors.torch import save_file

    from moe_core.quant import int4_w4a16
    from moe_core.weights.writers import quantized_linear_tensors, random_gptq_int4_tensors

    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    key = int4_w4a16(GROUP, scale_dtype="fp16").weight
    weight_map = {}

    def shard(name: str, tensors: dict) -> None:
        save_file({k: v.contiguous() for k, v in tensors.items()}, directory / name)
        weight_map.update(dict.fromkeys(tensors, name))

    start = time.perf_counter()
    shard("model-dense.safetensors", {
        "model.embed_tokens.weight": (torch.randn(VOCAB, K, generator=gen) * 0.02).bfloat16(),
        "lm_head.weight": (torch.randn(VOCAB, K, generator=gen) * K**-0.5).bfloat16(),
        "model.norm.weight": torch.ones(K, dtype=torch.bfloat16)})
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors = {f"{p}.input_layernorm.weight": torch.ones(K, dtype=torch.bfloat16),
                   f"{p}.post_attention_layernorm.weight": torch.ones(K, dtype=torch.bfloat16),
                   f"{p}.self_attn.q_norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
                   f"{p}.self_attn.k_norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
                   f"{p}.mlp.gate.weight": (torch.randn(E, K, generator=gen) * K**-0.5).bfloat16()}
        for proj, out, inp in (("q_proj", HEADS * HEAD_DIM, K), ("k_proj", KV_HEADS * HEAD_DIM, K),
                               ("v_proj", KV_HEADS * HEAD_DIM, K), ("o_proj", K, HEADS * HEAD_DIM)):
            w = torch.randn(out, inp, generator=gen) * inp**-0.5
            tensors.update(quantized_linear_tensors(w, f"{p}.self_attn.{proj}", "gptq", key))
        tensors.update(random_gptq_int4_tensors(f"{p}.mlp.experts", E, K, N, GROUP, gen))
        shard(f"model-layer{i:03d}.safetensors", tensors)
        print(f"wrote layer {i + 1}/{layers} ({time.perf_counter() - start:.0f}s)", flush=True)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config(layers), indent=2))  # last: marks it complete


class HostMemory:
    """Peak RssAnon and RssFile of this process (/proc/self/status), sampled on a thread every
    `interval_s` seconds while the context is open."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[str, int]:
        values = {}
        with open("/proc/self/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in self.peak:
                    values[name] = int(rest.split()[0]) * 1024
        return values

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for name, v in self.sample().items():
                self.peak[name] = max(self.peak[name], v)

    def __enter__(self) -> HostMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def load(directory: Path, profile_to: Path | None, device: str) -> dict:
    import cProfile
    import logging
    import pstats

    import torch

    from moe_core.integrations.transformers import from_pretrained

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")  # progress per layer

    cuda = device == "cuda"
    if cuda:
        torch.cuda.init()
        torch.empty(1, device="cuda")  # CUDA context outside the measured window
        torch.cuda.reset_peak_memory_stats()
    memory = HostMemory()
    before = memory.sample()
    profiler = cProfile.Profile() if profile_to else None
    with memory:
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        model = from_pretrained(directory, device=device, dtype=torch.bfloat16)
        if cuda:
            torch.cuda.synchronize()
        load_s = time.perf_counter() - start
        after = memory.sample()
    if profiler:
        profiler.disable()
        with open(profile_to, "w") as f:
            pstats.Stats(profiler, stream=f).sort_stats("cumulative").print_stats(60)
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "transformers": __import__("transformers").__version__, "layers": model.config.num_hidden_layers,
              "backends": sorted({f"{layer.backend}/{layer.plan.experts_cls.name()}"
                                  for layer in model.fuse_report.layers}),
              "load_s": load_s, "host_anon_before": before["RssAnon"], "host_anon_peak": memory.peak["RssAnon"],
              "host_anon_after": after["RssAnon"], "host_file_peak": memory.peak["RssFile"],
              "bound_16bit_expert_tensor": w13_16bit_bytes(model.config)}
    if cuda:  # generate at real shapes is for the GPU; the CPU run measures the load's memory
        result.update(gpu_peak=torch.cuda.max_memory_allocated(), gpu_model=torch.cuda.memory_allocated(),
                      **generate_timings(model, profile_to is not None))
    return result


def w13_16bit_bytes(config) -> int:
    """One layer's gate/up expert tensor in 16 bits: experts x 2 x intermediate x hidden x 2 bytes."""
    experts = getattr(config, "num_experts", None) or config.num_local_experts
    width = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    return experts * 2 * width * config.hidden_size * 2


def generate_timings(model, profile: bool) -> dict:
    """Decode of the loaded model at batch 1: the first request reaching new cache lengths, then warm."""
    import torch
    from bench_e2e import generate_greedy, median_seconds

    ids = torch.randint(0, model.config.vocab_size, (1, 16), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    times = {}
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up: kernels compiled, graphs captured
        for new in (1, 33):  # the first generate that reaches these cache lengths
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
            torch.cuda.synchronize()
            times[new] = time.perf_counter() - start
        warm_step_s = (median_seconds(lambda: generate_greedy(model, ids, 33))
                       - median_seconds(lambda: generate_greedy(model, ids, 1))) / 32
    decode_profile = None
    if profile:  # where the decode step's time goes (profile_decode.py's summary)
        from profile_decode import profile_generate

        decode_profile = profile_generate(model, ids, 8)
    return {"prefill_1_token_s": times[1], "first_decode_tokens_per_s": 32 / (times[33] - times[1]),
            "decode_tokens_per_s": 1 / warm_step_s, "tokens": out[0, 16:].tolist(), "decode_profile": decode_profile}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/qwen3-30b-a3b-gptq"))
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None,
                        help="write cProfile statistics of the load here, and profile a decode step (in the JSON)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="where the model loads (cpu: the load's time and host memory only, no generate)")
    parser.add_argument("--format", choices=["gptq", "fp8", "ct-w4a16", "mxfp4"], default="gptq",
                        help="the checkpoint written (default: GPTQ int4, written here)")
    parser.add_argument("--phase", choices=["all", "load"], default="all", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "load":
        print("RESULT " + json.dumps(load(args.dir, args.profile, args.device)), flush=True)
        return
    if not (args.dir / "config.json").exists():
        if args.format == "gptq":
            write(args.dir, args.layers)
        else:
            from bench_checkpoint_loaders import write as write_format

            write_format(args.format, args.dir, args.layers, "cuda" if args.device == "cuda" else "cpu")
    # a fresh process: the writer's memory must not count in the loader's peak. Its log (progress per
    # layer) passes through as it comes, so a load stopped midway still says how far it got.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, __file__, "--dir", str(args.dir), "--phase", "load", "--device", args.device]
    if args.profile:
        command += ["--profile", str(args.profile)]
    proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.exit(f"the load process failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    r = json.loads(lines[-1].removeprefix("RESULT "))
    gib = 2**30
    transient = r["host_anon_peak"] - r["host_anon_after"]
    rows = [
        ("device", r["device"]), ("torch / transformers", f"{r['torch']} / {r['transformers']}"),
        ("layers, backend", f"{r['layers']}, {', '.join(r['backends'])}"),
        ("load time", f"{r['load_s']:.1f} s"),
        ("host: anonymous RSS before / peak / after",
         f"{r['host_anon_before'] / gib:.2f} / {r['host_anon_peak'] / gib:.2f} / {r['host_anon_after'] / gib:.2f} GiB "
         f"(peak - after {transient / gib:.2f}: the load's transient; one 16-bit w13 "
         f"{r['bound_16bit_expert_tensor'] / gib:.2f})"),
        ("host: file-backed RSS peak (mmapped shards)", f"{r['host_file_peak'] / gib:.2f} GiB"),
    ]
    if "gpu_model" in r:
        bound = (r["gpu_model"] + r["bound_16bit_expert_tensor"]) / gib
        rows += [
            ("GPU: model after load", f"{r['gpu_model'] / gib:.2f} GiB"),
            ("GPU: peak during load", f"{r['gpu_peak'] / gib:.2f} GiB (bound {bound:.2f})"),
            ("generate: 16-token prompt, 1 new token", f"{r['prefill_1_token_s'] * 1e3:.0f} ms"),
            ("generate: decode, first request", f"{r['first_decode_tokens_per_s']:.1f} tokens/s (batch 1)"),
            ("generate: decode, warm", f"{r['decode_tokens_per_s']:.1f} tokens/s (batch 1)"),
        ]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"{name.ljust(width)}  {value}" for name, value in rows))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = r["device"].replace(" ", "_")
        tag = "" if args.format == "gptq" else f"{args.format}_"
        (args.out / f"load_checkpoint_{tag}{name}.json").write_text(json.dumps({"format": args.format, **r}, indent=2))


if __name__ == "__main__":
    main()
