rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
timeout 560 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py 2>&1 | tail -15 | tee $OUT/tests_quant.log
