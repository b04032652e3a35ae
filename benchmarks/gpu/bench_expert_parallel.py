"""Expert parallelism: layer time of replicate+all-reduce vs all-to-all dispatch, against one GPU.

For each preset and tokens per rank M, with world size R = the visible GPUs (or --world):
- one GPU: the whole layer (all E experts) on rank 0 over M tokens (skipped, with a note, when its
  weights do not fit in that GPU's free memory);
- replicate: `FusedMoE(..., parallel=Replicate())`, every rank the same M tokens, E/R experts each,
  outputs all-reduced: serves M distinct tokens per call;
- all-to-all exact: `FusedMoE(..., parallel=AllToAll())`, every rank its own M tokens, dispatched
  to the ranks holding their experts and combined back: serves R*M distinct tokens per call;
- all-to-all fixed: the same with `AllToAll(fixed_slots=True)` (every token to every rank, masked).
bf16 weights drawn on the GPU (`ExpertWeights.random(..., device=)`), routing logits N(0, 1), the
layers on the backend the oracle picks. Timing: one GPU, replicate and fixed slots are captured in a
CUDA graph per cell and replayed (as engines run decode); exact splits read their counts on the host
and run eagerly, so their time includes the host's launch and sync overhead. Each repeat starts
after a collective barrier and is timed with CUDA events on every rank; a repeat's time is the
slowest rank's; the median of --repeats after --warmup calls is reported. A sanity check per preset
compares both all-to-all variants with replicate on identical tokens (relative L2 error).

    # 2 GPUs, from the repo root, the project importable (PYTHONPATH or installed):
    python3 benchmarks/gpu/bench_expert_parallel.py --out /tmp/ep-bench
    # CPU / gloo smoke run (what CI can run):
    python3 benchmarks/gpu/bench_expert_parallel.py --device cpu --world 2 --preset tiny --tokens 1 8 --out DIR

Writes DIR/bench_expert_parallel_<device>_x<R>.{json,md} with the device name, torch, triton and
NCCL versions and the date. NCCL runs with NVLink SHARP/multicast off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1), as the benchmark machines require.
--budget-s stops starting new presets once exceeded (the skipped ones are listed in the output).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.metadata as md
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PRESETS = ("qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v3")
TOKEN_COUNTS = (1, 8, 32, 128, 512, 2048, 8192)
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SANITY_TOKENS = 32


def _version(dist_name: str) -> str | None:
    try:
        return md.version(dist_name)
    except md.PackageNotFoundError:
        return None


class Bench:
    """One rank's side of the benchmark."""

    def __init__(self, rank: int, world: int, device: torch.device, args) -> None:
        self.rank, self.world, self.device, self.args = rank, world, device, args
        self.cuda = device.type == "cuda"

    def barrier(self) -> None:
        flag = torch.zeros(1, device=self.device)
        dist.all_reduce(flag)  # a collective on the benchmark's own device (NCCL's barrier guesses one)

    def slowest(self, seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    def time_call(self, call, collective: bool = True, graph: bool = False) -> float:
        """Median ms over repeats of `call()` (replays of its CUDA graph with `graph`, on GPUs); with
        `collective`, the slowest rank's time per repeat."""
        graph = graph and self.cuda
        side = torch.cuda.Stream(self.device) if graph else None
        with torch.cuda.stream(side) if graph else contextlib.nullcontext():  # warm-up off the capture stream
            for _ in range(self.args.warmup):
                call()
        if graph:
            torch.cuda.current_stream(self.device).wait_stream(side)
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured):
                call()
            call = captured.replay
        times = []
        for _ in range(self.args.repeats):
            if collective:
                self.barrier()
            if self.cuda:
                torch.cuda.synchronize(self.device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                end.synchronize()
                seconds = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                call()
                seconds = time.perf_counter() - t0
            times.append(self.slowest(seconds) if collective else seconds)
        return statistics.median(times) * 1e3

    def inputs(self, config, M: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        x = torch.randn(M, config.hidden_size, generator=gen, device=self.device).to(config.dtype)
        return x, torch.randn(M, config.num_experts, generator=gen, device=self.device)

    def bias(self, config) -> torch.Tensor | None:
        if not config.routing.has_correction_bias:
            return None
        gen = torch.Generator(device=self.device).manual_seed(0)
        return torch.randn(config.num_experts, generator=gen, device=self.device) * 1e-3

    def one_gpu(self, preset, tokens: list[int]) -> dict:
        """Rank 0 alone runs the whole layer; the other ranks wait."""
        from moe_core import ExpertWeights, FusedMoE
        from moe_core.quant import unquantized

        cfg = preset.config
        weight_bytes = cfg.num_experts * (cfg.w13_rows + cfg.intermediate_size) * cfg.hidden_size * 2
        result: dict = {"times_ms": {}, "note": None}
        if self.rank == 0:
            free = torch.cuda.mem_get_info(self.device)[0] if self.cuda else None
            if free is not None and weight_bytes * 2.2 > free:  # drawn + packed copies while loading
                result["note"] = (f"skipped: the whole layer's {weight_bytes / 2**30:.1f} GiB of weights do not fit in "
                                  f"{free / 2**30:.1f} GiB free on one GPU")
            else:
                layer = FusedMoE(cfg, unquantized(), self.device)
                layer.load_weights(ExpertWeights.random(cfg, unquantized(), seed=0, device=self.device),
                                   correction_bias=self.bias(cfg))
                result["backend"] = f"{layer.plan.backend}/{layer.plan.experts_cls.name()}"
                for M in tokens:
                    call = functools.partial(layer, *self.inputs(cfg, M, seed=1))
                    result["times_ms"][M] = self.time_call(call, collective=False, graph=True)
                del layer
                if self.cuda:
                    torch.cuda.empty_cache()
        self.barrier()
        return result

    def expert_parallel(self, preset, tokens: list[int]) -> dict:
        import dataclasses

        from moe_core import ExpertWeights, FusedMoE, ParallelConfig
        from moe_core.parallel import AllToAll, Replicate
        from moe_core.quant import unquantized

        cfg = dataclasses.replace(preset.config, parallel=ParallelConfig(ep_size=self.world, ep_rank=self.rank))
        weights = ExpertWeights.random(cfg, unquantized(), seed=self.rank, device=self.device)  # E/R experts
        bias = self.bias(cfg)
        layers = {}
        modes = {"replicate": Replicate(), "all_to_all": AllToAll(), "all_to_all_fixed": AllToAll(fixed_slots=True)}
        for name, mode in modes.items():
            layers[name] = FusedMoE(cfg, unquantized(), self.device, parallel=mode)
            layers[name].load_weights(weights, correction_bias=bias)
        del weights
        x, logits = self.inputs(cfg, SANITY_TOKENS, seed=1)  # the same tokens on every rank: modes must agree
        want = layers["replicate"](x, logits).float()
        err = max(float((layers[name](x, logits).float() - want).norm() / want.norm())
                  for name in ("all_to_all", "all_to_all_fixed"))
        result: dict = {"sanity_rel_err": err,
                        "backend": f"{layers['replicate'].plan.backend}/{layers['replicate'].plan.experts_cls.name()}",
                        **{f"{name}_ms": {} for name in modes}}
        for M in tokens:
            same = self.inputs(cfg, M, seed=1)
            own = self.inputs(cfg, M, seed=100 + self.rank)  # all-to-all: every rank its own tokens
            # Exact splits read counts on the host: eager. The other two are captured, as engines run them.
            result["replicate_ms"][M] = self.time_call(functools.partial(layers["replicate"], *same), graph=True)
            result["all_to_all_ms"][M] = self.time_call(functools.partial(layers["all_to_all"], *own))
            result["all_to_all_fixed_ms"][M] = self.time_call(functools.partial(layers["all_to_all_fixed"], *own),
                                                              graph=True)
        del layers
        if self.cuda:
            torch.cuda.empty_cache()
        return result

    def run(self) -> dict:
        from moe_core.presets import get_preset

        start = time.perf_counter()
        rows, skipped = [], []
        for name in self.args.preset:
            over = torch.tensor([float(time.perf_counter() - start > self.args.budget_s)], device=self.device)
            dist.all_reduce(over, op=dist.ReduceOp.MAX)  # every rank takes the same decision
            if float(over):
                skipped.append(name)
                continue
            preset = get_preset(name)
            tokens = [M for M in self.args.tokens if preset.config.max_num_tokens >= M]
            one = self.one_gpu(preset, tokens)
            ep = self.expert_parallel(preset, tokens)
            rows.append({"preset": name, "config": preset.config.describe(), "tokens": tokens, "one_gpu": one, **ep})
            if self.rank == 0:
                print(f"{name}: done at {time.perf_counter() - start:.0f} s (sanity rel err "
                      f"{ep['sanity_rel_err']:.1e})", flush=True)
        return {"presets": rows, "skipped_over_budget": skipped, "seconds": time.perf_counter() - start}


def _meta(device: torch.device, world: int) -> dict:
    from moe_core import __version__

    cuda = device.type == "cuda"
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "world_size": world,
        "backend": "nccl" if cuda else "gloo",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "moe_core": __version__,
        "env": {k: os.environ.get(k) for k in NCCL_ENV},
        "python": sys.version.split()[0],
    }


def _markdown(report: dict) -> str:
    meta = report["meta"]
    R = meta["world_size"]
    graphs = "CUDA graphs" if meta["backend"] == "nccl" else "no graphs on CPU"
    lines = [f"# Expert parallelism: replicate vs all-to-all, {R} x {meta['device']}", "",
             f"{meta['date']}; torch {meta['torch']} (CUDA {meta['cuda']}), triton {meta['triton']}, "
             f"NCCL {meta['nccl']}, moe-core {meta['moe_core']}; bf16 weights; median ms over repeats, the slowest "
             f"rank per repeat. 1 GPU, replicate and all-to-all with fixed slots are replays of captured calls "
             f"({graphs}); all-to-all with exact splits reads its counts on the host, so it runs eagerly.", "",
             f"Tokens/s counts distinct tokens: one GPU and replicate serve M per call, all-to-all {R} x M.", ""]
    columns = (("1 GPU", None), ("replicate", "replicate_ms"), ("all-to-all exact", "all_to_all_ms"),
               ("all-to-all fixed", "all_to_all_fixed_ms"))
    for row in report["presets"]:
        one = row["one_gpu"]
        lines += [f"## {row['preset']}", "", f"{row['config']}; backend {row['backend']}; all-to-all (exact, fixed) "
                  f"vs replicate on identical tokens: rel L2 error {row['sanity_rel_err']:.1e}"]
        if one["note"]:
            lines += ["", f"one GPU: {one['note']}"]
        head = [f"{name} ms" for name, _ in columns] + [f"{name} tok/s" for name, _ in columns]
        lines += ["", "| tokens/rank | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
        for M in row["tokens"]:
            times = [one["times_ms"].get(M) if key is None else row[key][M] for _, key in columns]
            served = [M, M, R * M, R * M]
            cells = [f"{t:.3f}" if t is not None else "-" for t in times]
            cells += [f"{n / (t / 1e3):,.0f}" if t else "-" for n, t in zip(served, times)]
            lines.append(f"| {M} | " + " | ".join(cells) + " |")
        lines.append("")
    if report["skipped_over_budget"]:
        lines.append(f"Not run (over --budget-s): {', '.join(report['skipped_over_budget'])}.")
    return "\n".join(lines) + "\n"


def _rank_main(rank: int, world: int, init_file: str, args) -> None:
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        report = {"meta": _meta(device, world), **Bench(rank, world, device, args).run()}
        if rank == 0:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            tag = report["meta"]["device"].replace(" ", "_") + f"_x{world}"
            (out / f"bench_expert_parallel_{tag}.json").write_text(json.dumps(report, indent=2))
            (out / f"bench_expert_parallel_{tag}.md").write_text(_markdown(report))
            print(_markdown(report))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from moe_core.presets import PRESETS as ALL_PRESETS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for the JSON and markdown results")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cuda: NCCL, one GPU per rank; cpu: gloo")
    p.add_argument("--world", type=int, default=None, help="ranks (default: visible GPUs; 2 on cpu)")
    p.add_argument("--preset", nargs="+", default=list(PRESETS), choices=sorted(ALL_PRESETS))
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKEN_COUNTS), help="tokens per rank")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=240.0, help="start no new preset after this many seconds")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no GPU (use --device cpu for the gloo path)")
    world = args.world or (torch.cuda.device_count() if args.device == "cuda" else 2)
    if world < 2 or (args.device == "cuda" and world > torch.cuda.device_count()):
        p.error(f"--world {world}: expected 2 or more ranks, at most the {torch.cuda.device_count()} visible GPUs "
                "on cuda")
    os.environ.update(NCCL_ENV)  # inherited by the spawned ranks
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_main, args=(world, str(Path(tmp) / "init"), args), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
