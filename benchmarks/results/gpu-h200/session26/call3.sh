# Session 26, H200 call 3: moe tune --quant int4 --wgmma at the H200 int4 cells of gpt-oss-120b (8, 512
# tokens) and qwen3-235b-a22b (512) that missed; output tarred.
source .carry/s25_pre.sh >/dev/null
mkdir -p /tmp/tuned $OUT
timeout 280 python3 -m moe_triton.tune --quant int4 --wgmma --preset gpt-oss-120b --m 8 512 --out /tmp/tuned 2>&1 | grep -v Warning | tee $OUT/tune2.log
timeout 270 python3 -m moe_triton.tune --quant int4 --wgmma --preset qwen3-235b-a22b --m 512 --out /tmp/tuned 2>&1 | grep -v Warning | tee -a $OUT/tune2.log
tar -C /tmp -cf $OUT/tuned2.tar tuned
