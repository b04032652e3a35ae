# Session 26, H200 call 2: moe tune --quant int4 --wgmma at the H200 int4 cells of qwen3-30b-a3b that
# missed (32, 128, 512 tokens); output tarred (the file names hold commas).
source .carry/s25_pre.sh >/dev/null
mkdir -p /tmp/tuned $OUT
timeout 560 python3 -m moe_triton.tune --quant int4 --wgmma --preset qwen3-30b-a3b --m 32 128 512 --out /tmp/tuned 2>&1 | grep -v Warning | tee $OUT/tune1.log
tar -C /tmp -cf $OUT/tuned1.tar tuned
