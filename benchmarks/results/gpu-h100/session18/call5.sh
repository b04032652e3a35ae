rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
timeout 100 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "shipped_int4_shapes and (gpt-oss-120b-NVIDIA_H100_80GB_HBM3-M512 or gpt-oss-120b-NVIDIA_H100_80GB_HBM3-M2048 or mixtral-8x7b-NVIDIA_H100_80GB_HBM3-M128 or narrow)" 2>&1 | tail -4 | tee $OUT/tests_shipped_narrow.log
timeout 150 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_triton_conformance.py 2>&1 | tail -4 | tee $OUT/tests_conformance.log
OUT=$OUT/bench timeout 300 bash benchmarks/gpu/run.sh .carry/wheels bench > /dev/null 2>&1; tail -3 $OUT/bench/run.log
