OUT=$OUT/bench timeout 500 bash benchmarks/gpu/run.sh .carry/wheels bench > /dev/null 2>&1; tail -2 $OUT/bench/run.log
