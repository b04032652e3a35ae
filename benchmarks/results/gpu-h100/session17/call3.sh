rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
python3 .carry/int4_bm256.py mixtral-8x7b:512/2048/8192,qwen3-235b-a22b:2048/8192,qwen3-30b-a3b:2048/8192,gpt-oss-120b:2048/8192,deepseek-v3:2048/8192 2>&1 | grep -v "UserWarn\|warn_once" | tee $OUT/int4_bm256.log
timeout 200 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "wgmma" 2>&1 | tail -4 | tee $OUT/tests_wgmma.log
