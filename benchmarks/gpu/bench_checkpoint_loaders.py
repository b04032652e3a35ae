"""A quantized checkpoint loaded by `moe_core.integrations.transformers.from_pretrained` against the
same checkpoint loaded by transformers itself, end to end on the GPU.

The formats, each one transformers loads itself where its dependencies are present:
- `fp8`: fine-grained block FP8 (`weight_scale_inv`, 128x128 blocks, dynamic activations), the
  layout of Qwen/Qwen3-30B-A3B-FP8, at qwen3-30b-a3b's shape: attention linears and experts in fp8,
  router, norms, embeddings and lm_head in bf16;
- `mxfp4`: gpt-oss's MXFP4 experts (`*_blocks`, `*_scales`, biases) at gpt-oss-20b's shape, the rest
  in bf16 (transformers dequantizes MXFP4 experts to bf16 where its Triton kernels package is absent);
- `ct-w4a16`: compressed-tensors pack-quantized int4 (group 128, symmetric), the layout of
  RedHatAI's Qwen3-30B-A3B W4A16, at qwen3-30b-a3b's shape, packed by compressed-tensors' own
  compressor: attention linears and experts in int4, router, norms, embeddings and lm_head in bf16.
  Needs the compressed-tensors package (not on the GPU image: run_call_path.sh installs the wheels
  carried in .carry/ct-wheels for this job only).

Phases: `write` (random weights drawn and quantized on --device, expert by expert, written as one
safetensors shard per layer plus an index; skipped where DIR already holds config.json), then one
fresh process per loader (`moe`, `transformers`, and for fp8 `transformers-dequantized`:
`FineGrainedFP8Config(dequantize=True)`, the peer where transformers' fp8 kernels cannot load): load
time and peak GPU memory, prefill of one --prefill-token sequence (tokens/s, median of 3), greedy
decode at batch 1 and 16 (ms per step from two `generate` lengths, median of 3 each), the last 16
positions' logits saved beside the checkpoint; the parent compares ours with the first transformers
loader that ran (logits relative L2, speed ratios) and writes one JSON per format under --out. A
loader that fails is reported with its error; the others still run.

    python3 bench_checkpoint_loaders.py --format fp8 --dir /tmp/ckpt-fp8 --layers 8 --out DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PRESETS = {"fp8": "qwen3-30b-a3b", "ct-w4a16": "qwen3-30b-a3b", "mxfp4": "gpt-oss-20b"}
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
LOGIT_POSITIONS = 16
# transformers' fine-grained fp8 path needs the `kernels` package, which fetches its kernels from the Hub;
# where that cannot run (no network), the same checkpoint loaded dequantized to bf16 is the peer too.
DEQUANTIZED = "transformers-dequantized"
CT_GROUP = 128
CT_CONFIG = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
             "ignore": ["lm_head", "re:.*mlp.gate$"],
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                 "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": CT_GROUP}}}}


def ct_w4a16_tensors(weight: torch.Tensor, module: str) -> dict[str, torch.Tensor]:
    """One linear quantized and packed by compressed-tensors' own pack-quantized compressor."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(**CT_CONFIG["config_groups"]["group_0"]["weights"])
    w = weight.bfloat16()
    blocks = w.float().view(w.shape[0], -1, CT_GROUP)
    scale, zero = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args)
    packed = PackedQuantizationCompressor.compress(
        {"weight": w, "weight_scale": scale.bfloat16(), "weight_zero_point": zero},
        QuantizationScheme(targets=["Linear"], weights=args))
    return {f"{module}.{k}": v for k, v in packed.items()}


def write(fmt: str, directory: Path, layers: int, device: str) -> None:
    import torch
    from hf_models import hf_config
    from safetensors.torch import save_file

    from moe_core import ExpertWeights, MoEConfig
    from moe_core.quant import fp8_w8a8, mxfp4_w4a16
    from moe_core.weights.writers import block_fp8_tensors, gpt_oss_mxfp4_tensors, quantized_linear_tensors

    directory.mkdir(parents=True, exist_ok=True)
    config = hf_config(PRESETS[fmt], layers)
    K = config.hidden_size
    qwen3 = PRESETS[fmt] == "qwen3-30b-a3b"
    gated_n = config.moe_intermediate_size if qwen3 else config.intermediate_size
    E = config.num_experts if qwen3 else config.num_local_experts
    moe_config = MoEConfig(num_experts=E, top_k=config.num_experts_per_tok, hidden_size=K, intermediate_size=gated_n,
                           has_bias=fmt == "mxfp4")
    quant = fp8_w8a8("block") if fmt == "fp8" else mxfp4_w4a16()
    gen = torch.Generator(device=device).manual_seed(0)
    weight_map: dict[str, str] = {}

    def randn(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * std).bfloat16()

    def shard(name: str, tensors: dict) -> None:
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, directory / name)
        weight_map.update(dict.fromkeys(tensors, name))

    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    start = time.perf_counter()
    shard("model-dense.safetensors", {"model.embed_tokens.weight": randn(config.vocab_size, K, std=0.02),
                                      "lm_head.weight": randn(config.vocab_size, K, std=K**-0.5),
                                      "model.norm.weight": torch.ones(K, dtype=torch.bfloat16)})
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors = {f"{p}.input_layernorm.weight": torch.ones(K, dtype=torch.bfloat16),
                   f"{p}.post_attention_layernorm.weight": torch.ones(K, dtype=torch.bfloat16)}
        projections = (("q_proj", heads * head_dim, K), ("k_proj", kv_heads * head_dim, K),
                       ("v_proj", kv_heads * head_dim, K), ("o_proj", K, heads * head_dim))
        for proj, out, inp in projections:
            w = torch.randn(out, inp, generator=gen, device=device) * inp**-0.5
            module = f"{p}.self_attn.{proj}"
            if fmt == "fp8":
                tensors.update(quantized_linear_tensors(w, module, "fp8", quant.weight))
            elif fmt == "ct-w4a16":
                tensors.update(ct_w4a16_tensors(w, module))
            else:  # gpt-oss: attention in bf16, with biases and sinks
                tensors[f"{module}.weight"] = w.bfloat16()
                tensors[f"{module}.bias"] = randn(out, std=0.01)
        if qwen3:
            tensors[f"{p}.self_attn.q_norm.weight"] = torch.ones(head_dim, dtype=torch.bfloat16)
            tensors[f"{p}.self_attn.k_norm.weight"] = torch.ones(head_dim, dtype=torch.bfloat16)
            tensors[f"{p}.mlp.gate.weight"] = randn(E, K, std=K**-0.5)
        if fmt == "fp8":
            experts = ExpertWeights.random(moe_config, quant, seed=i, device=device)
            tensors.update(block_fp8_tensors(experts, f"{p}.mlp.experts"))
        elif fmt == "ct-w4a16":  # per expert, as compressed-tensors producers write them
            for e in range(E):
                for proj, out, inp in (("gate_proj", gated_n, K), ("up_proj", gated_n, K), ("down_proj", K, gated_n)):
                    w = torch.randn(out, inp, generator=gen, device=device) * inp**-0.5
                    tensors.update(ct_w4a16_tensors(w, f"{p}.mlp.experts.{e}.{proj}"))
        else:
            tensors[f"{p}.self_attn.sinks"] = randn(heads, std=1.0)
            tensors[f"{p}.mlp.router.weight"] = randn(E, K, std=K**-0.5)
            tensors[f"{p}.mlp.router.bias"] = randn(E, std=0.01)
            experts = ExpertWeights.random(moe_config, quant, seed=i, device=device)
            tensors.update(gpt_oss_mxfp4_tensors(experts, f"{p}.mlp.experts"))
        shard(f"model-layer{i:03d}.safetensors", tensors)
        print(f"wrote layer {i + 1}/{layers} ({time.perf_counter() - start:.0f}s)", flush=True)
    values = config.to_dict()
    values.pop("_attn_implementation", None)
    values["dtype"] = "bfloat16"
    values["quantization_config"] = {
        "fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
        "ct-w4a16": CT_CONFIG,
        "mxfp4": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}[fmt]
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(values, indent=2))  # last: marks it complete


def run(loader: str, directory: Path, prefill: int, new: int) -> dict:
    import torch
    from bench_e2e import generate_greedy, median_seconds

    row: dict = {"loader": loader}
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    if loader == "moe":
        from moe_core.integrations.transformers import from_pretrained

        model = from_pretrained(directory, device="cuda", dtype=torch.bfloat16)
        row["backends"] = sorted({layer.backend for layer in model.fuse_report.layers})
    else:
        from transformers import AutoModelForCausalLM, FineGrainedFP8Config

        extra = {"quantization_config": FineGrainedFP8Config(dequantize=True)} if loader == DEQUANTIZED else {}
        model = AutoModelForCausalLM.from_pretrained(directory, device_map="cuda", dtype=torch.bfloat16, **extra)
    torch.cuda.synchronize()
    row["load_s"] = round(time.perf_counter() - t0, 1)
    row["load_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    row["model_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
    model.eval()
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        ids = torch.randint(0, vocab, (1, prefill), device="cuda", generator=gen)
        row["prefill_tokens_per_s"] = round(prefill / median_seconds(lambda: model(input_ids=ids, use_cache=False)), 1)
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=LOGIT_POSITIONS).logits.float()
        torch.save(logits.cpu(), directory / f"logits-{loader}.pt")  # beside the checkpoint: --out comes back small
        for batch in (1, 16):
            prompt = torch.randint(0, vocab, (batch, 16), device="cuda", generator=gen)
            step = (median_seconds(lambda p=prompt: generate_greedy(model, p, 2 + new))
                    - median_seconds(lambda p=prompt: generate_greedy(model, p, 2))) / new
            row[f"decode_b{batch}_ms_per_step"] = round(step * 1e3, 2)
    row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", choices=sorted(PRESETS), required=True)
    parser.add_argument("--dir", type=Path, required=True, help="where the checkpoint is (or is written)")
    parser.add_argument("--layers", type=int, required=True, help="decoder layers written")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--new", type=int, default=16, help="decode steps timed")
    parser.add_argument("--device", default="cuda", help="where the write phase draws and quantizes")
    parser.add_argument("--phase", choices=["all", "run"], default="all", help=argparse.SUPPRESS)
    parser.add_argument("--loader", choices=["moe", "transformers", DEQUANTIZED], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase == "run":  # the child: one loader, one fresh process
        print(json.dumps(run(args.loader, args.dir, args.prefill, args.new)), flush=True)
        return 0
    if not (args.dir / "config.json").exists():
        t0 = time.perf_counter()
        write(args.format, args.dir, args.layers, args.device)
        print(f"write: {time.perf_counter() - t0:.0f}s", flush=True)
    import torch
    import transformers

    result: dict = {"format": args.format, "preset": PRESETS[args.format], "layers": args.layers,
                    "torch": torch.__version__, "transformers_version": transformers.__version__}
    loaders = ("moe", "transformers") + ((DEQUANTIZED,) if args.format == "fp8" else ())
    for loader in loaders:
        child = subprocess.run([sys.executable, __file__, "--phase", "run", "--loader", loader, "--format",
                                args.format, "--dir", str(args.dir), "--layers", str(args.layers), "--out",
                                str(args.out), "--prefill", str(args.prefill), "--new", str(args.new)],
                               capture_output=True, text=True)
        lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
        result[loader] = json.loads(lines[-1]) if child.returncode == 0 and lines else {
            "error": (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1][:400]}
        print(loader, result[loader], flush=True)
    # The peer: transformers' own path, else (fp8 where it cannot run) its dequantizing one.
    peer = next((name for name in loaders[1:] if "error" not in result[name]), None)
    paths = [args.dir / f"logits-{loader}.pt" for loader in ("moe", peer)]
    if peer and "error" not in result["moe"] and all(p.exists() for p in paths):
        ours, theirs = (torch.load(p) for p in paths)
        result["peer"] = peer
        result["logits_rel_err"] = float((ours - theirs).norm() / theirs.norm())
        for key in ("prefill_tokens_per_s",):
            result[f"{key}_ratio"] = round(result["moe"][key] / result[peer][key], 2)
        for key in ("decode_b1_ms_per_step", "decode_b16_ms_per_step"):
            result[f"{key.removesuffix('_ms_per_step')}_speedup"] = round(result[peer][key] / result["moe"][key], 2)
    (args.out / f"checkpoint-loaders-{args.format}-{args.layers}l.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
