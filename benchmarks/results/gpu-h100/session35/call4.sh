source .carry/s25_pre.sh
timeout 280 python3 .carry/s35_routing_ab.py bf16 mixtral-8x7b:8192,mixtral-8x7b:2048,qwen3-30b-a3b:8192 3 2>&1 | grep -E "^RT|Error|error|Traceback" | tee $OUT/routing_ab_bf16.log
timeout 200 python3 .carry/s35_routing_ab.py int4 mixtral-8x7b:8192 3 2>&1 | grep -E "^RT|Error|error|Traceback" | tee $OUT/routing_ab_int4.log
