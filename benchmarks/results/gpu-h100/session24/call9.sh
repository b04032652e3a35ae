rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
timeout 500 python3 .carry/hoist_inproc.py 3 "qwen3-30b-a3b:2048,8192;mixtral-8x7b:512,2048;qwen3-235b-a22b:2048,8192;deepseek-v3:2048;gpt-oss-120b:8192" 2>&1 | grep -v Warning | tee $OUT/hoist_inproc.log
