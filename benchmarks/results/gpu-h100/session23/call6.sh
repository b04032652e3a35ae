rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
timeout 400 python3 -m pytest -v -p no:cacheprovider -m device packages/moe-triton/tests/test_experts.py -k "persistent or real_shapes" 2>&1 | grep -E "PASS|FAIL|ERROR|passed|failed" | tail -14 | tee $OUT/tests_tail_role_bf16.log
