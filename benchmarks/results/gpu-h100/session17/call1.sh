set -x
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
python3 .carry/diag_large_m.py qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b,mixtral-8x7b,deepseek-v3 512,2048,8192 2>&1 | tee $OUT/diag.log
