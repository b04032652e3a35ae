rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
python3 .carry/ptxas_tail.py 2>&1 | grep -v Warn | tee $OUT/ptxas_tail.log
timeout 150 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "tail or wgmma" 2>&1 | tail -4 | tee $OUT/tests_tail.log
timeout 330 python3 .carry/variant_ab.py 3 'deepseek-v3:8192:tail8,tail16;qwen3-235b-a22b:8192:tail8,tail16;qwen3-235b-a22b:2048:tail8,tail16;gpt-oss-120b:8192:tail8,tail16;qwen3-30b-a3b:8192:tail8,tail16;qwen3-30b-a3b:2048:tail8,tail16;mixtral-8x7b:512:tail8,tail16;mixtral-8x7b:2048:tail8,tail16' 2>&1 | grep -v Warn | tee $OUT/tail_ab.log
