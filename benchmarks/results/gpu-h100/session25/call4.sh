# Session 25, device call 4 (H100): the retune cells that call 1's time limits cut.
set -u
source .carry/s25_pre.sh  # = benchmarks/results/gpu-h100/session25/pre.sh
tune() { local t=$1 p=$2; shift 2
  timeout $t python3 -m moe_triton.tune --quant int4 --wgmma --preset $p --m "$@" --out /tmp/tuned 2>&1 | grep -v Warning \
    | tee -a $OUT/tune2.log | grep -E "M=[0-9]+:|wrote"; tar -C /tmp -cf $OUT/tuned2.tar tuned; }
tune 250 qwen3-30b-a3b 2048 8192
tune 150 gpt-oss-120b 512
tune 150 mixtral-8x7b 512
