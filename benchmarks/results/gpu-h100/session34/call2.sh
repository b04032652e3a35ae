source .carry/s25_pre.sh
timeout 230 python3 .carry/s34_nosum.py qwen3-30b-a3b:8,qwen3-30b-a3b:32,qwen3-30b-a3b:128,gpt-oss-120b:8,gpt-oss-120b:32,qwen3-235b-a22b:8,deepseek-v3:8,mixtral-8x7b:8 3 2>&1 | grep -E "NS|Error|error|Traceback" | tee $OUT/nosum.log
timeout 200 python3 .carry/s34_prefetch.py int4 qwen3-30b-a3b:8,gpt-oss-120b:8,qwen3-235b-a22b:8,deepseek-v3:8,mixtral-8x7b:8,mixtral-8x7b:32 3 2>&1 | grep -E "PF|config|Error|error|Traceback" | tee $OUT/pf_int4_m8.log
