nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader
OUT=$OUT timeout 570 bash benchmarks/gpu/run.sh .carry/wheels tests bench 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" | grep "passed\|failed\|phase\|Error" | tail -20
