OUT=$OUT/bench timeout 420 bash benchmarks/gpu/run.sh .carry/wheels bench
