rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache MOE_TEST_REQUIRE_DEVICE=cuda
python3 .carry/sass_old_new.py 2>&1 | grep -v Warn | tee $OUT/sass_old_new.log
timeout 150 python3 .carry/old_new_ab.py 5 'gpt-oss-120b:2048;deepseek-v3:512;qwen3-30b-a3b:32' 2>&1 | grep -v Warn | tee $OUT/old_new_ab_mended2.log
