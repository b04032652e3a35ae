source .carry/s25_pre.sh
timeout 100 python3 .carry/s34_alignwarps.py alone 2>&1 | grep -E "AL|Error|error|Traceback" | tee $OUT/align_alone.log
timeout 200 python3 .carry/s34_alignwarps.py bf16 qwen3-30b-a3b:8,qwen3-30b-a3b:32,qwen3-235b-a22b:32,deepseek-v3:32 3 2>&1 | grep -E "AW|Error|error|Traceback" | tee $OUT/align_bf16.log
timeout 150 python3 .carry/s34_alignwarps.py int4 qwen3-30b-a3b:8,qwen3-30b-a3b:32,gpt-oss-120b:32,qwen3-235b-a22b:32 3 2>&1 | grep -E "AW|Error|error|Traceback" | tee $OUT/align_int4.log
