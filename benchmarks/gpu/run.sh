#!/usr/bin/env bash
# One device call: install the project from wheels, then run the requested phases.
#
#   here:       uv build --all-packages -o .carry/wheels
#   on the GPU: bash benchmarks/gpu/run.sh .carry/wheels tests tune bench
#
# Phases, in the order given:
# tests: the device-marked tests (moe-triton, transformers parity) and moe-core's conformance suite
#        for moe-triton, with MOE_TEST_REQUIRE_DEVICE=cuda so a missing GPU fails instead of skipping;
#        over pytest-xdist workers where it is installed. Where the time goes, serially:
#        PYTHONPATH=benchmarks/gpu pytest -p compile_timing ... (benchmarks/gpu/compile_timing.py).
# parity: only the transformers parity tests on cuda (a subset of tests).
# profile: benchmarks/gpu/profile_layer.py: GPU time per kernel of one layer call -> $OUT/profile_<device>.json.
# ncu: Nsight Compute counters (throughput, occupancy, stall reasons) of both GEMMs of one layer call
#      for a few cells (benchmarks/gpu/ncu_layer.py) -> $OUT/ncu_<preset>_<dtype>_M<m>.txt.
# tune:  python -m moe_triton.tune for the five presets -> $OUT/configs.tar (copy into moe_triton/configs/).
# bench: benchmarks/gpu/bench_layer.py -> $OUT/bench_triton_<device>.{json,md,png}; uses the
#        configs tuned in this same call when the tune phase ran first.
# A/B experiments are not a phase: run benchmarks/gpu/ab_layer.py directly (its docstring).
# Everything printed also goes to $OUT/run.log. Each phase's exit status is reported; a failing
# phase does not stop the later ones, and the script exits non-zero if any failed.
set -uo pipefail
WHEELS=${1:?usage: run.sh WHEEL_DIR PHASE...}
shift
# shellcheck source=benchmarks/gpu/_setup.sh
source "$(dirname "$0")/_setup.sh" run.log
# The tests spend most of a serial run compiling kernels on the CPU (-p compile_timing shows it): spread
# them over up to 8 pytest-xdist workers where it is installed.
XDIST=()
if python3 -c "import xdist" 2>/dev/null; then XDIST=(-n "$(( $(nproc) < 8 ? $(nproc) : 8 ))"); fi
failed=0
for phase in "$@"; do
  start=$(date +%s)
  case "$phase" in
    tests)
      # Device-marked tests (Triton kernels at real shapes, transformers parity on cuda), then the
      # moe-core conformance suite against every moe-triton experts class on this GPU.
      MOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider "${XDIST[@]}" --durations=10 -m device \
        "$ROOT/packages/moe-triton/tests" "$ROOT/integration/test_transformers_parity.py"
      rc=$?
      # The act-order tests carry no device mark: they run on whatever device is present.
      python3 -m pytest -q -p no:cacheprovider "${XDIST[@]}" "$ROOT/packages/moe-triton/tests/test_act_order.py" || rc=1
      MOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider "${XDIST[@]}" \
        "$ROOT/packages/moe-triton/tests/test_triton_conformance.py" || rc=1 ;;
    parity)
      MOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -m device \
        "$ROOT/integration/test_transformers_parity.py"
      rc=$? ;;
    profile)
      python3 "$HERE/profile_layer.py" --out "$OUT"
      rc=$? ;;
    ncu)
      bash "$HERE/ncu_cells.sh" "$OUT" "deepseek-v3 int4 1" "qwen3-30b-a3b int4 1" "qwen3-30b-a3b int4 8" \
        "mixtral-8x7b int4 8192" "qwen3-30b-a3b bf16 1"
      rc=$? ;;
    tune)
      python3 -m moe_triton.tune --out "$OUT/configs"
      rc=$?
      tar -C "$OUT" -cf "$OUT/configs.tar" configs && rm -rf /tmp/moe-tuned && mv "$OUT/configs" /tmp/moe-tuned ;;
    bench)
      if [ -d /tmp/moe-tuned ]; then export MOE_TRITON_CONFIG_DIR=/tmp/moe-tuned; fi
      python3 "$HERE/bench_layer.py" --out "$OUT"
      rc=$? ;;
    *) echo "unknown phase $phase (tests, parity, profile, ncu, tune, bench)"; rc=2 ;;
  esac
  echo "== phase $phase: exit $rc after $(( $(date +%s) - start ))s"
  [ "$rc" -eq 0 ] || failed=1
done
exit $failed
