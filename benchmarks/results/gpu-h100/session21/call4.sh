rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
timeout 230 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_experts.py -k "wgmma or persistent or real_shapes or compile" 2>&1 | tail -6 | tee $OUT/tests_experts.log
timeout 150 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_triton_conformance.py 2>&1 | tail -3 | tee $OUT/tests_conformance.log
timeout 150 python3 .carry/pers_ab.py 2 "qwen3-235b-a22b:8192:pers+g4,pers+g8,pers+g16;gpt-oss-120b:8192:pers+g1,pers+g4;qwen3-235b-a22b:2048:pers+g1" 2>&1 | grep -v "vs shipped 0.00e+00" | tee $OUT/pers_ab4.log
