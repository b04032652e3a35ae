rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
T=packages/moe-triton/tests
timeout 120 python3 -m pytest -q -p no:cacheprovider $T/test_experts.py -k "topk_sum or compile_for_hopper or every_activation or expert_map or dtypes" 2>&1 | tail -3 | tee $OUT/tests.log
timeout 100 python3 -m pytest -q -p no:cacheprovider "$T/test_quant.py::test_shipped_int4_shapes_on_gpu[mixtral-8x7b-NVIDIA_H100_80GB_HBM3-M512]" 2>&1 | tail -3 | tee -a $OUT/tests.log
timeout 340 python3 .carry/topk_sum_ab.py qwen3-30b-a3b,gpt-oss-120b,mixtral-8x7b,qwen3-235b-a22b,deepseek-v3 8,32,512,2048,8192 2 2>&1 | tee $OUT/topk_sum_ab.log
