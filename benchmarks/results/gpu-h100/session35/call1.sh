source .carry/s25_pre.sh
timeout 240 bash benchmarks/gpu/run.sh .carry/wheels tests 2>&1 | tail -25
timeout 150 python3 .carry/s35_ra.py bf16 qwen3-30b-a3b:2,qwen3-30b-a3b:8,qwen3-30b-a3b:16,qwen3-30b-a3b:32,gpt-oss-120b:8,gpt-oss-120b:32,gpt-oss-120b:64,qwen3-235b-a22b:8,qwen3-235b-a22b:32,deepseek-v3:8,deepseek-v3:32,mixtral-8x7b:8,mixtral-8x7b:32,mixtral-8x7b:128 3 2>&1 | grep -E "^RA|Error|error|Traceback" | cut -c1-200 | tee $OUT/ra_bf16.log
timeout 120 python3 .carry/s35_ra.py int4 qwen3-30b-a3b:2,qwen3-30b-a3b:8,qwen3-30b-a3b:16,qwen3-30b-a3b:32,gpt-oss-120b:8,gpt-oss-120b:32,qwen3-235b-a22b:8,qwen3-235b-a22b:32,deepseek-v3:8,deepseek-v3:32,mixtral-8x7b:8,mixtral-8x7b:32 3 2>&1 | grep -E "^RA|Error|error|Traceback" | cut -c1-200 | tee $OUT/ra_int4.log
