source .carry/s25_pre.sh
timeout 330 python3 .carry/s33_align.py qwen3-30b-a3b:512:32 deepseek-v3:512:32 gpt-oss-120b:512:32 qwen3-30b-a3b:128:16 2>&1 | grep -E "ALIGN|Error|error" | tee $OUT/align.log
