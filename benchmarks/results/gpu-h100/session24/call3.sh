rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
SMEM='{"gemm1": {"block_m": 128, "block_n": 256, "split_k": 1, "num_warps": 4, "num_stages": 3, "swap_ab": true, "wgmma": true, "smem_dequant": true}, "gemm2": {"block_m": 128, "block_n": 256, "split_k": 1, "num_warps": 4, "num_stages": 3, "swap_ab": true, "wgmma": true, "smem_dequant": true}}'
RS='{"gemm1": {"block_m": 128, "block_n": 256, "split_k": 1, "num_warps": 4, "num_stages": 3, "swap_ab": true, "wgmma": true}, "gemm2": {"block_m": 128, "block_n": 256, "split_k": 1, "num_warps": 4, "num_stages": 3, "swap_ab": true, "wgmma": true}}'
for v in smem rs; do
  if [ $v = smem ]; then C="$SMEM"; else C="$RS"; fi
  timeout 200 $NCU --clock-control none --kernel-name regex:'moe_w4a16' --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --section ComputeWorkloadAnalysis \
    --import-source no -o $OUT/ncu_$v -f \
    python3 benchmarks/gpu/ncu_layer.py --preset qwen3-30b-a3b --dtype int4 --m 2048 --config "$C" > $OUT/ncu_${v}_run.txt 2>&1
  echo "== $v rc=$?"; tail -3 $OUT/ncu_${v}_run.txt
  $NCU -i $OUT/ncu_$v.ncu-rep --page details --print-details all > $OUT/ncu_${v}_details.txt 2>&1
  $NCU -i $OUT/ncu_$v.ncu-rep --page source --print-source sass --csv > $OUT/ncu_${v}_sass.csv 2>&1
  grep -E "Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|stall" $OUT/ncu_${v}_details.txt | head -40
  wc -c $OUT/ncu_${v}_sass.csv
done
