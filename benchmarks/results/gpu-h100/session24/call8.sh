rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1
CELLS="qwen3-30b-a3b:2048,8192;mixtral-8x7b:512,2048;qwen3-235b-a22b:2048;deepseek-v3:2048;gpt-oss-120b:8192"
for r in 1 2; do for v in 00 10 11; do
  echo "== round $r variant $v (tail in flight, words prefetch)"
  MOE_TAIL_IN_FLIGHT=${v:0:1} MOE_PREFETCH_WORDS=${v:1:1} TRITON_CACHE_DIR=/tmp/tc$v timeout 150 python3 .carry/hoist_ab.py "$CELLS" 2>&1 | grep -v Warning | tee $OUT/pf_r${r}_v$v.log | grep -v JSON
done; done
python3 - <<'PY'
import json, glob, os
res = {}
for f in sorted(glob.glob(os.environ["OUT"] + "/pf_r*_v*.log")):
    v = f[-6:-4]
    for line in open(f):
        if line.startswith("JSON"):
            for k, (us, n) in json.loads(line[5:]).items():
                res.setdefault(k, {}).setdefault(v, []).append((us, n))
for k, d in res.items():
    base = min(u for u, _ in d["00"])
    print(f"{k:24} " + "  ".join(f"{v} {min(u for u, _ in d[v]):8.1f} ({base / min(u for u, _ in d[v]):.3f}x) |y| {d[v][0][1]:.6e}" for v in sorted(d)))
PY
