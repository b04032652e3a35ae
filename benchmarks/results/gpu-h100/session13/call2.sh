set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
T=packages/moe-triton/tests/test_quant.py
( time python3 -u -m pytest -q -p no:cacheprovider $T -k "many_pairs or many_tokens" ) 2>&1 | tail -4 | tee $OUT/tests_rows.log
( time python3 -u -m pytest -q -p no:cacheprovider -m device $T -k "real_shapes" ) 2>&1 | tail -6 | tee -a $OUT/tests_rows.log
python3 -m moe_triton.tune --quant int4 --wgmma --preset qwen3-30b-a3b --m 8192 2048 --out $OUT/tuned 2>&1 | grep -v Warning | tee $OUT/tune_qwen3_30b.log | tail -8
cd $OUT && tar cf tuned.tar tuned && rm -rf tuned
