source .carry/s25_pre.sh
python3 .carry/s31_sum_ab.py int4:qwen3-30b-a3b:8192,bf16:qwen3-30b-a3b:8192,int4:mixtral-8x7b:8192,int4:gpt-oss-120b:8192 4 2>&1 | grep -v Warning | tee $OUT/sum_ab2.log
python3 .carry/s31_rows_ab.py deepseek-v3:512/1024,qwen3-235b-a22b:1024,qwen3-30b-a3b:1024 2>&1 | grep -v Warning | tee $OUT/rows_ab2.log
