OUT=$OUT timeout 580 bash benchmarks/gpu/run.sh .carry/wheels tests bench
