"""A/B of two builds of the library on one GPU, for a change no patch of one process can make (a stored
layout and the kernels reading it): ab_layer.py's timing of the same cells run in alternate processes,
one build installed in each, and each cell's times of the new build set beside the old's.

    python benchmarks/gpu/ab_builds.py --old-site DIR --new-site DIR --processes 4 --out ab.json \\
        -- --preset gpt-oss-120b --dtype mxfp4 --m 1 8 --rounds 3

Processes run old, new, new, old, old, new, ... (a drift of the clocks over the call falls on both
builds alike); each times every cell --rounds times (ab_layer.py: one variant, the build as
installed). Per cell and build: the median over all its processes' rounds; old median / new median
(>1: the new build is faster); the spread of each build's per-process medians shows the noise
between processes. Kernels compile in each build's first process (Triton's cache keeps them for the
next ones): a cell's first-process rounds time the same launches as the others'.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def order(processes: int) -> list[str]:
    """old, new, new, old, ...: each pair of processes reversed from the one before."""
    pairs = [("old", "new") if i % 2 == 0 else ("new", "old") for i in range((processes + 1) // 2)]
    return [build for pair in pairs for build in pair][:processes]


def run_process(build: str, site: Path, ab_args: list[str], out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(HERE)]))
    subprocess.run([sys.executable, str(HERE / "ab_layer.py"), *ab_args, "--variant", build, "--out", str(out)],
                   env=env, check=True)
    return json.loads(out.read_text())


def summarize(runs: list[tuple[str, dict]]) -> list[dict]:
    """Per cell: each build's rounds over all its processes, their median, per-process medians and the ratio."""
    cells: dict[tuple, dict[str, list[list[float]]]] = {}
    for build, payload in runs:
        for cell in payload["cells"]:
            key = (cell["preset"], cell["dtype"], cell["M"])
            cells.setdefault(key, {"old": [], "new": []})[build].append(cell["variants"][build]["us"])
    rows = []
    for (preset, dtype, m), by_build in cells.items():
        row = {"preset": preset, "dtype": dtype, "M": m}
        for build, per_process in by_build.items():
            row[f"{build}_median_us"] = statistics.median(us for rounds in per_process for us in rounds)
            row[f"{build}_process_medians_us"] = [statistics.median(rounds) for rounds in per_process]
        row["speedup"] = row["old_median_us"] / row["new_median_us"]
        rows.append(row)
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old-site", type=Path, required=True, help="the old build installed (pip --target)")
    p.add_argument("--new-site", type=Path, required=True)
    p.add_argument("--processes", type=int, default=4, help="processes in all, half per build")
    p.add_argument("--out", type=Path, required=True, help="JSON: each process's results and the summary")
    args = p.parse_args(argv[:split])
    ab_args = argv[split + 1:]
    if args.processes < 2:
        p.error("--processes: at least one per build")
    sites = {"old": args.old_site, "new": args.new_site}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, build in enumerate(order(args.processes)):
            print(f"== process {i + 1}/{args.processes}: {build} build ({sites[build]})", flush=True)
            runs.append((build, run_process(build, sites[build], ab_args, Path(tmp) / f"{i}.json")))
    rows = summarize(runs)
    for r in rows:
        print(f"{r['preset']} {r['dtype']} M={r['M']}: old {r['old_median_us']:.1f} us, new {r['new_median_us']:.1f} us, "
              f"x{r['speedup']:.3f} (per process: old {', '.join(f'{u:.1f}' for u in r['old_process_medians_us'])}; "
              f"new {', '.join(f'{u:.1f}' for u in r['new_process_medians_us'])})", flush=True)
    args.out.write_text(json.dumps({"ab_layer_args": ab_args, "sites": {k: str(v) for k, v in sites.items()},
                                    "processes": [{"build": b, **payload} for b, payload in runs],
                                    "cells": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
