source .carry/s25_pre.sh
python3 .carry/s33_pre_gemm.py qwen3-30b-a3b:512:64 qwen3-30b-a3b:512:32 mixtral-8x7b:512:128 qwen3-30b-a3b:2048:128 2>&1 | grep -E "PRE|Error|error" | tee $OUT/pre_gemm.log
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
timeout 150 $NCU --clock-control none --kernel-name regex:'_moe_wgemm' --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  python3 benchmarks/gpu/ncu_layer.py --preset qwen3-30b-a3b --m 512 > $OUT/ncu_int4_512.txt 2>&1
echo "ncu rc=$?"; grep -E "_moe_wgemm|Duration|Throughput|Occupancy|Registers|Stall|Block Size|Grid Size|Waves|Shared Memory Config|Dynamic Shared" $OUT/ncu_int4_512.txt | head -60
timeout 330 python3 .carry/s33_int4_g2.py qwen3-30b-a3b:512 2 2>&1 | grep -vE "^\s*$|Warning|warn" | tee $OUT/g2_512.log | tail -40
