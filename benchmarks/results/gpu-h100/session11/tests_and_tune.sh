set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/moe-site PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
nvidia-smi --query-gpu=name --format=csv,noheader
T=packages/moe-triton/tests/test_quant.py
timeout 150 python3 -m pytest -q -p no:cacheprovider $T -k wgmma 2>&1 | tail -6 | tee $OUT/tests_wgmma.log
start=$(date +%s)
for p in "$@"; do
  left=$(( 520 - ($(date +%s) - start) ))
  [ $left -gt 30 ] || { echo "skip $p: no time"; continue; }
  timeout $left python3 -m moe_triton.tune --quant int4 --wgmma --m 2048 8192 --out /tmp/tuned --preset $p 2>&1 | grep -v Warning | tee -a $OUT/tune.log
done
tar -C /tmp -cf $OUT/tuned.tar tuned
