source .carry/s25_pre.sh
mkdir -p $OUT
timeout 540 python .carry/rows128_ab.py mixtral-8x7b:512/2048,gpt-oss-120b:2048/8192,qwen3-30b-a3b:2048/8192,qwen3-235b-a22b:8192,deepseek-v3:8192 2 2>&1 | grep -v Warn | tee $OUT/rows128_ab.log
