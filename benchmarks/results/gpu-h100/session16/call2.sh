rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
timeout 580 python3 .carry/int4_mid_sweep.py mixtral-8x7b:128/512,qwen3-30b-a3b:512,qwen3-235b-a22b:512,gpt-oss-120b:2048,deepseek-v3:2048 1 2>&1 | tee $OUT/int4_mid_sweep.log
