# Session 15, device call 5 (H100): one-token int4, one prefetched tile: other presets, launch shapes.
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1
timeout 540 python3 -u .carry/m1_sweep2.py gpt-oss-120b,qwen3-235b-a22b,qwen3-30b-a3b 2>&1 | grep -v Warn | grep -v warn | tee $OUT/m1_sweep2.log
