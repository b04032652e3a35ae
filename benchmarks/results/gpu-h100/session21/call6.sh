rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
which ncu; ncu --version | tail -1
for cell in "mixtral-8x7b bf16 8192" "qwen3-30b-a3b bf16 8192"; do
  read -r preset dtype m <<< "$cell"
  timeout 250 ncu --clock-control none --kernel-name regex:'moe_gemm' --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats \
    python3 benchmarks/gpu/ncu_layer.py --preset "$preset" --dtype "$dtype" --m "$m" > "$OUT/ncu_${preset}_${dtype}_M$m.txt" 2>&1
  grep -E "moe_gemm|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache|Issue Slots|Executed Ipc A|SM Busy|Registers Per|Grid Size|Shared Memory" "$OUT/ncu_${preset}_${dtype}_M$m.txt" | head -40
done
