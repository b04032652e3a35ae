rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 560 python3 .carry/order_ab.py $1 2>&1 | grep -v "UserWarn\|warn_once" | tee $OUT/order_ab_$2.log
