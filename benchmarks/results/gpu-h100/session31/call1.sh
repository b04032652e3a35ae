source .carry/s25_pre.sh
python3 .carry/topk_sum_bench.py 2>&1 | tee $OUT/topk_sum_bench.log
python3 .carry/s31_sum_ab.py int4:qwen3-30b-a3b:2048/8192,int4:gpt-oss-120b:8192,int4:qwen3-235b-a22b:2048,bf16:qwen3-30b-a3b:8192,bf16:gpt-oss-120b:8192 2>&1 | grep -v Warning | tee $OUT/sum_ab.log
timeout 200 python3 benchmarks/gpu/profile_layer.py --out $OUT --graph --preset qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b --m 512 2048 8192 --dtypes int4 bf16 > $OUT/profile.log 2>&1; tail -150 $OUT/profile.log | grep -v "^ *[0-9.]* us  x[0-9]*  \(void at::\|.*bitwise\)" | head -150
