#!/usr/bin/env bash
# One device call for moe-cuda and the side-by-side benchmark: install the project from wheels, unpack
# the carried vendor libraries, then run the requested jobs over every visible GPU at once
# (benchmarks/gpu/gpu_jobs.py: one worker per GPU takes the next job, longest first).
#
#   here:       uv build --all-packages --wheel -o .carry/wheels
#               (the vendor libraries, xz-compressed: .carry/vendor/_moe_C_stable_libtorch.abi3.so.xz from
#                vllm 0.26.0, .carry/vendor/common_ops.abi3.so.xz from sglang-kernel 0.4.6's sgl_kernel/sm90/;
#                for the peers phase .carry/vendor/triton_kernels from vllm 0.26.0's wheel:
#                bash benchmarks/gpu/extract_triton_kernels.sh VLLM_WHEEL .carry/vendor)
#   on the GPU: bash benchmarks/gpu/run_moe_cuda.sh .carry/wheels [.carry/vendor] [PHASE...]
#               (carry: .carry/wheels and .carry/vendor)
#
# Phases (default: tests bench), each a set of jobs:
# tests:        moe-cuda's tests (device-marked ones and moe-core's conformance suite), one job (TESTS_K:
#               only those pytest -k selects; the whole suite has outlasted 230 s).
# triton-tests: moe-triton's device-marked tests and its act-order tests, one job.
# bench:        `moe bench --backends all`, one job per preset and scheme: every installed backend side
#               by side on the same layers; each job writes $OUT/bench/P-S/bench-*.json after every
#               measured cell (a job stopped by the deadline keeps what it measured) and ranking-<device>.json
#               once every backend has run (a stopped job ranks nothing: its backends run one after the
#               other); the rankings are merged into $OUT/bench/ranking-<device>.json (copy it into
#               packages/moe-core/src/moe_core/rankings_data/).
# peers:        OpenAI triton_kernels' matmul_ogs MXFP4 layer (benchmarks/gpu/peer_matmul_ogs.py), one job
#               per preset -> $OUT/peers/P/peer_matmul_ogs.json.
# flashinfer:   FlashInfer's sm_90 fused MoE, from FLASHINFER_BUNDLE (default .carry/flashinfer: the pruned
#               flashinfer-python 0.7.2.post1 package as fi_pruned.tar.xz, and the apache-tvm-ffi cp312 wheel;
#               benchmarks/results/flashinfer_sm90_jit_2026-11-27.md says what they hold), its module narrowed
#               to FlashInferCutlassExperts' kernels (variant bf16-fp8 of benchmarks/gpu/flashinfer_sm90.py):
#               built in the background while the other jobs run, then one job runs moe-cuda's FlashInfer
#               tests, one `moe bench --backends all` job per preset and scheme (bf16, fp8-block) times it
#               beside every other backend (bench/P-S-flashinfer), and flashinfer-explain prints the oracle's
#               choice with FlashInfer installed (jobs/flashinfer-explain.log), and flashinfer-parity times the
#               layer against FlashInfer's documented call (flashinfer_parity.py -> parity/flashinfer_parity.json).
#               Only these jobs can import FlashInfer. FLASHINFER_TESTS_ONLY=1: its tests, no other job.
#               A module built here comes back as $OUT/fused_moe_90-VARIANT.so.xz.part-*; put those parts in
#               the bundle and a later call loads them instead of building (7-8 minutes on 64 CPUs).
# flashinfer-mxfp4: the same for FlashInferCutlassMxfp4Experts (variant mxfp4: its own module, so its jobs
#               import another copy of FlashInfer): its tests and one mxfp4 bench job per preset
#               (bench/P-mxfp4-flashinfer). Two modules do not build in one call: carry at least one built.
# retune:       RETUNE="preset:M,M ...", RETUNE_QUANT (mxfp4, or int8, fp8-tensor/-channel/-block): per preset,
#               `moe tune --quant $RETUNE_QUANT` (MXFP4 and int8: with --wgmma) at those token counts
#               ($OUT/retune/P/configs), then the triton layer timed with the launch shapes it has now
#               (retune/P/before; MXFP4: int4 beside it) and with the tuned ones (retune/P/tuned), and for
#               MXFP4 the matmul_ogs peer (retune/P/peer; where triton_kernels was carried), one after the
#               other on one GPU. With
#               BASE_WHEELS set, the layer is first timed with that build of the project (retune/P/base);
#               RETUNE_EXTRA: more `moe tune` options (e.g. --per-gemm).
# parity:       moe-cuda's Marlin layer against vLLM's Marlin MoE pipeline over the same library
#               (benchmarks/gpu/marlin_parity.py), its SGLang fp8 block layer against SGLang's CUTLASS
#               fp8 MoE flow (sglang_parity.py) and its torch grouped GEMM layer against the tightest
#               torch-only flow (grouped_mm_parity.py), one job each -> $OUT/parity/*_parity.json.
# host:         host and GPU time per eager call of the Marlin (int4, int8), SGLang fp8 block and torch
#               grouped GEMM layers, qwen3-30b-a3b and mixtral-8x7b (benchmarks/gpu/bench_host_path.py
#               --backend), one job per backend -> $OUT/host/host-path-layer-BACKEND-*.json.
# base:         with BASE_WHEELS set, one job per preset and scheme: the triton layer alone timed with that
#               build of the project (`moe bench --backends triton` -> $OUT/base/P-S), to set beside the
#               bench phase's triton cells of this build (a before/after of a kernel change; kept out of
#               the merged ranking).
# cells:        CELLS="preset/scheme[+scheme...]/M,M/backends ...": one `moe bench` job per entry (backends a comma list, or
#               all) -> $OUT/cells/P-S-BACKENDS, kept out of the merged ranking (a re-check of a few cells).
# Jobs run in the order of PHASES, retune first whatever its place (the longest).
# What the benchmark measures: BENCH_PRESETS (default: the five real presets, largest first),
# BENCH_SCHEMES (default: bf16 fp8-block fp8-channel int8 int4 mxfp4), BENCH_TOKENS (default:
# 1 8 32 128 512 2048 8192). JOB_FILTER: an extended regex; only jobs whose whole names it matches
# run. DEADLINE: seconds after which no job starts and running ones stop (540).
# Everything printed also goes to $OUT/run_moe_cuda.log; everything else (job logs jobs/NAME.log, their
# exit statuses jobs/jobs.json, bench/, peers/) is packed into $OUT/results.tar.gz at the end (the device
# tool brings back a few files only); the script exits non-zero if a job failed or never started.
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
  [ -e "$packed" ] || { echo "no vendor libraries in $VENDOR: moe-cuda's Marlin and SGLang backends stay unavailable"; break; }
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

# shellcheck disable=SC2206
presets=(${BENCH_PRESETS:-deepseek-v3 qwen3-235b-a22b gpt-oss-120b mixtral-8x7b qwen3-30b-a3b})
if [ -n "${BASE_WHEELS:-}" ]; then
  BASE_SITE=/tmp/moe-site-base
  rm -rf "$BASE_SITE" && python3 -m pip install -q --no-deps --no-index --no-compile --target "$BASE_SITE" \
    "$BASE_WHEELS"/*.whl || exit 3
fi

# FlashInfer: unpacked once per machine and module variant (/tmp/fi/VARIANT); a module not in the bundle
# builds in the background (all CPUs but a few for the GPU jobs' Triton compiles) while the GPUs run the
# other jobs; that variant's jobs wait for the outcome (fi_wait).
FI=/tmp/fi
FI_BUILDS=()
start_flashinfer() {
  local variant=$1 bundle=${FLASHINFER_BUNDLE:-.carry/flashinfer} dir=$FI/$1
  if [ ! -d $dir/pkg/flashinfer ]; then
    mkdir -p $dir/pkg && tar -xJf "$bundle"/fi_pruned.tar.xz -C $dir/pkg || exit 5
  fi
  if [ ! -d $FI/site/tvm_ffi ]; then
    python3 -m pip install -q --no-deps --no-index --target $FI/site "$bundle"/apache_tvm_ffi-*.whl || exit 5
  fi
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
  export CUDA_HOME TVM_FFI_DISABLE_TORCH_C_DLPACK=1 TRTLLM_DG_CACHE_DIR=$FI/deepgemm
  echo "flashinfer $variant: CUDA_HOME=$CUDA_HOME ($(nvcc --version | tail -n 1)), $(nproc) CPUs"
  rm -f $dir/built $dir/failed $dir/exported $dir/part-*
  local aot=$dir/pkg/flashinfer/data/aot/fused_moe_90/fused_moe_90.so parts="$bundle/fused_moe_90-$variant.so.xz.part-"
  if compgen -G "$parts*" > /dev/null; then
    # The module an earlier call built and sent back: no build.
    mkdir -p "$(dirname $aot)" && cat "$parts"* | xz -d > $aot && touch $dir/built \
      && echo "flashinfer $variant: the module built by an earlier call ($(du -h $aot | cut -f1))"
    return
  fi
  # Each nvcc takes up to ~8 GB; a dozen CPUs stay with the GPU jobs on the larger machines. The built
  # module is also sent back compressed, 15 MiB a part (the device tool's file limit).
  local cpus mem_jobs
  cpus=$(( $(nproc) > 16 ? $(nproc) - 12 : $(nproc) - 2 )); mem_jobs=$(( $(free -g | awk '/Mem:/ {print $2}') / 9 ))
  setsid bash -c "PYTHONPATH=$PYTHONPATH:$dir/pkg:$FI/site python3 $HERE/flashinfer_sm90.py --variant $variant \
      --workspace $dir/ws --jobs $(( cpus < mem_jobs ? cpus : mem_jobs )) > $OUT/flashinfer_build_$variant.log 2>&1 \
      && touch $dir/built && xz -T0 --block-size=4MiB -6 -c $aot | split -b 15M - $dir/part- && touch $dir/exported \
      || touch $dir/failed" &
  FI_BUILDS+=("$variant:$!")
}
# fi_wait VARIANT: the shell prefix of a job that needs that module.
fi_wait() {
  local dir=$FI/$1
  printf 'until [ -e %s/built ] || [ -e %s/failed ]; do sleep 5; done; [ -e %s/built ] && export PYTHONPATH=$PYTHONPATH:%s/pkg:%s/site FLASHINFER_DISABLE_JIT=1 && ' \
    "$dir" "$dir" "$dir" "$dir" "$FI"
}
add_flashinfer_tests() {  # add_flashinfer_tests VARIANT PYTEST_K
  printf 'flashinfer-%s-tests	%sMOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -k "%s" %s\n' \
    "$1" "$(fi_wait "$1")" "$2" "$ROOT/packages/moe-cuda/tests" >> "$JOBS"
}

JOBS=$OUT/jobs.txt
: > "$JOBS"
# bench_job JOB PREFIX BACKENDS OUT_DIR PRESET SCHEME: one `moe bench` job of those backends
bench_job() {
  # gpt-oss-120b's K = N = 2880 is no multiple of 128: every backend refuses its 128x128 fp8 blocks.
  [ "$5-$6" = gpt-oss-120b-fp8-block ] && return
  printf '%s\t%spython3 -m moe_core bench --device cuda --backends %s --no-plot --preset %s --scheme %s --tokens %s --out %s\n' \
    "$1" "$2" "$3" "$5" "$6" "${BENCH_TOKENS:-1 8 32 128 512 2048 8192}" "$4" >> "$JOBS"
}
# add_bench PRESET SCHEME [NAME_SUFFIX [PREFIX]]: one `moe bench --backends all` job -> $OUT/bench/PRESET-SCHEME[-SUFFIX]
add_bench() {
  local name=$1-$2${3:+-$3}
  bench_job "bench-$name" "${4:-}" all "$OUT/bench/$name" "$1" "$2"
}
if [[ " ${PHASES[*]} " == *" retune "* ]]; then PHASES=(retune "${PHASES[@]/retune/}"); fi
for phase in "${PHASES[@]}"; do
  case "$phase" in
    tests)
      # Serial: xdist workers would each compile Marlin's PTX before the cache holds it.
      # TESTS_K: a pytest -k expression, to run a few of them where the whole suite outlasts a call.
      printf 'moe-cuda-tests\tMOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider --durations=15 %s %s\n' \
        "${TESTS_K:+-k \"$TESTS_K\"}" "$ROOT/packages/moe-cuda/tests" >> "$JOBS" ;;
    triton-tests)
      # The device-marked tests, then the act-order tests, which carry no device mark (they run on the GPU
      # when one is present).
      printf 'moe-triton-tests\tMOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -n 8 --durations=10 -m device %s; rc=$?; python3 -m pytest -q -p no:cacheprovider -n 8 %s && exit $rc\n' \
        "$ROOT/packages/moe-triton/tests" "$ROOT/packages/moe-triton/tests/test_act_order.py" >> "$JOBS" ;;
    bench)
      for p in "${presets[@]}"; do
        for s in ${BENCH_SCHEMES:-bf16 fp8-block fp8-channel int8 int4 mxfp4}; do add_bench "$p" "$s"; done
      done ;;
    flashinfer)
      # A call into the other variant's kernels would end the process: each job keeps to its module.
      start_flashinfer bf16-fp8
      add_flashinfer_tests bf16-fp8 "(flashinfer or FlashInfer) and not (mxfp4 or Mxfp4)"
      [ -n "${FLASHINFER_TESTS_ONLY:-}" ] && continue
      # The oracle's choice with FlashInfer installed, in a cell the shipped ranking gives it and one it does not.
      printf 'flashinfer-explain\t%spython3 -m moe_core explain --device cuda --preset mixtral-8x7b --quant fp8-block --tokens 512 && python3 -m moe_core explain --device cuda --preset qwen3-30b-a3b --quant fp8-block --tokens 512\n' \
        "$(fi_wait bf16-fp8)" >> "$JOBS"
      printf 'flashinfer-parity\t%spython3 %s --kernels --out %s\n' "$(fi_wait bf16-fp8)" \
        "$HERE/flashinfer_parity.py" "$OUT/parity" >> "$JOBS"
      # fp8 blocks first: there FlashInfer's DeepGEMM kernels may win cells; its bf16 layer is 2-7x slower
      # than moe-triton's in every cell of the parity run.
      for s in fp8-block bf16; do
        for p in "${presets[@]}"; do add_bench "$p" "$s" flashinfer "$(fi_wait bf16-fp8)"; done
      done ;;
    flashinfer-mxfp4)
      start_flashinfer mxfp4
      add_flashinfer_tests mxfp4 "(flashinfer or FlashInfer) and (mxfp4 or Mxfp4)"
      for p in "${presets[@]}"; do add_bench "$p" mxfp4 flashinfer "$(fi_wait mxfp4)"; done ;;
    peers)
      for p in "${presets[@]}"; do
        printf 'peer-matmul-ogs-%s\tpython3 %s --triton-kernels %s --preset %s --m %s --check --out %s\n' \
          "$p" "$HERE/peer_matmul_ogs.py" "$VENDOR" "$p" "${BENCH_TOKENS:-1 8 32 128 512 2048 8192}" \
          "$OUT/peers/$p" >> "$JOBS"
      done ;;
    retune)
      # RETUNE="preset:M,M ...": per preset one job: moe tune --quant $RETUNE_QUANT (mxfp4) at those M,
      # then the layer timed with the launch shapes it has now and with the tuned ones; for MXFP4 also
      # int4 beside the first and, where triton_kernels was carried, the matmul_ogs peer.
      q=${RETUNE_QUANT:-mxfp4}
      for cell in ${RETUNE:?retune needs RETUNE=\"preset:M,M ...\"}; do
        p=${cell%%:*}; ms=${cell#*:}; ms=${ms//,/ }; d=$OUT/retune/$p
        bench="python3 -m moe_core bench --device cuda --backends triton --no-plot --preset $p --tokens $ms"
        if [ "$q" = mxfp4 ]; then
          tune="--quant mxfp4 --wgmma"; before="--scheme mxfp4 --scheme int4"; peer=""
          # The peer where triton_kernels was carried (the header says how); the search needs none.
          if [ -f "$VENDOR/triton_kernels/matmul_ogs.py" ]; then
            peer=" && python3 $HERE/peer_matmul_ogs.py --triton-kernels $VENDOR --preset $p --m $ms --out $d/peer"
          else
            echo "retune-$p-mxfp4: no $VENDOR/triton_kernels (matmul_ogs.py): the matmul_ogs peer is left out"
          fi
        elif [ "$q" = int8 ]; then
          tune="--quant int8 --wgmma"; before="--scheme int8"; peer=""
        else
          tune="--quant $q"; before="--scheme $q"; peer=""
        fi
        tune="$tune ${RETUNE_EXTRA:-}"
        base=""
        [ -n "${BASE_SITE:-}" ] && base="PYTHONPATH=$BASE_SITE $bench --scheme $q --out $d/base && "
        printf 'retune-%s-%s\t%spython3 -m moe_triton.tune %s --preset %s --m %s --out %s && %s %s --out %s && MOE_TRITON_CONFIG_DIR=%s %s --scheme %s --out %s%s\n' \
          "$p" "$q" "$base" "$tune" "$p" "$ms" "$d/configs" "$bench" "$before" "$d/before" "$d/configs" "$bench" "$q" \
          "$d/tuned" "$peer" >> "$JOBS"
      done ;;
    parity)
      printf 'marlin-parity\tpython3 %s --kernels --out %s\n' "$HERE/marlin_parity.py" "$OUT/parity" >> "$JOBS"
      printf 'sglang-parity\tpython3 %s --kernels --out %s\n' "$HERE/sglang_parity.py" "$OUT/parity" >> "$JOBS"
      printf 'grouped-mm-parity\tpython3 %s --kernels --out %s\n' "$HERE/grouped_mm_parity.py" "$OUT/parity" >> "$JOBS" ;;
    host)
      # Host and GPU time per eager call of each moe-cuda backend's layer (bench_host_path.py --backend).
      for cell in "marlin:int4 int8" "sglang_fp8_block:fp8-block" "torch_grouped_mm:bf16"; do
        printf 'host-%s\tpython3 %s --backend %s --schemes %s --presets qwen3-30b-a3b mixtral-8x7b --out %s\n' \
          "${cell%%:*}" "$HERE/bench_host_path.py" "${cell%%:*}" "${cell#*:}" "$OUT/host" >> "$JOBS"
      done ;;
    base)
      [ -n "${BASE_SITE:-}" ] || { echo "the base phase needs BASE_WHEELS"; exit 2; }
      for p in "${presets[@]}"; do
        for s in ${BENCH_SCHEMES:-bf16 fp8-block fp8-channel int8 int4 mxfp4}; do
          bench_job "base-$p-$s" "PYTHONPATH=$BASE_SITE " triton "$OUT/base/$p-$s" "$p" "$s"
        done
      done ;;
    cells)
      for cell in ${CELLS:?cells needs CELLS=\"preset/scheme/M,M/backends ...\"}; do
        IFS=/ read -r p s ms backends <<< "$cell"
        BENCH_TOKENS=${ms//,/ } bench_job "cells-$p-$s-${backends//,/+}" "" "$backends" "$OUT/cells/$p-$s-${backends//,/+}" "$p" "${s//+/ --scheme }"
      done ;;
    "") ;;
    *) echo "unknown phase $phase (tests, triton-tests, bench, flashinfer, flashinfer-mxfp4, peers, retune, parity, host, base, cells)"; exit 2 ;;
  esac
done
if [ -n "${JOB_FILTER:-}" ]; then grep -E "^(${JOB_FILTER})"$'\t' "$JOBS" > "$JOBS.kept"; mv "$JOBS.kept" "$JOBS"; fi
start=$(date +%s)
python3 "$HERE/gpu_jobs.py" "$JOBS" --out "$OUT/jobs" --deadline-s "${DEADLINE:-540}"
failed=$?
echo "== jobs: exit $failed after $(( $(date +%s) - start ))s"
for build in "${FI_BUILDS[@]}"; do
  variant=${build%%:*}; pid=${build#*:}
  # A build the deadline cut short stops here; ninja resumes from its objects in a later call on this machine.
  # A finished one is left to compress its module.
  [ -e $FI/$variant/built ] || { kill -- -"$pid" 2>/dev/null && echo "== flashinfer $variant build stopped at the deadline"; }
  wait "$pid" 2>/dev/null  # its log is complete before it is packed
  echo "== flashinfer $variant build"
  grep -E "^flashinfer_sm90|Error|error:|^\[[0-9]+/[0-9]+\]" "$OUT/flashinfer_build_$variant.log" | cut -c1-160 | tail -n 20
done
for log in "$OUT"/jobs/*tests.log; do [ -f "$log" ] && { echo "== $log"; tail -n 5 "$log"; }; done
[ -f "$OUT/jobs/flashinfer-explain.log" ] && { echo "== flashinfer-explain"; cat "$OUT/jobs/flashinfer-explain.log"; }
if [ -d "$OUT/bench" ]; then
  python3 - "$OUT/bench" <<'EOF_MERGE' || failed=1
import json, sys
from pathlib import Path
from moe_core.bench import save_ranking
out = Path(sys.argv[1])
for path in sorted(out.glob("*/ranking-*.json")):
    print("merged", path, "into", save_ranking(json.loads(path.read_text()), out))
EOF_MERGE
fi
# The device tool brings back a few files only: everything but the logs above in one archive.
tar -czf /tmp/moe-results.tar.gz -C "$OUT" --exclude=run_moe_cuda.log . && \
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name run_moe_cuda.log -exec rm -rf {} + && mv /tmp/moe-results.tar.gz "$OUT/results.tar.gz"
for build in "${FI_BUILDS[@]}"; do
  variant=${build%%:*}
  if [ -e $FI/$variant/exported ]; then
    for part in $FI/$variant/part-*; do cp "$part" "$OUT/fused_moe_90-$variant.so.xz.${part##*/}"; done
    ls -l "$OUT"/fused_moe_90-"$variant".so.xz.part-*
  fi
done
exit $failed
