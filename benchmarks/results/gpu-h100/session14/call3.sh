set -x
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
timeout 200 python3 -u -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_experts.py -m device -k "wgmma" 2>&1 | tail -5 | tee $OUT/tests_wgmma.log
timeout 380 python3 -u .carry/wgmma_exp2.py 2>&1 | grep -v Warning | tee $OUT/wgmma_exp2.log
