# Session 25, H200 call 2: retune int4 at three cells that missed x4 on the H200.
set -u
source .carry/s25_pre.sh  # = benchmarks/results/gpu-h100/session25/pre.sh
tune() { local t=$1 p=$2; shift 2
  timeout $t python3 -m moe_triton.tune --quant int4 --wgmma --preset $p --m "$@" --out /tmp/tuned 2>&1 | grep -v Warning \
    | tee -a $OUT/tune_h200.log | grep -E "M=[0-9]+:|wrote"; tar -C /tmp -cf $OUT/tuned_h200.tar tuned; }
tune 140 mixtral-8x7b 128
tune 170 qwen3-30b-a3b 512
tune 170 gpt-oss-120b 2048
