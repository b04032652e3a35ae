source .carry/s25_pre.sh
python3 -m pytest -q -p no:cacheprovider -m device packages/moe-triton/tests/test_quant.py packages/moe-triton/tests/test_topk_sum.py -k "top8 or layer_shapes" 2>&1 | tail -2
OUT=$OUT timeout 400 bash benchmarks/gpu/run.sh .carry/wheels bench 2>&1 | grep "phase\|int4  M=  512\|qwen3-30b-a3b" | tail -20
