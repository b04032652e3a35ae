export OUT
bash benchmarks/gpu/run.sh .carry/wheels bench > /dev/null 2>&1; echo "bench rc=$?"
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
timeout 330 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_experts.py packages/moe-triton/tests/test_align.py packages/moe-triton/tests/test_triton_conformance.py 2>&1 | tail -4 | tee $OUT/tests_final.log
