rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
for i in 1 2; do timeout 100 python3 .carry/old_new_ab.py 5 'qwen3-235b-a22b:1;gpt-oss-120b:1;qwen3-30b-a3b:1' 2>&1 | grep -v Warn | tee -a $OUT/old_new_ab_m1.log; done
