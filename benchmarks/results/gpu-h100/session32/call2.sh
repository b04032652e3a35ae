source .carry/s25_pre.sh
TN=1 python3 .carry/s32_bound.py deepseek-v3:8192 gpt-oss-120b:8192 mixtral-8x7b:2048 qwen3-30b-a3b:8192 2>&1 | grep BOUND | tee $OUT/bound_tn.log
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
PERS='{"block_m":128,"gemm1":{"block_n":256,"block_k":64,"group_m":8,"num_warps":8,"num_stages":4,"wgmma":true,"persistent":true},"gemm2":{"block_n":256,"block_k":64,"group_m":8,"num_warps":8,"num_stages":4,"wgmma":true,"persistent":true}}'
M="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second"
run_ncu() {  # tag preset m [config]
  local tag=$1 preset=$2 m=$3 cfg=$4
  timeout 170 $NCU --clock-control none --kernel-name regex:'moe_gemm' --launch-skip 2 --launch-count 2 --metrics $M \
    python3 benchmarks/gpu/ncu_layer.py --preset $preset --dtype bf16 --m $m ${cfg:+--config "$cfg"} > $OUT/ncu_$tag.txt 2>&1
  echo "== $tag rc=$?"; grep -E "moe_gemm|^ +(gpu__|dram__|lts__|sm__)|M=" $OUT/ncu_$tag.txt | grep -v "==PROF==" | head -30
}
run_ncu deepseek_8192_shipped deepseek-v3 8192
run_ncu deepseek_8192_pers deepseek-v3 8192 "$PERS"
run_ncu gptoss_8192_shipped gpt-oss-120b 8192
run_ncu mixtral_2048_shipped mixtral-8x7b 2048
