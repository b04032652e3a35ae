rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
V="pers+g1,pers+g2,pers+g4,pers,pers+g16,1.pers+1.g4,2.pers+2.g4"
timeout 560 python3 .carry/pers_ab.py 2 "qwen3-235b-a22b:2048:$V;qwen3-235b-a22b:8192:$V;mixtral-8x7b:8192:$V;mixtral-8x7b:2048:$V;qwen3-30b-a3b:8192:$V;qwen3-30b-a3b:2048:$V;gpt-oss-120b:8192:$V;deepseek-v3:8192:$V;mixtral-8x7b:512:$V;qwen3-30b-a3b:512:$V,pers+bm128;qwen3-235b-a22b:512:$V,pers+bm128;gpt-oss-120b:2048:$V;deepseek-v3:2048:$V" 2>&1 | tee $OUT/pers_ab3.log
