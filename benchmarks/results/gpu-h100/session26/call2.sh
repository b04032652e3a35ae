source .carry/s25_pre.sh >/dev/null; timeout 400 python .carry/c1_ab.py qwen3-30b-a3b:512,gpt-oss-120b:2048,mixtral-8x7b:128 2 2>&1 | grep -v Warn | tee $OUT/c1_ab2.log
