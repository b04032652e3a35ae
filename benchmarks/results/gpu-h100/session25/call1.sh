# Session 25, device call 1 (H100): retune int4 at the cells that missed, now that the wgmma kernel
# reads scales once per group and its words ring is swizzled (both GEMMs on either kernel).
set -u
source .carry/s25_pre.sh  # = benchmarks/results/gpu-h100/session25/pre.sh
tune() { local t=$1 p=$2; shift 2
  timeout $t python3 -m moe_triton.tune --quant int4 --wgmma --preset $p --m "$@" --out $OUT/tuned 2>&1 | grep -v Warning \
    | tee -a $OUT/tune.log | grep -E "M=[0-9]+:|wrote"; }
tune 170 qwen3-30b-a3b 512 2048 8192
tune 140 gpt-oss-120b 2048 512
tune 120 mixtral-8x7b 128 512
tune 150 deepseek-v3 2048 512
