rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
timeout 540 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "wgmma or tail or (shipped_int4_shapes and (M512 or M2048 or M8192))" 2>&1 | tail -5 | tee $OUT/h200_tests.log
