#!/usr/bin/env bash
# One device call (one H100 or H200, meant to finish within 7 minutes; BENCH_M narrows the token counts):
# MXFP4 layers against the int4 layers of the same presets, and against the MXFP4 layers of a baseline
# build (the commit before a change), with floor fractions.
#
#   here:       uv build --all-packages -o .carry/wheels
#               git archive BASE | tar -x -C /tmp/moe-base
#               (cd /tmp/moe-base && uv build --all-packages -o <repo>/.carry/base-wheels)
#   on the GPU: bash benchmarks/gpu/bench_mxfp4.sh .carry/base-wheels .carry/wheels
#
# Cells: the five benchmark presets x M in BENCH_M (default: 1 8 32 128 512 2048 8192), bench_layer.py's
# protocol: MXFP4 and int4 (the preset's int4 group: 128, gpt-oss 64) of the new build, MXFP4 of the
# baseline. run.sh installs each build; every layer is then called once, a process per build, dtype and
# preset side by side (bench_layer.py --compile-only: the kernels compile into Triton's cache in
# parallel instead of on the timed runs' clock); then the baseline and the new build are timed one
# after the other, with the GPU to themselves. Results: $OUT/mxfp4_vs_int4.{md,json} (per cell: the
# three times and floor fractions, new MXFP4 / int4 against the 1.1 target, baseline / new MXFP4), the
# builds' bench_triton_*.{json,md} in $OUT/base and $OUT/new, and logs.
set -uo pipefail
BASE_WHEELS=${1:?usage: bench_mxfp4.sh BASE_WHEELS NEW_WHEELS}
NEW_WHEELS=${2:?usage: bench_mxfp4.sh BASE_WHEELS NEW_WHEELS}
OUT=${OUT:-/tmp/moe-gpu-out}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=/tmp/bench-mxfp4
read -r -a M <<< "${BENCH_M:-1 8 32 128 512 2048 8192}"
PRESETS=(qwen3-30b-a3b mixtral-8x7b gpt-oss-120b qwen3-235b-a22b deepseek-v3)
export PYTHONUNBUFFERED=1
rm -rf "$WORK" && mkdir -p "$OUT"
start=$(date +%s)
for build in base new; do
  wheels=$BASE_WHEELS; [ "$build" = new ] && wheels=$NEW_WHEELS
  MOE_SITE=$WORK/site-$build OUT=$OUT/$build bash "$HERE/run.sh" "$wheels" > /dev/null || exit 3
done
head -2 "$OUT/new/run.log"  # the GPU, torch and triton

layers() {  # layers BUILD ARGS...: bench_layer.py with ARGS on BUILD's install
  local build=$1; shift
  PYTHONPATH=$WORK/site-$build python3 "$HERE/bench_layer.py" "$@"
}
pids=()
for preset in "${PRESETS[@]}"; do
  for cell in "base mxfp4" "new int4" "new mxfp4"; do
    read -r build dtype <<< "$cell"
    layers "$build" --compile-only --out "$OUT/$build" --preset "$preset" --dtypes "$dtype" --m "${M[@]}" \
      > "$OUT/$build/compile_${dtype}_$preset.log" 2>&1 &
    pids+=($!)
  done
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
echo "== compiled after $(( $(date +%s) - start ))s$( [ $failed = 0 ] || echo ": a pass failed, see $OUT/*/compile_*.log")"
layers base --out "$OUT/base" --preset "${PRESETS[@]}" --dtypes mxfp4 --m "${M[@]}" > "$OUT/base/bench.log" 2>&1
rc=$?
echo "== baseline timed after $(( $(date +%s) - start ))s (exit $rc)"
layers new --out "$OUT/new" --preset "${PRESETS[@]}" --dtypes int4 mxfp4 --m "${M[@]}" > "$OUT/new/bench.log" 2>&1
rc=$?
echo "== new build timed after $(( $(date +%s) - start ))s (exit $rc)"

python3 - "$OUT" <<'EOF'
import glob
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
TARGET = 1.1  # MXFP4 layer time at most this times the int4 one of the same preset and M


errors = []


def cells(build: str) -> dict:
    found = {}
    for path in glob.glob(str(out / build / "bench_triton_*.json")):
        for c in json.loads(Path(path).read_text())["cells"]:
            if "us" in c:
                found[(c["dtype"], c["model"], c["M"])] = c
            else:
                errors.append(f"{build} {c['dtype']} {c['model']} M={c.get('M')}: {c.get('error') or c.get('skipped')}")
    return found


base, new = cells("base"), cells("new")
rows, met = [], 0
for (dtype, model, m), mx in sorted(new.items(), key=lambda kv: (kv[0][1], kv[0][2])):
    if dtype != "mxfp4":
        continue
    int4, old = new.get(("int4", model, m)), base.get(("mxfp4", model, m))
    row = {"model": model, "M": m, "mxfp4_us": mx["us"], "mxfp4_floor_fraction": mx["floor_fraction"],
           "mxfp4_config": mx.get("config", "")}
    if int4:
        row.update(int4_us=int4["us"], int4_floor_fraction=int4["floor_fraction"], mxfp4_over_int4=mx["us"] / int4["us"])
        met += row["mxfp4_over_int4"] <= TARGET
    if old:
        row.update(base_us=old["us"], base_floor_fraction=old["floor_fraction"], base_over_new=old["us"] / mx["us"])
    rows.append(row)


def cell(row: dict, key: str) -> str:
    return f"{row[key + '_us']:.1f} ({row[key + '_floor_fraction']:.2f})" if key + "_us" in row else "-"


lines = [f"# MXFP4 vs int4 (new build) and the MXFP4 baseline: {met} of {len(rows)} cells within {TARGET}x int4", "",
         "Times in us (floor fraction); mxfp4/int4: new MXFP4 over int4 (target <= 1.1); base/new: the baseline's "
         "MXFP4 time over the new one's.", "",
         "| model | M | int4 | mxfp4 base | mxfp4 new | mxfp4/int4 | base/new | new mxfp4 config |",
         "|---|---|---|---|---|---|---|---|"]
for r in rows:
    ratio = f"{r['mxfp4_over_int4']:.2f}" + ("" if r["mxfp4_over_int4"] <= TARGET else " !") if "mxfp4_over_int4" in r else "-"
    speedup = f"{r['base_over_new']:.2f}" if "base_over_new" in r else "-"
    config = r["mxfp4_config"].replace("|", "/")
    lines.append(f"| {r['model']} | {r['M']} | {cell(r, 'int4')} | {cell(r, 'base')} | {cell(r, 'mxfp4')} | {ratio} "
                 f"| {speedup} | {config} |")
lines += [""] + [f"- failed: {e}" for e in errors]
(out / "mxfp4_vs_int4.md").write_text("\n".join(lines) + "\n")
(out / "mxfp4_vs_int4.json").write_text(json.dumps(rows, indent=1))
print("\n".join(lines))
EOF
