# The benchmark of record on the final code (HEAD's wheels), one H100 call.
OUT=$OUT timeout 560 bash benchmarks/gpu/run.sh .carry/wheels bench 2>&1 | tail -80
