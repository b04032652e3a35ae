source .carry/s25_pre.sh
timeout 150 python3 .carry/s33_readbw.py 2>&1 | grep -E "READ|Error" | tee $OUT/readbw.log
timeout 120 python3 .carry/s33_route.py qwen3-30b-a3b:512 qwen3-30b-a3b:8192 deepseek-v3:8192 2>&1 | grep -E "ROUTE|Error|error" | tee $OUT/route.log
timeout 300 python3 .carry/s33_int4_g2.py qwen3-30b-a3b:8192 2 2>&1 | grep -E "G2|round|Error" | tee $OUT/g2_8192.log | grep G2
