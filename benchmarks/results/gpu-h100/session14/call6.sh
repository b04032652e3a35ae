# Session 14, device call 6 (H100): the off-Hopper refusal test, rewritten to launch nothing.
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
python3 -u -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_experts.py -k refused 2>&1 | tail -3 | tee $OUT/tests_refused.log
