OUT=$OUT timeout 400 bash benchmarks/gpu/run.sh .carry/wheels bench
