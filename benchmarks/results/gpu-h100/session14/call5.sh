# Session 14, device call 5 (H100): after the review mend (gemm_kernels.grouped_tile in both bf16
# GEMMs): the bf16 device tests (five wgmma layer shapes among them) and the sm_90 compile tests.
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
T=packages/moe-triton/tests
python3 -u -m pytest -q -p no:cacheprovider $T/test_experts.py 2>&1 | tail -3 | tee $OUT/tests_mend.log
