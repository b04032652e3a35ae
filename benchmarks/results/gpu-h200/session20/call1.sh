rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
nvidia-smi --query-gpu=name --format=csv,noheader
W=bm128+bn256+wgmma
timeout 540 python3 .carry/variant_ab.py 2 "qwen3-235b-a22b:512:tail16,tail16+s4;qwen3-30b-a3b:512:tail16,tail16+s3;deepseek-v3:512:tail16;gpt-oss-120b:512:tail16;qwen3-235b-a22b:2048:$W+s4,$W+s4+tail16;qwen3-30b-a3b:2048:$W+s4,$W+s3+tail16;deepseek-v3:2048:$W+s4;gpt-oss-120b:2048:$W+s4,$W+s3+tail16;mixtral-8x7b:512:$W+s3,$W+s3+tail16" 2>&1 | grep -v Warn | tee $OUT/h200_ab1.log
