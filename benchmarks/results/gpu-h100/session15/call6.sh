# Session 15, device call 6 (H100): one-token int4, finer K-split sweep.
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1
timeout 540 python3 -u .carry/m1_sweep3.py 2>&1 | grep -v Warn | grep -v warn | tee $OUT/m1_sweep3.log
