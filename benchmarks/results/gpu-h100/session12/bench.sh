# Session 12, device call: whole-layer benchmark (bf16 and int4, five presets x seven token counts)
# and per-kernel GPU time of graph replays at 1 and 8 tokens (H100).
rm -rf /tmp/moe-site && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/moe-site .carry/wheels/*.whl
export PYTHONPATH=/tmp/moe-site:benchmarks/gpu PYTHONUNBUFFERED=1
python3 benchmarks/gpu/bench_triton.py --out $OUT/bench_final 2>&1 | grep -v Warning
python3 benchmarks/gpu/profile_layer.py --out $OUT/profile --graph --preset qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b mixtral-8x7b deepseek-v3 --m 1 8 --dtypes int4 bf16 2>&1 | grep -v Warning | tail -120
