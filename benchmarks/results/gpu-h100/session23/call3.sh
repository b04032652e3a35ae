rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda TRITON_CACHE_DIR=/tmp/tcache
python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -1
timeout 330 python3 -m pytest -q -p no:cacheprovider -m device packages/moe-triton/tests/test_experts.py packages/moe-triton/tests/test_align.py packages/moe-triton/tests/test_routing.py integration/test_transformers_parity.py 2>&1 | tail -12 | tee $OUT/tests_other_device.log
timeout 200 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_triton_conformance.py 2>&1 | tail -5 | tee $OUT/tests_conformance.log
