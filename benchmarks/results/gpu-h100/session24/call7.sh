rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
OUT=$OUT/bench timeout 420 bash benchmarks/gpu/run.sh .carry/wheels bench > /dev/null 2>&1; echo "bench rc=$?"
tail -5 $OUT/bench/run.log
timeout 150 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_triton_conformance.py 2>&1 | tail -3 | tee $OUT/tests_conformance.log
