# Session 26, H100 call 3: moe tune --quant int4 at gpt-oss-120b's one-token cell (x3.93 the anchor),
# then that cell with the tuned file and the shipped one, alternated twice.
source .carry/s25_pre.sh >/dev/null
mkdir -p /tmp/tuned $OUT
timeout 200 python3 -m moe_triton.tune --quant int4 --preset gpt-oss-120b --m 1 --out /tmp/tuned 2>&1 | grep -v Warning | tee $OUT/tune_m1.log
tar -C /tmp -cf $OUT/tuned_m1.tar tuned
for r in 1 2; do
  MOE_TRITON_CONFIG_DIR=/tmp/tuned timeout 100 python3 benchmarks/gpu/bench_triton.py --out /tmp/b --dtypes int4 --preset gpt-oss-120b --m 1 2>&1 | grep "int4  M=" | sed "s/^/tuned r$r /"
  timeout 100 python3 benchmarks/gpu/bench_triton.py --out /tmp/b --dtypes int4 --preset gpt-oss-120b --m 1 2>&1 | grep "int4  M=" | sed "s/^/shipped r$r /"
done 2>&1 | tee $OUT/ab_m1.log
