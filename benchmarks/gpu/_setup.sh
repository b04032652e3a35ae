# Sourced by the one-call GPU scripts after they set WHEELS: $OUT (default /tmp/moe-gpu-out) and a
# copy of everything printed in $OUT/$1, HERE and ROOT, the project installed from $WHEELS into
# $MOE_SITE (default /tmp/moe-site) on PYTHONPATH, and the GPU, torch and triton printed.
OUT=${OUT:-/tmp/moe-gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$1") 2>&1
export PYTHONUNBUFFERED=1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SITE=${MOE_SITE:-/tmp/moe-site}
rm -rf "$SITE"
python3 -m pip install -q --no-deps --no-index --no-compile --target "$SITE" "$WHEELS"/*.whl || exit 3
export PYTHONPATH=$SITE
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
