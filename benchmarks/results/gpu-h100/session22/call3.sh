rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
timeout 100 python3 -m pytest -q -x -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "persistent_wgmma_blocks_on_gpu and 0" 2>&1 | grep -E "Error|error|assert|Mismatch|elements|Greatest|passed|failed" | head -20 | tee $OUT/tests_blocks0.log
timeout 100 python3 -m pytest -q -x -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "few-tokens" 2>&1 | grep -E "Error|error|assert|Mismatch|elements|Greatest|passed|failed" | head -12 | tee $OUT/tests_few.log
timeout 360 python3 .carry/variant_ab.py 2 'qwen3-30b-a3b:8192:pers;mixtral-8x7b:2048:pers;deepseek-v3:2048:pers;qwen3-235b-a22b:2048:tail0,pers+tail0;mixtral-8x7b:8192:pers' 2>&1 | tee $OUT/pers_ab2.log
