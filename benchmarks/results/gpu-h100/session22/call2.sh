rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
for w in 1 2; do for t in 16 0; do CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 .carry/pers_crash.py 512 $w $t 2>&1 | grep -E "rel. L2|Error|error" | head -3; done; done 2>&1 | tee $OUT/crash.log
which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer
CS=$(which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
timeout 150 $CS --tool memcheck --print-limit 4 python3 .carry/pers_crash.py 512 2 16 2>&1 | grep -vE "^=========     (Host|  )" | head -40 | tee $OUT/sanitizer.log
timeout 200 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant.py -k "persistent_wgmma_gemm_on_gpu or persistent_wgmma_blocks" 2>&1 | tail -8 | tee $OUT/tests_persistent2.log
