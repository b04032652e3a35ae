# New wheels: the whole tests phase in one call (xdist), then old/new A/B of int4 FusedMoE layers.
OUT=$OUT/tests timeout 330 bash benchmarks/gpu/run.sh .carry/wheels tests > /dev/null 2>&1
echo "run.sh tests rc $?"; grep -E "passed|failed|== phase|error" $OUT/tests/run.log | tail -8
cp $OUT/tests/run.log $OUT/tests_run.log; rm -rf $OUT/tests
CELLS="qwen3-30b-a3b:1,gpt-oss-120b:1/8,qwen3-235b-a22b:1,deepseek-v3:1,mixtral-8x7b:1"
for round in 1 2 3; do
  for w in old new; do
    d=.carry/wheels; [ $w = old ] && d=.carry/wheels_old
    rm -rf /tmp/ab-$w && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/ab-$w $d/*.whl
    PYTHONPATH=/tmp/ab-$w:benchmarks/gpu TRITON_CACHE_DIR=/tmp/tc-ab timeout 150 python3 .carry/s30_ab.py $CELLS $w 2>&1 | grep AB
  done
done | tee $OUT/ab.log
