# Session 16, device call 6 (H100): the whole-layer benchmark of the final code (bf16 and int4).
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
python3 benchmarks/gpu/bench_triton.py --out $OUT/bench_final 2>&1 | grep -v Warning | tail -75
T=packages/moe-triton/tests
timeout 60 python3 -m pytest -q -p no:cacheprovider "$T/test_quant.py::test_shipped_int4_shapes_on_gpu[mixtral-8x7b-NVIDIA_H100_80GB_HBM3-M512]" 2>&1 | tail -2 | tee $OUT/tests_final.log
timeout 150 python3 -m pytest -q -p no:cacheprovider $T/test_experts.py -k real_shapes_on_gpu 2>&1 | tail -2 | tee -a $OUT/tests_final.log
