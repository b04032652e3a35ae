# Session 15, device call 2 (H100): one-token int4 layer with the dependent zeroing and GEMM2's L2 prefetch.
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
T=packages/moe-triton/tests
timeout 150 python3 -u .carry/m1_ab.py gpt-oss-120b,qwen3-235b-a22b,qwen3-30b-a3b,deepseek-v3,mixtral-8x7b 1 3 2>&1 | grep -v Warn | tee $OUT/m1_ab.log
timeout 280 python3 -u -m pytest -q -p no:cacheprovider -m device $T/test_quant.py -k "real_shapes or shipped_int4" 2>&1 | tail -15 | tee $OUT/tests_quant.log
