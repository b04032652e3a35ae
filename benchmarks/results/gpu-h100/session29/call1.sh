set -u
source .carry/s25_pre.sh
start=$(date +%s)
python3 -m pytest -q -p no:cacheprovider -n 4 -m device packages/moe-triton/tests/test_experts.py \
  -k "wgmma_gemm_on_gpu or persistent" 2>&1 | tail -5 | tee $OUT/pp_tests.log
echo "tests took $(( $(date +%s) - start ))s"
timeout $(( 570 - ($(date +%s) - start) )) python3 .carry/pp_ab.py 2 \
  'qwen3-30b-a3b:8192:pp,pp+s6;qwen3-30b-a3b:2048:pers,pp;mixtral-8x7b:2048:pp,pp+s6;gpt-oss-120b:8192:pp;qwen3-235b-a22b:8192:pp;mixtral-8x7b:8192:pp;deepseek-v3:8192:pers,pp' \
  2>&1 | grep -v Warning | tee $OUT/pp_ab.log
echo "total $(( $(date +%s) - start ))s"
