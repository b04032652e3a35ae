# Session 25, device call 3 (H100): every shipped int4 launch shape against the reference, and the other
# device tests (bf16 experts, alignment, routing, transformers parity).
set -u
source .carry/s25_pre.sh  # = benchmarks/results/gpu-h100/session25/pre.sh
T=packages/moe-triton/tests
timeout 250 python3 -m pytest -q -p no:cacheprovider -m device $T/test_quant.py -k "shipped_int4" 2>&1 | tail -5 | tee $OUT/tests_shipped_int4.log
timeout 320 python3 -m pytest -q -p no:cacheprovider -m device $T/test_experts.py $T/test_align.py $T/test_routing.py integration/test_transformers_parity.py 2>&1 | tail -5 | tee $OUT/tests_other_device.log
