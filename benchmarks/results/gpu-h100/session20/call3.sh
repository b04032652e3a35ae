rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
timeout 150 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "tail or (shipped_int4_shapes and NVIDIA_H100 and M512)" 2>&1 | tail -4 | tee $OUT/tests_tail_shipped.log
timeout 150 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_triton_conformance.py 2>&1 | tail -3 | tee $OUT/tests_conformance.log
timeout 120 python3 .carry/variant_ab.py 2 'gpt-oss-120b:2048:tail32+w8,tail16+w8' 2>&1 | grep -v Warn | tee $OUT/tl_tail_ab3.log
OUT=$OUT/bench timeout 200 bash benchmarks/gpu/run.sh .carry/wheels bench > /dev/null 2>&1; tail -3 $OUT/bench/run.log
