#!/usr/bin/env bash
# One device call for moe-cuda: install the project from wheels, unpack the carried vendor libraries,
# run moe-cuda's tests (device-marked ones and moe-core's conformance suite) on the GPU, then
# `moe bench --backends all`: every installed backend side by side on the same layers, which also
# writes the measured ranking the oracle reads (moe_core/rankings_data/ ships the committed one).
#
#   here:       uv build --all-packages -o .carry/wheels
#               (the vendor libraries, xz-compressed: .carry/vendor/_moe_C_stable_libtorch.abi3.so.xz from
#                vllm 0.26.0, .carry/vendor/common_ops.abi3.so.xz from sglang-kernel 0.4.6's sgl_kernel/sm90/)
#   on the GPU: bash benchmarks/gpu/run_moe_cuda.sh .carry/wheels [.carry/vendor] [tests] [bench]
#               (carry: .carry/wheels and .carry/vendor)
#
# Phases (default: tests bench): each one's exit status is reported; a failing phase does not stop
# the next; the script exits non-zero if any failed. Everything printed also goes to
# $OUT/run_moe_cuda.log. The benchmark runs one `moe bench` per visible GPU, the presets dealt out
# largest first; each writes $OUT/bench/gpuN/bench-*.json and ranking-<device>.json after every
# measured cell (a run stopped by BENCH_TIMEOUT keeps what it measured), and the rankings are merged
# into $OUT/bench/ranking-<device>.json (copy it into packages/moe-core/src/moe_core/rankings_data/).
# What it measures: BENCH_PRESETS (default: the five real presets), BENCH_SCHEMES (default: bf16 int4
# int8 fp8-channel fp8-block mxfp4), BENCH_TOKENS (default: 1 8 32 128 512 2048 8192), BENCH_TIMEOUT
# seconds (500).
set -uo pipefail
WHEELS=${1:?usage: run_moe_cuda.sh WHEEL_DIR [VENDOR_DIR] [PHASE...]}
shift
VENDOR=.carry/vendor
if [ $# -gt 0 ] && [ -d "$1" ]; then VENDOR=$1; shift; fi
PHASES=("$@")
[ ${#PHASES[@]} -gt 0 ] || PHASES=(tests bench)
# shellcheck source=benchmarks/gpu/_setup.sh
source "$(dirname "$0")/_setup.sh" run_moe_cuda.log

# The vendor libraries, decompressed once per machine; moe-cuda finds them through these variables.
LIBS=/tmp/moe-cuda-libs
mkdir -p "$LIBS"
for packed in "$VENDOR"/*.so.xz; do
  target="$LIBS/$(basename "$packed" .xz)"
  [ -f "$target" ] || python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$packed" "$target" || exit 4
done
export MOE_CUDA_MARLIN_LIB=$LIBS/_moe_C_stable_libtorch.abi3.so
export MOE_CUDA_SGLANG_LIB=$LIBS/common_ops.abi3.so
ls -l "$LIBS"
# Marlin's sm_80 PTX is compiled by the driver on first use (~50 s on Hopper): one cache for every
# process of this call, large enough to keep it.
export CUDA_CACHE_PATH=/tmp/moe-cuda-ptx-cache
export CUDA_CACHE_MAXSIZE=4294967296

python3 -m moe_core doctor --require cuda | grep -E "cuda|moe-cuda|NOT validated" | cut -c1-200

failed=0
for phase in "${PHASES[@]}"; do
  start=$(date +%s)
  case "$phase" in
    tests)
      # Serial: xdist workers would each compile Marlin's PTX before the cache holds it.
      MOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider --durations=15 "$ROOT/packages/moe-cuda/tests"
      rc=$? ;;
    bench)
      args=(--device cuda --backends all --no-plot)
      for s in ${BENCH_SCHEMES:-bf16 int4 int8 fp8-channel fp8-block mxfp4}; do args+=(--scheme "$s"); done
      # shellcheck disable=SC2206
      args+=(--tokens ${BENCH_TOKENS:-1 8 32 128 512 2048 8192})
      # shellcheck disable=SC2206
      presets=(${BENCH_PRESETS:-deepseek-v3 qwen3-235b-a22b gpt-oss-120b mixtral-8x7b qwen3-30b-a3b})
      gpus=$(nvidia-smi -L | wc -l)
      pids=()
      for ((g = 0; g < gpus && g < ${#presets[@]}; g++)); do
        mine=()
        for ((i = g; i < ${#presets[@]}; i += gpus)); do mine+=(--preset "${presets[i]}"); done
        mkdir -p "$OUT/bench/gpu$g"
        CUDA_VISIBLE_DEVICES=$g timeout "${BENCH_TIMEOUT:-500}" python3 -m moe_core bench "${args[@]}" "${mine[@]}" \
          --out "$OUT/bench/gpu$g" > "$OUT/bench/gpu$g.log" 2>&1 &
        pids+=($!)
      done
      rc=0
      for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
      tail -n 3 "$OUT"/bench/gpu*.log
      python3 - "$OUT/bench" <<'EOF_MERGE' || rc=1
import json, sys
from pathlib import Path
from moe_core.bench import save_ranking
out = Path(sys.argv[1])
for path in sorted(out.glob("gpu*/ranking-*.json")):
    print("merged", path, "into", save_ranking(json.loads(path.read_text()), out))
EOF_MERGE
      ;;
    *) echo "unknown phase $phase (tests, bench)"; rc=2 ;;
  esac
  echo "== phase $phase: exit $rc after $(( $(date +%s) - start ))s"
  [ "$rc" -eq 0 ] || failed=1
done
exit $failed
