# The GPU suite on the final code (HEAD's wheels), one H100 call.
OUT=$OUT timeout 400 bash benchmarks/gpu/run.sh .carry/wheels tests 2>&1 | grep -E "passed|failed|error|phase|NVIDIA|torch" | tail -20
