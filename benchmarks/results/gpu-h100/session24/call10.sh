rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
timeout 260 python3 .carry/swizzle_inproc.py 2 "qwen3-30b-a3b:2048,8192;mixtral-8x7b:512,2048;qwen3-235b-a22b:2048,8192;deepseek-v3:2048;gpt-oss-120b:8192" 2>&1 | grep -v Warning | tee $OUT/swizzle_inproc.log
timeout 300 python3 -m pytest -q -p no:cacheprovider -m device packages/moe-triton/tests/test_quant.py -k "wgmma or tail" 2>&1 | tail -4 | tee $OUT/tests_swizzle.log
