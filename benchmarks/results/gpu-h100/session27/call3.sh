nvidia-smi --query-gpu=name,serial,temperature.gpu --format=csv,noheader
# with the SM clock sampling of benchmarks/gpu/bench_triton.py (this session)
OUT=$OUT/bench timeout 570 bash benchmarks/gpu/run.sh .carry/wheels bench
