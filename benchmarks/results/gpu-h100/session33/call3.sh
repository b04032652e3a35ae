source .carry/s25_pre.sh
timeout 200 python3 .carry/s33_sum_ab.py 8192:8:2048 2048:8:2048 8192:8:4096 8192:8:7168 2>&1 | grep -E "SUM|Error|error" | tee $OUT/sum_ab.log
timeout 200 python3 .carry/s33_route.py deepseek-v3:512 deepseek-v3:8192 mixtral-8x7b:8192 gpt-oss-120b:2048 2>&1 | grep -E "ROUTE|Error|error" | tee $OUT/route2.log
