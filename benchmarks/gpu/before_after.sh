#!/usr/bin/env bash
# One device call on a machine with two GPUs: the whole-layer benchmark of two builds of the library,
# every cell timed on the same GPU for both builds, and the GPU suite of the new build.
#
#   here:       uv build --all-packages -o .carry/new-wheels
#               (cd <checkout of OLD> && uv build --all-packages -o <repo>/.carry/old-wheels)
#               git show OLD:benchmarks/gpu/<its bench script> > .carry/old-bench/bench.py (+ its anchors_*.json)
#   on the GPU: bash benchmarks/gpu/before_after.sh .carry/old-wheels .carry/old-bench/bench.py .carry/new-wheels
#
# GPU 0 times the lighter presets with the old build, then the new; GPU 1 runs the GPU suite, then
# times the two heaviest presets with the new build, then the old (so a drift in clocks over the call
# does not favour one build). BENCH_M (default: all of bench_layer.py's token counts) narrows the cells
# to fit a short lease; each branch stops at BRANCH_S seconds. Results: $OUT/before_after.tar.
set -uo pipefail
OLD_WHEELS=${1:?usage: before_after.sh OLD_WHEELS OLD_BENCH_SCRIPT NEW_WHEELS}
OLD_BENCH=$(realpath "${2:?}")
NEW_WHEELS=${3:?}
OUT=${OUT:-/tmp/moe-gpu-out}
BRANCH_S=${BRANCH_S:-560}
M_ARGS=""; [ -n "${BENCH_M:-}" ] && M_ARGS="--m $BENCH_M"
WORK=/tmp/before-after
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1
rm -rf "$WORK" && mkdir -p "$WORK"
for build in old new; do
  wheels=$OLD_WHEELS; [ "$build" = new ] && wheels=$NEW_WHEELS
  python3 -m pip install -q --no-deps --no-index --no-compile --target "$WORK/site-$build" "$wheels"/*.whl || exit 3
done
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$WORK/gpus.txt"
export OLD_BENCH HERE WORK M_ARGS NEW_WHEELS

bench() {  # bench BUILD GPU PRESET...
  local build=$1 gpu=$2; shift 2
  local script=$OLD_BENCH start
  [ "$build" = new ] && script=$HERE/bench_layer.py
  start=$(date +%s)
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$gpu PYTHONPATH=$WORK/site-$build python3 "$script" --out "$WORK/${build}_gpu$gpu" \
    --preset "$@" $M_ARGS > "$WORK/${build}_gpu$gpu.log" 2>&1
  echo "== bench $build on GPU $gpu ($*): exit $? after $(( $(date +%s) - start ))s"
}
suite() {
  local start
  start=$(date +%s)
  CUDA_VISIBLE_DEVICES=1 MOE_SITE=$WORK/site-tests OUT=$WORK/tests bash "$HERE/run.sh" "$NEW_WHEELS" tests \
    > "$WORK/tests.log" 2>&1
  echo "== tests on GPU 1: exit $? after $(( $(date +%s) - start ))s"
}
export -f bench suite
timeout "$BRANCH_S" bash -c 'bench old 0 qwen3-30b-a3b mixtral-8x7b gpt-oss-120b
                             bench new 0 qwen3-30b-a3b mixtral-8x7b gpt-oss-120b' &
timeout "$BRANCH_S" bash -c 'suite
                             bench new 1 qwen3-235b-a22b deepseek-v3
                             bench old 1 qwen3-235b-a22b deepseek-v3' &
wait
grep -hE "passed|failed|error" "$WORK/tests.log" | tail -4
rm -f "$WORK"/*_gpu*/*.png
tar -C "$WORK" --exclude='site-*' -cf "$OUT/before_after.tar" .
