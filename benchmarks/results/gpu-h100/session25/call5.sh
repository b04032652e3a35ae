# Session 25, device call 5 (H100): the whole-layer benchmark on the final wheels, then the shipped
# int4 launch shapes that call 3's time limit cut (its first 31 of 42 passed) and any retuned in call 4.
set -u
source .carry/s25_pre.sh  # = benchmarks/results/gpu-h100/session25/pre.sh
OUT=$OUT/bench timeout 420 bash benchmarks/gpu/run.sh .carry/wheels bench > /dev/null 2>&1; tail -3 $OUT/bench/run.log
timeout 160 python3 -m pytest -q -p no:cacheprovider $(cat .carry/s25_rest_ids.txt) 2>&1 | tail -5 | tee $OUT/tests_shipped_int4_rest.log
