set -x
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv
timeout 220 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_experts.py 2>&1 | tail -15 | tee $OUT/tests_experts.log
timeout 330 python3 .carry/sum_ab.py qwen3-30b-a3b,gpt-oss-120b,mixtral-8x7b,qwen3-235b-a22b,deepseek-v3 8,32,128,512 2 2>&1 | tee $OUT/sum_ab.log
