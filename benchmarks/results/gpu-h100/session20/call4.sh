rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
OUT=$OUT/bench timeout 330 bash benchmarks/gpu/run.sh .carry/wheels bench > /dev/null 2>&1; tail -2 $OUT/bench/run.log
timeout 240 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "tail or (shipped_int4_shapes and NVIDIA_H100 and M512)" 2>&1 | tail -4 | tee $OUT/tests_tail_shipped.log
