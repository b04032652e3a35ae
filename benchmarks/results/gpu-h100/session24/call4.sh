rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
run() { timeout $1 python3 .carry/variant_ab.py 2 "$2" 2>&1 | grep -v Warning | tee -a $OUT/smem_ab2.log; echo "rc=${PIPESTATUS[0]}"; }
run 170 "qwen3-30b-a3b:2048:smem1+tail0,smem2+tail0,smem2+tail0+bm64+s4,smem2+tail16+bm64+s4"
run 170 "deepseek-v3:2048:smem2+s3,smem2+bm64+s4,smem2+bm64+s4+tail16"
run 150 "gpt-oss-120b:2048:smem2+s4,smem2+s3+tail16"
run 150 "qwen3-235b-a22b:2048:smem2+tail0+s3,smem2+bm64+s4+tail16"
run 150 "mixtral-8x7b:128:smem2+s4;qwen3-30b-a3b:512:smem2+s4+tail16"
run 150 "qwen3-30b-a3b:8192:smem2+s3;mixtral-8x7b:2048:smem2+s3"
