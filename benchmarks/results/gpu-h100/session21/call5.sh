OUT=$OUT/bench timeout 520 bash benchmarks/gpu/run.sh .carry/wheels bench > /dev/null 2>&1; tail -3 $OUT/bench/run.log
