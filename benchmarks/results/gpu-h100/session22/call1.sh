set -x
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
timeout 260 python3 -m pytest -q -x -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "persistent or expert_parallel or tail_blocks or narrow_and_full" 2>&1 | tail -15 | tee $OUT/tests_persistent.log
timeout 300 python3 .carry/variant_ab.py 2 'qwen3-235b-a22b:2048:pers,pers+tail0;gpt-oss-120b:8192:pers,pers+tail0;qwen3-30b-a3b:8192:pers;deepseek-v3:2048:pers' 2>&1 | tee $OUT/pers_ab1.log
