# Session 14, device call 4 (H100): device tests of the final code (bf16 wgmma kernel included), the
# sm_90 compile tests on this Triton, conformance, the bf16 tuner with the wgmma tiles on one shape,
# and the whole-layer benchmark (bf16 and int4, five presets x seven token counts).
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
T=packages/moe-triton/tests
python3 -u -m pytest -q -p no:cacheprovider -m device $T/test_experts.py $T/test_align.py $T/test_routing.py 2>&1 | tail -3 | tee $OUT/tests_final.log
python3 -u -m pytest -q -p no:cacheprovider $T/test_experts.py -k "compile or wgmma" 2>&1 | tail -3 | tee -a $OUT/tests_final.log
python3 -u -m pytest -q -p no:cacheprovider $T/test_triton_conformance.py 2>&1 | tail -3 | tee -a $OUT/tests_final.log
timeout 150 python3 -u -m moe_triton.tune --preset qwen3-30b-a3b --m 2048 --out $OUT/tune_bf16 2>&1 | grep -v Warning | tail -8 | tee $OUT/tune_bf16.log
python3 benchmarks/gpu/bench_triton.py --out $OUT/bench_final 2>&1 | grep -v Warning | tail -75
