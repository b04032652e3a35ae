#!/usr/bin/env bash
# Nsight Compute counters (throughput, occupancy, stall reasons) of the GEMM launches of one layer call
# per cell (ncu_layer.py: the call made twice, the second one read) -> OUT_DIR/ncu_<preset>_<dtype>_M<m>.txt,
# with the headline rows printed; then each launch's stall reasons per issued instruction and its SASS
# opcode counts -> OUT_DIR/ncu_<preset>_<dtype>_M<m>_stalls.txt; with NCU_SOURCE=1 also the first GEMM
# launch's SASS, each instruction with its executed count and sampled stalls (CSV) ->
# OUT_DIR/ncu_<preset>_<dtype>_M<m>_source.csv. Needs the project on PYTHONPATH (the one-call scripts'
# _setup.sh). A cell may add a name for its files and launch shapes to force (ncu_layer.py --config, JSON
# without spaces): "PRESET DTYPE M NAME JSON".
#   bash ncu_cells.sh OUT_DIR "PRESET DTYPE M [NAME JSON]" ...
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: ncu_cells.sh OUT_DIR "PRESET DTYPE M" ...}
shift
mkdir -p "$out"
rc=0
# The layer's GEMM kernels: the tl.dot and Gluon quantized ones, the bf16 ones and the direct GEMVs.
KERNELS="regex:_moe_wgemm|moe_gemv|moe_gemm|moe_mma_gemm|moe_w4a16_wgmma"
for cell in "$@"; do
  read -r preset dtype m name config <<< "$cell"
  report=$out/ncu_${preset}_${dtype}_M$m${name:+_$name}.txt
  layer=(python3 "$HERE/ncu_layer.py" --preset "$preset" --dtype "$dtype" --m "$m" ${config:+--config "$config"})
  ncu --clock-control none --kernel-name "$KERNELS" --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats \
    "${layer[@]}" > "$report" 2>&1 || rc=1
  echo "== $cell"
  grep -E "Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Registers Per|Block Size|Grid Size|Theoretical Occ|Dynamic Shared|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$report" | head -40
  ncu --clock-control none --kernel-name "$KERNELS" --launch-skip 2 --launch-count 2 \
    --metrics 'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,smsp__inst_executed.sum,sass__inst_executed_per_opcode' \
    --print-metric-instances values \
    "${layer[@]}" > "${report%.txt}_stalls.txt" 2>&1 || rc=1
  if [ "${NCU_SOURCE:-0}" = 1 ]; then
    ncu --clock-control none --kernel-name "$KERNELS" --launch-skip 2 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
      "${layer[@]}" > "${report%.txt}_source.csv" 2>&1 || rc=1
  fi
done
exit $rc
