rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
run() { timeout $1 python3 .carry/variant_ab.py 2 "$2" 2>&1 | grep -v Warning | tee -a $OUT/smem_ab.log; echo "rc=${PIPESTATUS[0]}"; }
run 150 "qwen3-30b-a3b:2048:smem+tail0,smem+tail0+bm64+s4,smem+tail16+bm64+s4"
run 150 "gpt-oss-120b:2048:smem+s4,smem+s4+tail16,smem+bm128+s3"
run 200 "deepseek-v3:2048:smem+s3,smem+bm64+s4,smem+bm64+s4+tail16"
run 150 "qwen3-235b-a22b:2048:smem+tail0+s3,smem+bm64+s4+tail16"
run 150 "qwen3-30b-a3b:512:smem+s4+tail16,smem+s4+tail0;mixtral-8x7b:128:smem+s4,smem+s6"
run 150 "qwen3-30b-a3b:8192:smem+s3;gpt-oss-120b:8192:smem+tail0+s3"
