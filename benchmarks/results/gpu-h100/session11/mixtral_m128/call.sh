set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/moe-site PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 .carry/ab_m128.py 2>&1 | grep -v Warning | tee $OUT/ab_m128.log
T=packages/moe-triton/tests/test_quant.py
timeout 120 python3 -m pytest -q -p no:cacheprovider "$T::test_shipped_int4_shapes_on_gpu[mixtral-8x7b-NVIDIA_H100_80GB_HBM3-M128]" 2>&1 | tail -3 | tee $OUT/tests_shipped_m128.log
timeout 200 python3 benchmarks/gpu/bench_triton.py --out $OUT/bench_mixtral --preset mixtral-8x7b --dtypes int4 2>&1 | grep -v Warning | tail -9
