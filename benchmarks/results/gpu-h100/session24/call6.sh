rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
timeout 540 python3 -m pytest -q -p no:cacheprovider -m device packages/moe-triton/tests/test_quant.py -k "wgmma or tail or real_shapes" 2>&1 | tail -15 | tee $OUT/tests_wgmma_hoist.log
