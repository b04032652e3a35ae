# Session 13, device call 5 (H100): bf16 dependent launches at large M (A/B), and the real-shape
# quantized tests at 4096 tokens (GEMM2's stored rows) on the final code.
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
python3 .carry/pdl_chain_exp.py bf16large 2>&1 | grep -v Warning | tee $OUT/pdl_bf16_large_exp.log
python3 -u -m pytest -q -p no:cacheprovider -m device packages/moe-triton/tests/test_quant.py -k "real_shapes and 4096" 2>&1 | tail -2 | tee $OUT/tests_rows_final.log
