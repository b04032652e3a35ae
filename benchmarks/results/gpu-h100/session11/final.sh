set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/moe-site PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
nvidia-smi --query-gpu=name --format=csv,noheader
T=packages/moe-triton/tests/test_quant.py
D=NVIDIA_H100_80GB_HBM3
timeout 240 python3 -m pytest -q -p no:cacheprovider \
  "$T::test_shipped_int4_shapes_on_gpu[qwen3-235b-a22b-$D-M2048]" \
  "$T::test_shipped_int4_shapes_on_gpu[qwen3-235b-a22b-$D-M8192]" \
  "$T::test_shipped_int4_shapes_on_gpu[deepseek-v3-$D-M8192]" \
  "$T::test_shipped_int4_shapes_on_gpu[gpt-oss-120b-$D-M8192]" \
  "$T::test_shipped_int4_shapes_on_gpu[mixtral-8x7b-$D-M2048]" 2>&1 | tail -8 | tee $OUT/tests_shipped_wgmma.log
timeout 300 python3 benchmarks/gpu/bench_triton.py --out $OUT/bench_final --dtypes int4 2>&1 | grep -v Warning | tail -45
