# H200: the whole tests phase and the benchmark of the final code in one call.
OUT=$OUT timeout 560 bash benchmarks/gpu/run.sh .carry/wheels tests bench > /dev/null 2>&1
echo "rc $?"; grep -E "passed|failed|== phase|device |error" $OUT/run.log | tail -12
