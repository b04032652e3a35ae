source .carry/s25_pre.sh
OUT=$OUT/tests timeout 330 bash benchmarks/gpu/run.sh .carry/wheels tests 2>&1 | tail -25
source .carry/s25_pre.sh >/dev/null
python3 .carry/s31_rows_ab.py qwen3-30b-a3b:512/1024,mixtral-8x7b:2048/4096,gpt-oss-120b:2048,qwen3-235b-a22b:512 2>&1 | grep -v Warning | tee $OUT/rows_ab.log
