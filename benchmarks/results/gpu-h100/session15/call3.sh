# Session 15, device call 3 (H100): variants of GEMM2's L2 prefetch at one token (separate processes,
# each on a copy of the installed package patched for it), two alternating rounds.
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONUNBUFFERED=1
QG=moe_triton/_details/quant_gemm.py
for v in base nopf pf pf2 pflast pf2last; do rm -rf /tmp/site_$v; cp -r /tmp/moe-site /tmp/site_$v; done
for v in pf2 pf2last; do
  python3 - /tmp/site_$v/$QG <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
old = "    for kt in range(kt0, kt1):\n        _prefetch_l2("
assert old in s
s = s.replace(old, "    kt1 = tl.minimum(kt1, kt0 + 2)\n" + old)
open(p, "w").write(s)
PY
done
for v in pflast pf2last; do
  python3 - /tmp/site_$v/$QG <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
old = "@p cp.async.bulk.prefetch.L2.global [$1], $2;"
assert old in s
s = s.replace(".reg .u32 t;", ".reg .u32 t;\n.reg .b64 pol;\ncreatepolicy.fractional.L2::evict_last.b64 pol, 1.0;")
s = s.replace(old, "@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol;")
open(p, "w").write(s)
PY
done
grep -n "kt0 + 2\|evict_last" /tmp/site_pf2last/$QG
for r in 1 2; do
  for v in base nopf pf pf2 pflast pf2last; do
    PYTHONPATH=/tmp/site_$v:benchmarks/gpu timeout 100 python3 -u .carry/m1_variant.py $v gpt-oss-120b,qwen3-235b-a22b,qwen3-30b-a3b 2>&1 | grep -v Warn | grep -v warn | tee -a $OUT/m1_variants.log
  done
done
