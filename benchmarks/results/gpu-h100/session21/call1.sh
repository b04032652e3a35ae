set -x
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
timeout 200 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_experts.py -k "wgmma_gemm_on_gpu or persistent" 2>&1 | tail -15 | tee $OUT/tests_pers.log
V="wgmma,pers,pers+g1,pers+s3"
timeout 330 python3 .carry/pers_ab.py 2 "mixtral-8x7b:8192:$V;mixtral-8x7b:2048:$V;qwen3-30b-a3b:8192:$V;qwen3-30b-a3b:2048:$V;deepseek-v3:8192:$V;qwen3-235b-a22b:8192:$V;qwen3-235b-a22b:2048:$V;gpt-oss-120b:8192:$V" 2>&1 | tee $OUT/pers_ab1.log
