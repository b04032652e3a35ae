rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
timeout 200 python3 .carry/old_new_ab.py 5 'qwen3-235b-a22b:1,128;gpt-oss-120b:1,2048;qwen3-30b-a3b:1,32;deepseek-v3:1,512;mixtral-8x7b:1,128' 2>&1 | grep -v Warn | tee $OUT/old_new_ab_mended.log
timeout 150 python3 .carry/variant_ab.py 3 'qwen3-235b-a22b:512:tail0+s4;qwen3-30b-a3b:512:tail0+s4' 2>&1 | grep -v Warn | tee $OUT/tl_tail_ab_mended.log
timeout 200 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "tail or (shipped_int4_shapes and NVIDIA_H100 and M512) or single_token or last_arrival" 2>&1 | tail -3 | tee $OUT/tests_mended.log
