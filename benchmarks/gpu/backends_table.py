"""Tables of a side-by-side run (`run_moe_cuda.sh bench [peers]`): every cell's backends, the fastest,
and for MXFP4 the int4 layer of the same run and the matmul_ogs peer.

    python benchmarks/gpu/backends_table.py RESULTS_DIR OUT_DIR

RESULTS_DIR is the unpacked results.tar.gz (bench/*/bench-*.json, peers/*/peer_matmul_ogs.json); a
backend timed in one cell by several runs counts with the latest run's row. Writes OUT_DIR/cells.json
(one row per cell and backend, the fields the tables use; a run the deadline stopped keeps only the
cells all its backends reached) and prints the markdown tables: all cells; MXFP4 against int4
(issue 47's 1.1x target) and its peers; then the cells whose numbers cannot stand: above
`moe_core.bench.IMPOSSIBLE_FRACTION` of their floor, or timed while the machine's quick ceilings
moved more than `RECHECK_TOLERANCE` (files written since `moe bench` records the re-check).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import sys
from pathlib import Path

from moe_core.bench import IMPOSSIBLE_FRACTION, RECHECK_TOLERANCE, save_ranking
from moe_core.rankings import ranking_from_rows

PRESETS = ("deepseek-v3", "gpt-oss-120b", "mixtral-8x7b", "qwen3-235b-a22b", "qwen3-30b-a3b")
FIELDS = ("preset", "scheme", "quant", "family", "shape", "tokens", "backend", "time_ms", "floor_fraction",
          "distinct_experts", "rel_diff", "compared_with", "copy_recheck", "matmul_recheck")


def load(results: Path) -> tuple[list[dict], dict, dict]:
    """Every timed row, the latest run's file, the peers; where several runs timed one backend in one
    cell (a re-check), the latest run's row."""
    latest: dict[tuple, tuple[str, dict]] = {}
    newest: dict = {}
    for path in sorted(glob.glob(str(results / "bench" / "*" / "bench-*.json"))):
        data = json.loads(Path(path).read_text())
        date = data["machine"]["date"]
        newest = max(newest, data, key=lambda d: d["machine"]["date"]) if newest else data
        timed = [{f: r.get(f) for f in FIELDS} for r in data["rows"] if r.get("time_ms")]
        for r in timed if data.get("complete", True) else _reached_by_all(timed, path):
            key = (r["preset"], r["scheme"], r["tokens"], r["backend"])
            if key not in latest or latest[key][0] < date:
                latest[key] = (date, r)
    rows = [r for _, r in latest.values()]
    peer = {}
    for path in sorted(glob.glob(str(results / "peers" / "*" / "peer_matmul_ogs.json"))):
        data = json.loads(Path(path).read_text())
        for r in data["rows"] if isinstance(data, dict) else data:
            if r.get("us"):
                peer[(r["preset"], r["M"])] = r
    return rows, newest, peer


def _reached_by_all(rows: list[dict], path: str) -> list[dict]:
    """The rows of a run the deadline stopped (its backends run one after the other) at the cells
    every backend it timed reached; the others would show the first backends alone."""
    backends = {r["backend"] for r in rows}
    cells = collections.defaultdict(set)
    for r in rows:
        cells[(r["preset"], r["scheme"], r["tokens"])].add(r["backend"])
    kept = [r for r in rows if cells[(r["preset"], r["scheme"], r["tokens"])] == backends]
    if len(kept) < len(rows):
        print(f"{path}: stopped before every backend ran; {len(rows) - len(kept)} rows of cells only some "
              "backends reached left out", file=sys.stderr)
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranking", action="store_true",
                        help="also write the ranking of these rows to OUT_DIR/ranking-<device>.json (merged into "
                             "one there; its date, versions and protocol: the latest run's)")
    args = parser.parse_args()
    rows, newest, peer = load(args.results)
    machine = newest["machine"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cells.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=0) + "\n")
    if args.ranking:
        measured = {k: machine[k] for k in ("date", "torch", "distributions")}
        ranking = ranking_from_rows(rows, machine["device_name"], measured, newest["method"])
        print(f"ranking of {len(ranking['entries'])} cells: {save_ranking(ranking, args.out)}", file=sys.stderr)
    cells = collections.defaultdict(dict)
    for r in rows:
        cells[(r["preset"], r["scheme"], r["tokens"])][r["backend"]] = r
    print("| preset | scheme | M | triton us (floor frac) | vendor backends us | fastest | fastest vendor / triton "
          "| max rel. diff vs first |")
    print("|---|---|---|---|---|---|---|---|")
    for (preset, scheme, m), backends in sorted(cells.items()):
        tri = backends.get("triton")
        vendors = {b: r for b, r in backends.items() if b != "triton"}
        fastest = min(backends, key=lambda b: backends[b]["time_ms"])
        best_vendor = min(vendors.values(), key=lambda r: r["time_ms"]) if vendors else None
        ratio = f"{best_vendor['time_ms'] / tri['time_ms']:.2f}" if tri and best_vendor else "-"
        diff = max((r["rel_diff"] or 0.0) for r in backends.values())
        tri_text = f"{tri['time_ms'] * 1e3:.1f} ({tri['floor_fraction']:.2f})" if tri else "-"
        vendor_text = ", ".join(f"{b} {r['time_ms'] * 1e3:.1f}" for b, r in sorted(vendors.items())) or "-"
        print(f"| {preset} | {scheme} | {m} | {tri_text} | {vendor_text} | {fastest} | {ratio} | {diff:.1e} |")
    suspect(rows)
    if not peer:
        return 0
    print("\n| preset | M | int4 us | MXFP4 us (floor frac) | MXFP4 / int4 | Marlin MXFP4 us | matmul_ogs us "
          "| fastest peer / MXFP4 |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in PRESETS:
        for m in sorted({k[2] for k in cells if k[0] == preset and k[1] == "mxfp4"}):
            mx, i4 = cells[(preset, "mxfp4", m)], cells.get((preset, "int4", m), {})
            ogs = peer.get((preset, m))
            peers = [t for t in (mx.get("marlin", {}).get("time_ms"), ogs and ogs["us"] / 1e3) if t]
            t = mx["triton"]["time_ms"]
            i4_text = f"{i4['triton']['time_ms'] * 1e3:.1f}" if "triton" in i4 else "-"
            over = f"{t / i4['triton']['time_ms']:.2f}" if "triton" in i4 else "-"
            marlin = f"{mx['marlin']['time_ms'] * 1e3:.1f}" if "marlin" in mx else "refused"
            print(f"| {preset} | {m} | {i4_text} | {t * 1e3:.1f} ({mx['triton']['floor_fraction']:.2f}) | {over} "
                  f"| {marlin} | {ogs['us']:.1f} | {min(peers) / t:.2f} |" if ogs else
                  f"| {preset} | {m} | {i4_text} | {t * 1e3:.1f} | {over} | {marlin} | - | - |")
    return 0


def suspect(rows: list[dict]) -> None:
    """The cells no ranking or record should rest on."""
    above = [r for r in rows if r["floor_fraction"] > IMPOSSIBLE_FRACTION]
    moved = [r for r in rows if r["copy_recheck"] is not None
             and max(abs(r["copy_recheck"] - 1), abs(r["matmul_recheck"] - 1)) > RECHECK_TOLERANCE]

    def name(r: dict) -> str:
        return f"{r['preset']} {r['scheme']} {r['backend']} M={r['tokens']}"

    print(f"\nAbove {IMPOSSIBLE_FRACTION} of the floor (impossible: the floor or the timing is wrong): "
          + (", ".join(f"{name(r)} ({r['floor_fraction']:.2f})" for r in above) or "none"))
    print(f"Timed while the quick ceilings moved more than {RECHECK_TOLERANCE:.0%}: "
          + (", ".join(f"{name(r)} (copy {r['copy_recheck']:.2f}x, matmul {r['matmul_recheck']:.2f}x)"
                       for r in moved) or "none"))


if __name__ == "__main__":
    raise SystemExit(main())
