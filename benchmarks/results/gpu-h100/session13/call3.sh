set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
python3 -u -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_align.py packages/moe-triton/tests/test_routing.py 2>&1 | tail -3 | tee $OUT/tests_pdl.log
python3 .carry/pdl_chain_exp.py 2>&1 | grep -v Warning | tee $OUT/pdl_chain_exp.log
python3 -m moe_triton.tune --quant int4 --wgmma --preset gpt-oss-120b deepseek-v3 --m 8192 --out $OUT/tuned 2>&1 | grep -v Warning | tee $OUT/tune_8192.log | tail -6
cd $OUT && tar cf tuned.tar tuned && rm -rf tuned
