#!/usr/bin/env bash
# OpenAI's triton_kernels (matmul_ogs, routing, MXFP4 layouts: pure Triton) as vLLM vendors it, taken
# out of a vLLM wheel for the peer benchmark (benchmarks/gpu/peer_matmul_ogs.py):
#
#   bash benchmarks/gpu/extract_triton_kernels.sh VLLM_WHEEL DEST
#
# writes DEST/triton_kernels/ (the wheel's vllm/third_party/triton_kernels/, nothing else) and
# DEST/triton_kernels/ORIGIN (the wheel's name and sha256). Its modules import each other both as
# `triton_kernels.x` and relatively, so DEST itself goes on sys.path (peer_matmul_ogs.py
# --triton-kernels DEST/triton_kernels does that). An existing DEST/triton_kernels is replaced.
set -euo pipefail
WHEEL=${1:?usage: extract_triton_kernels.sh VLLM_WHEEL DEST}
DEST=${2:?usage: extract_triton_kernels.sh VLLM_WHEEL DEST}
PREFIX=vllm/third_party/triton_kernels
[ -f "$WHEEL" ] || { echo "no such wheel: $WHEEL" >&2; exit 2; }
mkdir -p "$DEST"
TMP=$(mktemp -d "$DEST/.extract.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
if command -v unzip > /dev/null; then
  unzip -q "$WHEEL" "$PREFIX/*" -d "$TMP" || { echo "$WHEEL: nothing under $PREFIX/ (unzip failed)" >&2; exit 3; }
else  # the same selection through Python's zipfile
  python3 - "$WHEEL" "$PREFIX/" "$TMP" <<'EOF'
import sys
import zipfile

wheel, prefix, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(out, [n for n in z.namelist() if n.startswith(prefix)])
EOF
fi
[ -f "$TMP/$PREFIX/matmul_ogs.py" ] || { echo "$WHEEL has no $PREFIX/matmul_ogs.py" >&2; exit 3; }
find "$TMP/$PREFIX" -name __pycache__ -prune -exec rm -rf {} +
printf 'extracted from %s (sha256 %s): %s/\n' "$(basename "$WHEEL")" \
  "$(sha256sum "$WHEEL" | cut -d' ' -f1)" "$PREFIX" > "$TMP/$PREFIX/ORIGIN"
rm -rf "$DEST/triton_kernels"
mv "$TMP/$PREFIX" "$DEST/triton_kernels"
echo "$DEST/triton_kernels: $(find "$DEST/triton_kernels" -name '*.py' | wc -l) modules, $(du -sh --apparent-size "$DEST/triton_kernels" | cut -f1)"
