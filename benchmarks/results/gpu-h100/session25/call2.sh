# Session 25, device call 2 (H100): test_quant.py's device tests (but the shipped-shapes ones) and the
# moe-core conformance suite, on the final wheels (retuned configs merged).
set -u
source .carry/s25_pre.sh  # = benchmarks/results/gpu-h100/session25/pre.sh
T=packages/moe-triton/tests
timeout 440 python3 -m pytest -q -p no:cacheprovider -m device $T/test_quant.py -k "not shipped_int4" 2>&1 | tail -5 | tee $OUT/tests_quant_device.log
timeout 140 python3 -m pytest -q -p no:cacheprovider $T/test_triton_conformance.py 2>&1 | tail -3 | tee $OUT/tests_conformance.log
