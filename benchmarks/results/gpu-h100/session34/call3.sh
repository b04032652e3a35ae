source .carry/s25_pre.sh
timeout 200 python3 .carry/s34_noalign.py bf16 qwen3-30b-a3b:8,qwen3-30b-a3b:32,gpt-oss-120b:8,qwen3-235b-a22b:8,deepseek-v3:8 3 2>&1 | grep -E "NA|Error|error|Traceback" | tee $OUT/noalign_bf16.log
timeout 120 python3 .carry/s34_noalign.py int4 qwen3-30b-a3b:8,qwen3-30b-a3b:32,gpt-oss-120b:8 3 2>&1 | grep -E "NA|Error|error|Traceback" | tee $OUT/noalign_int4.log
