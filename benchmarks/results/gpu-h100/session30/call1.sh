source .carry/s25_pre.sh
nproc; python3 -c "import os; print('affinity', len(os.sched_getaffinity(0)))"
ls /tmp/tcache 2>/dev/null | wc -l
start=$(date +%s)
timeout 560 python3 -m pytest -q -p no:cacheprovider -p compile_timing --durations=0 -m device \
  packages/moe-triton/tests integration/test_transformers_parity.py > $OUT/tests_timing.log 2>&1
echo "rc $? after $(( $(date +%s) - start )) s"
tail -80 $OUT/tests_timing.log
