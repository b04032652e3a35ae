# Session 15, device call 8 (H100): the whole-layer benchmark of the final code (bf16 and int4).
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
python3 benchmarks/gpu/bench_triton.py --out $OUT/bench_final 2>&1 | grep -v Warning | tail -75
