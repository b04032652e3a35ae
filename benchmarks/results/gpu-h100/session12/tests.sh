# Session 12, device call: the moe-triton device tests that reach the alignment kernels, and the
# moe-core conformance suite against the moe-triton experts classes (H100).
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site PYTHONUNBUFFERED=1 MOE_TEST_REQUIRE_DEVICE=cuda
T=packages/moe-triton/tests
python3 -m pytest -q -p no:cacheprovider -m device $T/test_align.py $T/test_routing.py $T/test_experts.py 2>&1 | tail -3
python3 -m pytest -q -p no:cacheprovider -m device $T/test_quant.py -k "real_shapes or narrow_and_full" 2>&1 | tail -3
python3 -m pytest -q -p no:cacheprovider $T/test_triton_conformance.py 2>&1 | tail -3
