nvidia-smi --query-gpu=name,serial,clocks.max.sm,temperature.gpu --format=csv,noheader
OUT=$OUT/bench timeout 560 bash benchmarks/gpu/run.sh .carry/wheels bench
