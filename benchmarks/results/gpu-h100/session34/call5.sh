OUT=$OUT timeout 300 bash benchmarks/gpu/run.sh .carry/wheels tests > $OUT/tests.log 2>&1; echo "tests rc=$?"
grep -E "passed|failed|error" $OUT/tests.log | tail -6
source .carry/s25_pre.sh
timeout 250 python3 .carry/s34_pf8.py qwen3-30b-a3b:2,qwen3-30b-a3b:4,qwen3-30b-a3b:8,gpt-oss-120b:4,gpt-oss-120b:8,qwen3-235b-a22b:4,qwen3-235b-a22b:8,deepseek-v3:4,deepseek-v3:8,mixtral-8x7b:4,mixtral-8x7b:8 3 2>&1 | grep -E "P8|Error|error|Traceback" | tee $OUT/pf8.log
