# Session 15, device call 7 (H100): the final code: one-token and real-shape quantized tests, every
# shipped int4 M=1 launch shape, conformance, and the whole-layer benchmark.
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
T=packages/moe-triton/tests
python3 -u -m pytest -q -p no:cacheprovider $T/test_quant.py -k "one_token or single_token or bias_expert_map or zeroing or prefetches or compiles_for_hopper" 2>&1 | tail -3 | tee $OUT/tests_final.log
python3 -u -m pytest -q -p no:cacheprovider -m device $T/test_quant.py -k "real_shapes" 2>&1 | tail -3 | tee -a $OUT/tests_final.log
IDS=$(python3 -m pytest --collect-only -q -p no:cacheprovider $T/test_quant.py -k shipped_int4 2>/dev/null | grep -- '-M1\]')
python3 -u -m pytest -q -p no:cacheprovider $IDS 2>&1 | tail -3 | tee -a $OUT/tests_final.log
python3 -u -m pytest -q -p no:cacheprovider $T/test_triton_conformance.py 2>&1 | tail -3 | tee -a $OUT/tests_final.log
python3 benchmarks/gpu/bench_triton.py --out $OUT/bench_final 2>&1 | grep -v Warning | tail -75
