source .carry/s25_pre.sh
cat /sys/fs/cgroup/cpu.max 2>/dev/null; cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null
rm -rf /tmp/tcache
start=$(date +%s)
for a in 0 1 2 3; do python3 .carry/c1.py $a 2>&1 | grep one; done
echo "serial 4 compiles: $(( $(date +%s) - start )) s"
rm -rf /tmp/tcache
start=$(date +%s)
for a in 0 1 2 3; do python3 .carry/c1.py $a 2>&1 | grep one & done; wait
echo "parallel 4 compiles: $(( $(date +%s) - start )) s"
rm -rf /tmp/tcache
python3 -c "import xdist; print('xdist', xdist.__version__)"
start=$(date +%s)
timeout 420 python3 -m pytest -q -p no:cacheprovider -n 8 -m device \
  packages/moe-triton/tests integration/test_transformers_parity.py 2>&1 | tail -5
echo "xdist 8: rc $? after $(( $(date +%s) - start )) s"
