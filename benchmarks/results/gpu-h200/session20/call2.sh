rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
W=bn256+wgmma
timeout 420 python3 .carry/variant_ab.py 2 "qwen3-235b-a22b:8192:$W+s4,$W+s3+tail8;qwen3-30b-a3b:8192:$W+s4;gpt-oss-120b:8192:$W+s3+tail16;deepseek-v3:8192:$W+s3+tail16;mixtral-8x7b:2048:$W+s3;mixtral-8x7b:8192:$W+s3" 2>&1 | grep -v Warn | tee $OUT/h200_ab2.log
timeout 150 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "wgmma or tail" 2>&1 | tail -3 | tee $OUT/h200_tests_wgmma.log
