source .carry/s25_pre.sh
timeout 240 python3 .carry/s33_sum_ab.py 8192:8:2048 512:8:2048 2048:8:2048 8192:8:4096 8192:8:7168 8192:2:4096 2>&1 | grep -E "SUM|Error|error" | tee $OUT/sum_ab.log
