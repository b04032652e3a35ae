rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
timeout 500 python3 .carry/variant_ab.py 3 'qwen3-30b-a3b:512:tail16+s3,tail16+s3+bn128,tail16+s3+1.bn128,tail16+s3+2.bn128,tail16+s2,tail16+s3+w8,tail16+s5;qwen3-235b-a22b:512:tail16+s3,tail16+s3+2.bn128,tail16+s5,tail16+s3+w8;mixtral-8x7b:128:bn128,s3,s5,2.split2,1.bn128' 2>&1 | grep -v Warn | tee $OUT/tl_tail_ab2.log
