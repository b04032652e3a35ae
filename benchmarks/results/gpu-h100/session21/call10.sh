rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
# "shipped" here: the files before this call's entries (.carry/oldcfg); the variants: the new entries.
MOE_TRITON_CONFIG_DIR=.carry/oldcfg timeout 200 python3 .carry/pers_ab.py 3 "mixtral-8x7b:512:same,pers+g4+tail16;qwen3-235b-a22b:2048:same,pers+g1+tail32;deepseek-v3:8192:same,pers+g1+tail16" 2>&1 | grep -v "vs shipped 0.00e+00" | tee $OUT/tails_confirm.log
OUT=$OUT/bench timeout 330 bash benchmarks/gpu/run.sh .carry/wheels bench > /dev/null 2>&1; tail -2 $OUT/bench/run.log
