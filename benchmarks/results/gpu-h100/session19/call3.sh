rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
H=NVIDIA_H100_80GB_HBM3
timeout 200 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "shipped_int4_shapes and (mixtral-8x7b-$H-M512 or qwen3-30b-a3b-$H-M2048 or qwen3-235b-a22b-$H-M2048 or qwen3-235b-a22b-$H-M8192 or gpt-oss-120b-$H-M8192 or deepseek-v3-$H-M8192)" -v 2>&1 | grep -E "PASS|FAIL|ERROR|passed|failed" | tail -12 | tee $OUT/tests_shipped_tail.log
timeout 120 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_triton_conformance.py 2>&1 | tail -2 | tee $OUT/tests_conformance.log
OUT=$OUT/bench timeout 260 bash benchmarks/gpu/run.sh .carry/wheels bench > /dev/null 2>&1; tail -3 $OUT/bench/run.log
