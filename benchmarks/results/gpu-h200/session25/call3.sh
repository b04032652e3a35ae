# Session 25, H200 call 3: the two retuned H200 launch shapes against the reference, and their cells
# of the whole-layer benchmark, on the final wheels.
set -u
source .carry/s25_pre.sh  # = benchmarks/results/gpu-h100/session25/pre.sh
T=packages/moe-triton/tests/test_quant.py
timeout 150 python3 -m pytest -q -p no:cacheprovider "$T::test_shipped_int4_shapes_on_gpu[mixtral-8x7b-NVIDIA_H200-M128]" "$T::test_shipped_int4_shapes_on_gpu[gpt-oss-120b-NVIDIA_H200-M2048]" 2>&1 | tail -3 | tee $OUT/tests_retuned_h200.log
timeout 150 python3 benchmarks/gpu/bench_triton.py --out $OUT/bench_h200_retuned --dtypes int4 --preset mixtral-8x7b gpt-oss-120b --m 128 2048 2>&1 | grep -v Warning | grep "int4"
