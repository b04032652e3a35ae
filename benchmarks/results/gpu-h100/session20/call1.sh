rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
python3 .carry/ptxas_tl_tail.py 2>&1 | grep -v Warn | tee $OUT/ptxas_tl_tail.log
timeout 420 python3 .carry/variant_ab.py 3 'qwen3-235b-a22b:512:tail16,tail16+s3;qwen3-30b-a3b:512:tail16,tail16+s3;mixtral-8x7b:128:tail16;gpt-oss-120b:2048:tail16,tail32;gpt-oss-120b:512:tail16;deepseek-v3:2048:tail16,tail8;deepseek-v3:512:tail16' 2>&1 | grep -v Warn | tee $OUT/tl_tail_ab.log
timeout 100 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "tail" 2>&1 | tail -4 | tee $OUT/tests_tail.log
