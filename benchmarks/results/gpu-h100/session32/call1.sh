source .carry/s25_pre.sh
python3 .carry/s32_bound.py 2>&1 | grep -v Warning | tee $OUT/bound.log
timeout 240 python3 benchmarks/gpu/profile_layer.py --out $OUT --graph --preset mixtral-8x7b qwen3-30b-a3b --m 512 2048 8192 --dtypes bf16 int4 > $OUT/profile.log 2>&1; grep -v "^ *[0-9.]* us  x[0-9]*  \(void at::\|.*bitwise\)" $OUT/profile.log | grep -v Warn | head -120
