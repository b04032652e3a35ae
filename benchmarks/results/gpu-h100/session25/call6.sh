# Session 25, device call 6 (H100): gpt-oss-120b int4 at 2048 tokens, shipped (tl.dot, 64-pair narrow
# blocks) against the wgmma kernel's 64x256 five-stage tiles (1.9% faster in the tuner), alternated 3 times.
set -u
source .carry/s25_pre.sh  # = benchmarks/results/gpu-h100/session25/pre.sh
for r in 1 2 3; do
  for v in shipped wgmma; do
    if [ $v = wgmma ]; then export MOE_TRITON_CONFIG_DIR=.carry/alt_gptoss; else unset MOE_TRITON_CONFIG_DIR; fi
    echo -n "round $r $v: "
    timeout 60 python3 benchmarks/gpu/bench_triton.py --out /tmp/b_$v$r --dtypes int4 --preset gpt-oss-120b --m 2048 2>&1 | grep "int4  M"
  done
done | tee $OUT/gptoss_2048_ab.log
