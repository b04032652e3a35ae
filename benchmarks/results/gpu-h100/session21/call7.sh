rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
timeout 280 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_experts.py -k "wgmma or persistent or real_shapes" 2>&1 | tail -4 | tee $OUT/tests_final.log
timeout 120 python3 .carry/pers_ab.py 2 "mixtral-8x7b:8192:1.pers" 2>&1 | grep -v "vs shipped 0.00e+00" | tee $OUT/final_smoke.log
