# Session 25, H200 call: the int4 wgmma kernel's device tests (its H200 files use it) and the int4
# whole-layer benchmark, on the final wheels.
set -u
source .carry/s25_pre.sh  # = benchmarks/results/gpu-h100/session25/pre.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider -m device packages/moe-triton/tests/test_quant.py -k "wgmma or tail" 2>&1 | tail -4 | tee $OUT/tests_wgmma_h200.log
timeout 200 python3 benchmarks/gpu/bench_triton.py --out $OUT/bench_h200 --dtypes int4 2>&1 | grep -v Warning | tail -40
