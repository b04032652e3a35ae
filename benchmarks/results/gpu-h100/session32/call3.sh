source .carry/s25_pre.sh
python3 .carry/s32_cfg_ab.py 2>&1 | grep -v Warn | tee $OUT/cfg_ab.log
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
PERS='{"block_m":128,"gemm1":{"block_n":128,"block_k":64,"group_m":8,"num_warps":8,"num_stages":4,"wgmma":true,"persistent":true},"gemm2":{"block_n":256,"block_k":64,"group_m":8,"num_warps":8,"num_stages":4,"wgmma":true,"persistent":true}}'
M="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second"
timeout 170 $NCU --clock-control none --kernel-name regex:'moe_gemm' --launch-skip 2 --launch-count 2 --metrics $M \
    python3 benchmarks/gpu/ncu_layer.py --preset deepseek-v3 --dtype bf16 --m 8192 --config "$PERS" > $OUT/ncu_deepseek_8192_pers.txt 2>&1
echo "== rc=$?"; grep -E "moe_gemm|^ +(gpu__|dram__|lts__|sm__)|M=" $OUT/ncu_deepseek_8192_pers.txt | grep -v "==PROF==" | head -30
