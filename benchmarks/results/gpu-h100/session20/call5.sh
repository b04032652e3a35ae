rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
timeout 400 python3 .carry/old_new_ab.py 3 'qwen3-235b-a22b:1,8,128;gpt-oss-120b:1,512,2048;qwen3-30b-a3b:1,32;mixtral-8x7b:128;deepseek-v3:1,512' 2>&1 | grep -v Warn | tee $OUT/old_new_ab.log
