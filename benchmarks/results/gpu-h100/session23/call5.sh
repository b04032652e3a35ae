rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
timeout 330 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "wgmma or tail or (shipped_int4_shapes and (mixtral-8x7b-NVIDIA_H100_80GB_HBM3-M512 or qwen3-30b-a3b-NVIDIA_H100_80GB_HBM3-M2048 or gpt-oss-120b-NVIDIA_H100_80GB_HBM3-M8192))" 2>&1 | tail -6 | tee $OUT/tests_tail_role_int4.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -m device packages/moe-triton/tests/test_experts.py -k "wgmma or persistent or real_shapes" 2>&1 | tail -4 | tee $OUT/tests_tail_role_bf16.log
