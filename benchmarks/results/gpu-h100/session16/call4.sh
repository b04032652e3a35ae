rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
timeout 170 python3 .carry/int4_confirm.py mixtral-8x7b:128:64x256x4,mixtral-8x7b:512:128x256x4/128x256x3,deepseek-v3:2048:128x256x4 2>&1 | tee $OUT/int4_confirm.log
timeout 410 python3 .carry/bf16_tile_sweep.py gpt-oss-120b:8/32,qwen3-30b-a3b:8,deepseek-v3:32 2>&1 | tee $OUT/bf16_tile_sweep.log
