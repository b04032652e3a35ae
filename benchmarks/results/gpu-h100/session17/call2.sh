rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
python3 .carry/align_ab.py 2>&1 | tee $OUT/align_ab.log
python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_align.py 2>&1 | tail -3 | tee $OUT/tests_align.log
python3 .carry/diag_large_m.py qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b,mixtral-8x7b,deepseek-v3 128,512,2048,8192 int4 2>&1 | grep -v "elementwise\|UserWarn\|_warn_once" | tee $OUT/diag_int4.log
