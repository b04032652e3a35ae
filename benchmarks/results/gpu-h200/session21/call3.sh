rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
timeout 150 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_experts.py -k "tails or (wgmma_gemm_on_gpu and qwen3)" 2>&1 | tail -3 | tee $OUT/tests_h200_tails.log
timeout 250 python3 .carry/pers_ab.py 2 "mixtral-8x7b:512:same,pers+tail16,pers+g4+tail16;qwen3-235b-a22b:2048:same,pers+g4+tail32,pers+g1+tail32;qwen3-30b-a3b:2048:pers+tail32" 2>&1 | grep -v "vs shipped 0.00e+00" | tee $OUT/pers_ab_h200_tails.log
