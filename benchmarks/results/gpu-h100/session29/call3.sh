set -u
source .carry/s25_pre.sh
start=$(date +%s)
T=packages/moe-triton/tests/test_experts.py
python3 -m pytest -q -p no:cacheprovider -n 4 -m device $T -k "pingpong" -rf 2>&1 | grep -v Warn | tail -6 | tee $OUT/pp_early_tests.log
echo "tests took $(( $(date +%s) - start ))s"
if grep -q " passed" $OUT/pp_early_tests.log && ! grep -q "failed" $OUT/pp_early_tests.log; then
timeout $(( 570 - ($(date +%s) - start) )) python3 .carry/pp_ab.py 2 \
  'qwen3-30b-a3b:8192:pp,pp+s6;mixtral-8x7b:2048:pp;gpt-oss-120b:8192:pp' \
  2>&1 | grep -v Warning | tee $OUT/pp_early_ab.log
fi
echo "total $(( $(date +%s) - start ))s"
