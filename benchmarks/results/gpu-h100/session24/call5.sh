rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1
CELLS="qwen3-30b-a3b:2048,8192;mixtral-8x7b:512,2048;qwen3-235b-a22b:2048,8192;deepseek-v3:2048;gpt-oss-120b:8192"
for r in 1 2; do for h in 1 0; do
  echo "== round $r hoist=$h"
  MOE_HOIST=$h TRITON_CACHE_DIR=/tmp/tc$h timeout 200 python3 .carry/hoist_ab.py "$CELLS" 2>&1 | grep -v Warning | tee $OUT/hoist_r${r}_h$h.log | grep -v JSON
done; done
python3 - <<'PY'
import json, glob, os
res = {}
for f in sorted(glob.glob(os.environ["OUT"] + "/hoist_r*_h*.log")):
    h = f[-5]
    for line in open(f):
        if line.startswith("JSON"):
            for k, (us, n) in json.loads(line[5:]).items():
                res.setdefault(k, {}).setdefault(h, []).append((us, n))
for k, v in res.items():
    a, b = min(u for u, _ in v.get("1", [(0, 0)])), min(u for u, _ in v.get("0", [(0, 0)]))
    print(f"{k:24} hoist {a:8.1f}  per-quarter {b:8.1f}  {b / a:.3f}x  |y| {v['1'][0][1]:.6e} {v['0'][0][1]:.6e}")
PY
