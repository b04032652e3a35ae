source .carry/s25_pre.sh
OUT=$OUT timeout 560 bash benchmarks/gpu/run.sh .carry/wheels tests bench 2>&1 | grep -v Warn | tail -40
