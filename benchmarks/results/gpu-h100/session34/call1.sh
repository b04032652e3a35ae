source .carry/s25_pre.sh
timeout 300 python3 .carry/s34_prefetch.py bf16 qwen3-30b-a3b:8,qwen3-30b-a3b:32,qwen3-30b-a3b:128,qwen3-30b-a3b:512,gpt-oss-120b:8,gpt-oss-120b:32,qwen3-235b-a22b:512 3 2>&1 | grep -E "PF|config|Error|error|Traceback" | tee $OUT/pf_bf16.log
timeout 250 python3 .carry/s34_prefetch.py int4 qwen3-30b-a3b:8,qwen3-30b-a3b:128,qwen3-30b-a3b:512,gpt-oss-120b:512,gpt-oss-120b:2048,qwen3-235b-a22b:512 3 2>&1 | grep -E "PF|config|Error|error|Traceback" | tee $OUT/pf_int4.log
