rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 python3 benchmarks/gpu/profile_layer.py --out $OUT --graph --preset qwen3-30b-a3b deepseek-v3 gpt-oss-120b mixtral-8x7b qwen3-235b-a22b --m 512 2048 --dtypes bf16 int4 > $OUT/profile.log 2>&1
echo "profile rc=$?"; tail -120 $OUT/profile.log
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
for cell in "qwen3-30b-a3b int4 2048" "qwen3-30b-a3b bf16 2048" "deepseek-v3 int4 2048"; do
  read -r preset dtype m <<< "$cell"
  timeout 150 $NCU --clock-control none --kernel-name regex:'_moe_wgemm|moe_w4a16|moe_gemm' --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section SchedulerStats --section InstructionStats --section SourceCounters \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum \
    python3 benchmarks/gpu/ncu_layer.py --preset $preset --dtype $dtype --m $m > $OUT/ncu_${preset}_${dtype}_M$m.txt 2>&1
  echo "== $cell rc=$?"
  grep -E "^  [_a-z].*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued|No Eligible|gmma|Stall" $OUT/ncu_${preset}_${dtype}_M$m.txt | head -40
done
