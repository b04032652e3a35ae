set -x
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
timeout 200 python3 -m pytest -q -x -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "one_token or single_token or zeroing or many_tokens or prefetch or compiles_for_hopper or bias_expert_map" 2>&1 | tail -8 | tee $OUT/tests_late.log
timeout 330 python3 .carry/late_ab.py 3 'gpt-oss-120b:1:early,1.split3,1.split4;qwen3-235b-a22b:1:early,1.split3,1.split4;qwen3-30b-a3b:1:early,1.split2,1.split8;deepseek-v3:1:early,1.split3,1.split4;mixtral-8x7b:1:1.split2,early+1.split2' 2>&1 | tee $OUT/late_ab1.log
