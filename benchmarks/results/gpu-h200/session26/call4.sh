# Session 26, H200 call 4: the two retuned gpt-oss-120b int4 launch shapes against the reference, then
# their benchmark cells with the new file and the old one (MOE_TRITON_CONFIG_DIR), alternated twice.
source .carry/s25_pre.sh >/dev/null
T=packages/moe-triton/tests/test_quant.py
timeout 200 python3 -m pytest -q -p no:cacheprovider "$T::test_shipped_int4_shapes_on_gpu[gpt-oss-120b-NVIDIA_H200-M8]" "$T::test_shipped_int4_shapes_on_gpu[gpt-oss-120b-NVIDIA_H200-M512]" 2>&1 | tail -3 | tee $OUT/tests_retuned_h200.log
for r in 1 2; do
  timeout 100 python3 benchmarks/gpu/bench_triton.py --out $OUT/new_r$r --dtypes int4 --preset gpt-oss-120b --m 8 512 2>&1 | grep "int4  M=" | sed "s/^/new r$r /"
  MOE_TRITON_CONFIG_DIR=$PWD/.carry/oldcfg_s26 timeout 100 python3 benchmarks/gpu/bench_triton.py --out $OUT/old_r$r --dtypes int4 --preset gpt-oss-120b --m 8 512 2>&1 | grep "int4  M=" | sed "s/^/old r$r /"
done 2>&1 | tee $OUT/ab_retuned_h200.log
