set -x
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
timeout 240 python3 -u -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_experts.py -m device -k "wgmma" 2>&1 | tail -40 | tee $OUT/tests_wgmma.log
timeout 420 python3 -u .carry/wgmma_exp.py qwen3-30b-a3b,mixtral-8x7b,gpt-oss-120b,qwen3-235b-a22b,deepseek-v3 512,2048,8192 2>&1 | grep -v Warning | tee $OUT/wgmma_exp.log
