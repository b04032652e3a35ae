rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
timeout 520 python3 .carry/maxnreg_ab.py 2 'qwen3-30b-a3b:512:r168,1.r168,r128;qwen3-235b-a22b:512:r168,1.r168;mixtral-8x7b:128:r168+s3,r168,s3;gpt-oss-120b:2048:r168+s3,r168,1.r168;gpt-oss-120b:512:r168,r168+s3' 2>&1 | tee $OUT/maxnreg_ab.log
