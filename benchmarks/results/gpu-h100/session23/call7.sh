rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
for cell in "qwen3-30b-a3b 512" "mixtral-8x7b 128" "gpt-oss-120b 2048"; do
  read -r preset m <<< "$cell"
  timeout 170 $NCU --clock-control none --kernel-name regex:'_moe_wgemm|moe_w4a16' --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section InstructionStats \
    python3 benchmarks/gpu/ncu_layer.py --preset $preset --dtype int4 --m $m > $OUT/ncu_${preset}_int4_M$m.txt 2>&1
  echo "== $cell rc=$?"
  grep -E "^  [_a-z].*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Grid Size|Warp Cycles Per Issued|No Eligible|One or More Eligible" $OUT/ncu_${preset}_int4_M$m.txt | head -40
done
