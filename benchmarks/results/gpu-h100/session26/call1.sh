source .carry/s25_pre.sh
mkdir -p $OUT
timeout 150 python -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -m device -k "one_consumer or narrow_and_full or tail_blocks" 2>&1 | tail -5 | tee $OUT/tests_c1.log
timeout 420 python .carry/c1_ab.py qwen3-30b-a3b:2048/8192,deepseek-v3:2048,mixtral-8x7b:512/2048,qwen3-235b-a22b:2048 2 2>&1 | grep -v Warn | tee $OUT/c1_ab1.log
