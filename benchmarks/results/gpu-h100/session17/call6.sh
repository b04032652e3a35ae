rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
timeout 560 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_experts.py packages/moe-triton/tests/test_align.py packages/moe-triton/tests/test_triton_conformance.py 2>&1 | tail -6 | tee $OUT/tests_final.log
