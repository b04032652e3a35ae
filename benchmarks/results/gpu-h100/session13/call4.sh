# Session 13, device call 4 (H100): device tests of the final kernels, the bf16 dependent-launch A/B,
# and the whole-layer benchmark (bf16 and int4, five presets x seven token counts).
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
T=packages/moe-triton/tests
python3 -u -m pytest -q -p no:cacheprovider -m device $T/test_experts.py $T/test_align.py $T/test_routing.py 2>&1 | tail -2 | tee $OUT/tests_final.log
python3 -u -m pytest -q -p no:cacheprovider $T/test_experts.py -k compile 2>&1 | tail -2 | tee -a $OUT/tests_final.log
python3 -u -m pytest -q -p no:cacheprovider $T/test_triton_conformance.py 2>&1 | tail -2 | tee -a $OUT/tests_final.log
python3 .carry/pdl_chain_exp.py bf16 2>&1 | grep -v Warning | tee $OUT/pdl_bf16_exp.log
python3 benchmarks/gpu/bench_triton.py --out $OUT/bench_final 2>&1 | grep -v Warning | tail -75
