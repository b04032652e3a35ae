# Session 26, H200 call 1: the whole-layer benchmark (bf16 and int4) of the shipped code and H200 files.
OUT=$OUT/bench timeout 540 bash benchmarks/gpu/run.sh .carry/wheels bench 2>&1 | grep -v Warning | tail -30
