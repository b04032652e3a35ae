# Session 15, device call 1 (H100): where the small-M layers spend their time.
set -u
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
python3 .carry/readfloor.py 2>&1 | tee $OUT/readfloor.log
python3 benchmarks/gpu/profile_layer.py --graph --out $OUT/prof --preset qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b --m 1 8 --dtypes int4 bf16 2>&1 | grep -v Warning | tee $OUT/profile.log
python3 benchmarks/gpu/profile_layer.py --graph --out $OUT/prof2 --preset deepseek-v3 mixtral-8x7b --m 1 8 32 --dtypes bf16 2>&1 | grep -v Warning | tee $OUT/profile2.log
