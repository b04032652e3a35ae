source .carry/s25_pre.sh
mkdir -p $OUT
python -c "import pynvml" 2>&1 | tail -1
timeout 200 python .carry/readbw.py 2>&1 | grep -v Warn | tee $OUT/readbw.log
timeout 330 python .carry/clocks.py mixtral-8x7b:bf16:8192,qwen3-30b-a3b:bf16:8192,qwen3-30b-a3b:int4:2048,gpt-oss-120b:bf16:32 2>&1 | grep -v Warn | tee $OUT/clocks.log
