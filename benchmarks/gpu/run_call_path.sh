#!/usr/bin/env bash
# One device call for the layer where users call it (issue: host path, torch.compile, end to end):
# install the project from wheels, then run jobs over every visible GPU (gpu_jobs.py):
#   tests         integration/test_call_path.py and the transformers parity tests on the GPU
#   host-*        bench_host_path.py: host and GPU time per eager call, layer and fused block (host-mma-qwen3, host-mma-22: the mma entries)
#   e2e-*         bench_e2e.py: one process per model, experts and mode
#                 (e2e-interleaved-*: bench_e2e_interleaved.py, several variants in one process)
#   load-checkpoint  bench_load_checkpoint.py: a real-shape GPTQ int4 qwen3-30b-a3b through from_pretrained
#                (load-checkpoint-16: 16 of its layers, for the load's host transient)
#   loaders-*    bench_checkpoint_loaders.py: fine-grained fp8 / MXFP4 / compressed-tensors W4A16 checkpoints,
#                from_pretrained against transformers (loaders-ct: carry .carry/ct-wheels too)
#   launch-cost  launch_cost.py: what one launch, one graph replay and one input copy cost this host
#   profile-decode  profile_decode.py: one decode step per scheme under torch.profiler (kernels, host calls)
#   trace-decode  trace_decode.py: per-program timestamps of decode-size calls' launches (TRACE_CELLS), each GEMM build's PTX and SASS
#   trace-whole-share  the same for one-token int4 cells with GEMM2's whole share asked for before its wait
#   trace-gpt-oss-gemm1-one-wave  the same for gpt-oss-120b at one token with GEMM1 in one wave (ab-gpt-oss-gemm1-one-wave's variant)
#   decode-limits  decode_limits.py: decode-size layer calls against a bare read of their bytes (issue 60)
#   matmul-limits  matmul_limits.py: prefill-size layer calls against torch._grouped_mm doing their GEMMs
#   profile-fp8-decode  profile_layer.py --graph: kernels of fp8 and int8 calls at 1 and 8 tokens
#   ab-fp8-block-*, ab-fp8-channel-pdl-*, ab-direct-*, ab-fp8-route-quant-*, ab-gemm1-upfront-*, ab-retune-*, ab-direct-maxnreg-*, ab-gpt-oss-mxfp4-registers, ab-one-dot-*, ab-prefetch-depth-*,
#                ab-gluon-decode-*, ab-gluon-both-*, ab-mma-int4-*, ab-mma-entries(-21-*), ab-whole-share-*,
#                ab-mma-int8, ab-mma-mxfp4(-entry2), ab-mma-shapes-*, ab-entries-22-*, ab-int8-2048-*(-wgmma), ab-one-wave-gemm2, ab-own-route-*, ab-eight-token-occupancy-*, ab-gemm2-prefetch-entry, ab-gpt-oss-int4-n128, ab-block-ready-*(-new-*), ab-gpt-oss-mxfp4-8-retune, ab-tuned-entry, ab-folded-regs-*,
#                ab-mma-own-route-*, ab-staged-scales-*, ab-scale-at-group-start-*, ab-one-token-shapes-*, ab-int4-entry-mxfp4,
#                ab-entries-*, ab-entries-replaced, ab-decode-shapes-replaced, ab-mxfp4-shapes-on-int4, ab-int4-decode-copied, ab-int4-shapes-on-mxfp4, ab-gpt-oss-gemm1-one-wave, ab-q30-mxfp4-8-shapes  ab_layer.py:
#                decode-size variants (fp8 swapped, act_quant as a dependent launch, direct launches for a few
#                tokens, block fp8's input quantized by the routing launch, one-token GEMM1's tiles asked for
#                up front, retuned entries against those they replaced, register caps, GEMM2's L2 prefetch depth, a
#                K tile's quarters as one dot, the Gluon kernel at decode sizes, the mma.sync kernel, GEMM2's whole share
#                asked for before its wait, one-token entries against those they replaced, the int8 2048-token searches' winners,
#                GEMM2 waiting per block of GEMM1's rows on and off, a tl.dot GEMM1 moved onto the mma kernel to rank
#                its own experts, the mma kernel's scale rows copied with the tile's words or loaded in it, a patched
#                mma kernel), per
#                preset (AB_TOKENS)
#   ab-builds-*  ab_builds.py: this build against the one in AB_OLD_WHEELS, in alternate processes (a change no patch makes)
#   ncu-decode, ncu-gpt-oss-8  ncu_cells.sh: Nsight Compute counters and stall reasons of decode-size calls' GEMM launches
#   fused-decode(-tests)  moe_triton.fused_decode's device tests; bench_fused_decode.py against the layer
#   triton-tests  moe-triton's device suite and act-order tests (as run_moe_cuda.sh's)
#   block-ready-tests  GemmConfig.block_ready's tests on the GPU (GEMM2 waiting per block while GEMM1 runs)
#   quant-gemm-tests, mma-tests, wgmma-tests, decode-mma  test_quant_gemm.py's device tests; the mma.sync (wgmma) GEMM's tests on the GPU; decode_mma.py: each one-token GEMM alone against tl.dot's
#   act-quant-sweep  act_quant_sweep.py: moe-triton's activation quantization per shape and warp count
#
#   here:       uv build --all-packages --wheel -o .carry/wheels
#   on the GPU: bash benchmarks/gpu/run_call_path.sh .carry/wheels [JOB_REGEX]   (carry: .carry/wheels)
#               EP_TESTS=1 first runs integration/test_expert_parallel_nccl.py over two GPUs (nvidia-h200-x2)
# Results: $OUT/host/*.json, $OUT/e2e/*.json, job logs in $OUT/results.tar.gz.
set -uo pipefail
WHEELS=${1:?usage: run_call_path.sh WHEEL_DIR [JOB_REGEX]}
FILTER=${2:-.*}
# shellcheck source=benchmarks/gpu/_setup.sh
source "$(dirname "$0")/_setup.sh" run_call_path.log
cd "$HERE"
mkdir -p "$OUT/host" "$OUT/e2e" "$OUT/jobs"
jobs=$OUT/jobs.txt
: > "$jobs"
add() { if [[ $1 =~ ^($FILTER)$ ]]; then printf '%s\t%s\n' "$1" "$2" >> "$jobs"; fi; }
e2e() { add "e2e-$1-$2-$3" "python3 bench_e2e.py --model $1 --experts $2 --mode $3 --out $OUT/e2e ${4:-}"; }
# Most wanted first: a job the deadline stops leaves those before it done.
add sysinfo "df -h /tmp /dev/shm; free -g; nproc"
# This build against another (AB_OLD_WHEELS, default .carry/old-wheels) where no patch of one process can
# make the change (a stored layout and the kernels reading it): ab_builds.py, processes of each in turn.
ab_builds() {  # ab_builds JOB "ab_builds.py options -- ab_layer.py options"
  local old_site=$SITE-$1
  add "$1" "rm -rf $old_site && python3 -m pip install -q --no-deps --no-index --no-compile --target $old_site $ROOT/${AB_OLD_WHEELS:-.carry/old-wheels}/*.whl && python3 ab_builds.py --old-site $old_site --new-site $SITE --out $OUT/host/$1.json $2"
}
# ab-builds-mxfp4-*: MXFP4's exponent words holding folded factors (`_layouts.pack_e8m0_tiles`) at decode
# (the mma and tl.dot kernels) and prefill (wgmma) sizes.
ab_builds ab-builds-mxfp4-decode "--processes 4 -- --preset gpt-oss-120b qwen3-235b-a22b qwen3-30b-a3b --dtype mxfp4 --m 1 8 --rounds 3"
ab_builds ab-builds-mxfp4-prefill "--processes 4 -- --preset gpt-oss-120b qwen3-30b-a3b --dtype mxfp4 --m 32 2048 --rounds 2"
ab_builds ab-builds-mxfp4-others "--processes 4 -- --preset mixtral-8x7b deepseek-v3 --dtype mxfp4 --m 1 8 32 512 --rounds 2"
ab_builds ab-builds-mxfp4-few "--processes 6 -- --preset qwen3-30b-a3b gpt-oss-120b --dtype mxfp4 --m 2 4 8 16 --rounds 3"
# ab-builds-g64: int4's groups of 64 loading one scale row per pair of quarters in the tl.dot kernel (gpt-oss-120b).
ab_builds ab-builds-g64 "--processes 4 -- --preset gpt-oss-120b --dtype int4 --m 3 4 8 16 32 128 512 --rounds 3"
# ab-builds-row-scale-*: per-channel int8 quads scaled once after the tl.dot kernel's K loop (ROW_SCALE) against
# per weight (per tile on 16 x 128 tiles); cells on the mma and wgmma kernels run the same code in both builds.
ab_builds ab-builds-row-scale-few "--processes 4 -- --preset qwen3-30b-a3b qwen3-235b-a22b mixtral-8x7b deepseek-v3 gpt-oss-120b --dtype int8 --m 8 32 128 --rounds 3"
ab_builds ab-builds-row-scale-many "--processes 4 -- --preset qwen3-30b-a3b qwen3-235b-a22b mixtral-8x7b deepseek-v3 gpt-oss-120b --dtype int8 --m 512 2048 --rounds 3"
# ab-builds-row-scale-int4-*: per-channel int4 (no preset's checkpoint) scaled once per output in both kernels (the
# tl.dot kernel's K loop, the wgmma kernel's epilogue) against per weight.
ab_builds ab-builds-row-scale-int4 "--processes 4 -- --preset qwen3-30b-a3b qwen3-235b-a22b mixtral-8x7b --dtype int4-channel --m 32 512 2048 8192 --rounds 3"
add ab-row-scale-int4-few "python3 ab_layer.py --rounds 5 --preset qwen3-30b-a3b qwen3-235b-a22b mixtral-8x7b --dtype int4-channel --m 8 32 128 --variant row-scale --variant per-weight=ab_patches:int4_rows_scaled_per_weight --out $OUT/host/ab-row-scale-int4-few.json"
ab_builds ab-builds-row-scale-int4-deepseek "--processes 4 -- --preset deepseek-v3 --dtype int4-channel --m 512 2048 --rounds 3"
# (mixtral-8x7b's int8 cells at 128 and 2048 tokens run the wgmma kernel: the same code in both builds, a control.)
ab_builds ab-builds-row-scale-control "--processes 6 -- --preset mixtral-8x7b --dtype int8 --m 128 2048 --rounds 3"
# ab-scale-pairs-*: the tl.dot kernel's scale rows as int32 words of two (SCALE_PAIRS) against one 16-bit scale per
# thread loaded in its K tile; gpt-oss-120b int4 also on 128-row tiles, which pairs serve. (int8 takes pairs no more:
# its job measured 35835aa, which paired its rows too; on later builds both variants run the same int8 code.)
pairs_ab="python3 ab_layer.py --rounds 3 --variant pairs --variant one-by-one=ab_patches:scale_rows_one_by_one"
add ab-scale-pairs-int8 "$pairs_ab --preset qwen3-30b-a3b qwen3-235b-a22b mixtral-8x7b deepseek-v3 gpt-oss-120b --dtype int8 --m 32 128 512 2048 --out $OUT/host/ab-scale-pairs-int8.json"
add ab-scale-pairs-gpt-oss-int4 "python3 ab_layer.py --rounds 3 --preset gpt-oss-120b --dtype int4 --m 3 5 8 12 --variant shipped --variant g1-128=AB_GEMM1=128x1x4,ab_patches:reshaped --variant both-128=AB_GEMM1=128x1x4,AB_GEMM2=128x2x4,ab_patches:reshaped --variant g1-128-one-by-one=AB_GEMM1=128x1x4,ab_patches:reshaped,ab_patches:scale_rows_one_by_one --out $OUT/host/ab-scale-pairs-gpt-oss-int4.json"
# gpt-oss-120b int4's 32-token entry (256-row tiles, both GEMMs split 2) against 128-row tiles over the tokens it serves.
add ab-gpt-oss-int4-32-n128 "python3 ab_layer.py --rounds 3 --preset gpt-oss-120b --dtype int4 --m 16 32 64 --variant shipped --variant both-128=AB_GEMM1=128x2x4,AB_GEMM2=128x2x4,ab_patches:reshaped --variant both-128-g1-unsplit=AB_GEMM1=128x1x4,AB_GEMM2=128x2x4,ab_patches:reshaped --out $OUT/host/ab-gpt-oss-int4-32-n128.json"
# The one-launch decode path (moe_triton.fused_decode): its device tests, then against the layer and
# the measured limit.
add fused-decode-tests "cd $ROOT && MOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -m device packages/moe-triton/tests/test_fused_decode.py"
add fused-decode "python3 bench_fused_decode.py --out $OUT/host/fused-decode"
# The hand-scheduled mma.sync GEMM (GemmConfig.mma): its device tests, then each one-token GEMM alone
# against the tl.dot kernel (decode_mma.py).
# moe-triton's whole device suite (as run_moe_cuda.sh's triton-tests), for a call that also times.
add triton-tests "cd $ROOT && MOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -n 8 -m device packages/moe-triton/tests; rc=\$?; python3 -m pytest -q -p no:cacheprovider -n 8 packages/moe-triton/tests/test_act_order.py && exit \$rc"
add mma-tests "cd $ROOT && MOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant_gemm.py packages/moe-triton/tests/test_quant_configs.py -k \"mma and not wgmma\""
add quant-gemm-tests "cd $ROOT && MOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -n 8 -m device packages/moe-triton/tests/test_quant_gemm.py"
add wgmma-tests "cd $ROOT && MOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_quant_gemm.py -k wgmma"
add decode-mma "python3 decode_mma.py check-and-time --out $OUT/host/decode-mma.json"
# Variants of one model in one process, timed in interleaved rounds (the host's drift reaches all alike):
# the 48-layer eager targets against transformers, the schemes against fused bf16, compiled decode.
add e2e-interleaved-qwen3 "python3 bench_e2e_interleaved.py --model qwen3-30b-a3b --experts transformers bf16 --out $OUT/e2e"
# The same with variant none (MoE blocks that return zeros): the rest of the step, the floor under any experts.
add e2e-interleaved-qwen3-floor "python3 bench_e2e_interleaved.py --model qwen3-30b-a3b --experts transformers bf16 none --out $OUT/e2e/floor"
add e2e-interleaved-qwen3-schemes "python3 bench_e2e_interleaved.py --model qwen3-30b-a3b --experts bf16 int4 fp8-block mxfp4 --out $OUT/e2e/schemes"
add e2e-interleaved-qwen3-8l-compiled "python3 bench_e2e_interleaved.py --model qwen3-30b-a3b --layers 8 --mode compiled --experts transformers bf16 int4 mxfp4 --batches 1 64 --out $OUT/e2e"
add e2e-interleaved-qwen3-8l-compiled-floor "python3 bench_e2e_interleaved.py --model qwen3-30b-a3b --layers 8 --mode compiled --experts transformers bf16 none --batches 1 64 --out $OUT/e2e/floor"
# mixtral-8x7b (32 layers, 87 GiB in bf16): two of its 16-bit models do not fit one H200, so transformers
# against the floor, and fused bf16 against int4 and the floor; gpt-oss-20b (24 layers) whole (its blocks
# also return their router's logits: no variant none).
add e2e-interleaved-mixtral "python3 bench_e2e_interleaved.py --model mixtral-8x7b --experts transformers none --out $OUT/e2e/mixtral"
add e2e-interleaved-mixtral-schemes "python3 bench_e2e_interleaved.py --model mixtral-8x7b --experts bf16 int4 none --out $OUT/e2e/mixtral-schemes"
add e2e-interleaved-gpt-oss "python3 bench_e2e_interleaved.py --model gpt-oss-20b --experts transformers bf16 mxfp4 --out $OUT/e2e/gpt-oss"
add launch-cost "python3 launch_cost.py > $OUT/host/launch_cost.txt"
# Per-program timestamps of decode-size calls' launches (moe_triton._common.trace): where the chain's time goes.
add trace-decode "python3 trace_decode.py --out $OUT/host/trace-decode.json --dump $OUT/host/trace-decode-builds --cells ${TRACE_CELLS:-qwen3-30b-a3b/int4/1 qwen3-30b-a3b/int4/8 qwen3-30b-a3b/mxfp4/1 qwen3-30b-a3b/int8/1 qwen3-30b-a3b/fp8-block/1 qwen3-30b-a3b/fp8-block/8 gpt-oss-120b/int4/1 qwen3-235b-a22b/int4/1 mixtral-8x7b/int4/1 deepseek-v3/int4/1}"
add act-quant-sweep "python3 act_quant_sweep.py --out $OUT/host/act-quant"
add tests "cd $ROOT && python3 -m pytest -q -p no:cacheprovider integration/test_call_path.py"
# The compiled decode step (generate's own compile, static cache) under the profiler: where its host time goes.
add profile-decode-compiled "python3 profile_decode.py --model qwen3-30b-a3b --layers 8 --experts transformers bf16 --compile-mode ${COMPILE_MODE:-default} --out $OUT/host/profile-decode"
add profile-decode "python3 profile_decode.py --model qwen3-30b-a3b --layers 8 --experts bf16 int4 mxfp4 --out $OUT/host/profile-decode"
# gpt-oss-20b, all 24 layers: its decode step with bf16 against MXFP4 experts.
add profile-decode-gpt-oss "python3 profile_decode.py --model gpt-oss-20b --layers 24 --experts bf16 mxfp4 --out $OUT/host/profile-decode"
# The decode step captured whole in a CUDA graph (static cache): what each experts implementation costs
# once the host is out of the step.
for x in transformers bf16 int4 mxfp4; do e2e qwen3-30b-a3b $x graphed; done
for x in transformers bf16 int4 mxfp4; do
  add "e2e-qwen3-8l-$x-graphed" "python3 bench_e2e.py --model qwen3-30b-a3b --layers 8 --experts $x --mode graphed --out $OUT/e2e"
done
# Compiled end to end at 8 of the 48 layers (compiling all 48 takes minutes per run), in mode="reduce-overhead",
# transformers' own default for compiled decode (inductor's CUDA graph trees capture the step; the layers'
# ops run inside their graph), then in mode="default" (COMPILE_MODE), with eager at 8 beside them.
for x in bf16 transformers int4 mxfp4; do
  add "e2e-qwen3-8l-$x-compiled-ro" "python3 bench_e2e.py --model qwen3-30b-a3b --layers 8 --experts $x --mode compiled --batches 1 64 --compile-mode reduce-overhead --out $OUT/e2e"
done
for x in bf16 transformers int4 mxfp4; do
  add "e2e-qwen3-8l-$x-compiled" "python3 bench_e2e.py --model qwen3-30b-a3b --layers 8 --experts $x --mode compiled --batches 1 64 --compile-mode ${COMPILE_MODE:-default} --out $OUT/e2e"
done
for x in transformers bf16; do
  add "e2e-qwen3-8l-$x-eager" "python3 bench_e2e.py --model qwen3-30b-a3b --layers 8 --experts $x --mode eager --batches 1 64 --out $OUT/e2e"
done
add host-layer-qwen3 "python3 bench_host_path.py --out $OUT/host --presets qwen3-30b-a3b"
# Host time per eager call where the mma kernel serves qwen3-30b-a3b (int4 and MXFP4 at 1-3 tokens, int8 at 1-2)
# beside paths it does not (bf16, 8 tokens) in the same run.
add host-mma-qwen3 "python3 bench_host_path.py --out $OUT/host/mma --presets qwen3-30b-a3b --schemes bf16 int4 int8 mxfp4 --tokens 1 2 3 8"
# The same where the one- and two-token entries of the larger presets put one or both GEMMs on the mma kernel.
# Host time per eager call where int8 per channel runs the tl.dot kernel with ROW_SCALE (8-2048 tokens)
add host-row-scale "python3 bench_host_path.py --out $OUT/host/row-scale --presets qwen3-30b-a3b deepseek-v3 gpt-oss-120b --schemes int8 --tokens 8 64 512 2048"
add host-mma-22 "python3 bench_host_path.py --out $OUT/host/mma-22 --presets qwen3-235b-a22b gpt-oss-120b deepseek-v3 --schemes int4 mxfp4 --tokens 1 2 8"
# The same cells on one pinned core: whether the cells that take ~20 us more follow the scheduler.
add host-layer-qwen3-pinned "taskset -c 2 python3 bench_host_path.py --out $OUT/host/pinned --presets qwen3-30b-a3b"
add host-layer-a "python3 bench_host_path.py --out $OUT/host --presets mixtral-8x7b"
add host-layer-b "python3 bench_host_path.py --out $OUT/host --presets deepseek-v3"
add host-layer-gpt-oss "python3 bench_host_path.py --out $OUT/host --presets gpt-oss-120b"
e2e qwen3-30b-a3b transformers eager
for s in bf16 int4 fp8-block mxfp4; do e2e qwen3-30b-a3b $s eager; done
e2e qwen3-30b-a3b transformers compiled "--batches 1 64 --compile-mode ${COMPILE_MODE:-default}"
e2e qwen3-30b-a3b bf16 compiled "--batches 1 64 --compile-mode ${COMPILE_MODE:-default}"
e2e gpt-oss-20b transformers eager
e2e gpt-oss-20b bf16 eager
e2e gpt-oss-20b mxfp4 eager
add host-block-qwen3 "python3 bench_host_path.py --block --out $OUT/host --presets qwen3-30b-a3b --schemes bf16 int4 fp8-block mxfp4"
e2e mixtral-8x7b transformers eager
e2e mixtral-8x7b bf16 eager
e2e mixtral-8x7b int4 eager
add host-block "python3 bench_host_path.py --block --out $OUT/host --schemes bf16 int4 fp8-block mxfp4"
add decode-limits "python3 decode_limits.py --out $OUT/host/decode-limits"
add matmul-limits "python3 matmul_limits.py --out $OUT/host/matmul-limits"
# fp8 at decode sizes, per preset: block fp8 served unswapped (the H100 file's entries) against swapped;
# per-channel fp8 with act_quant launched plain against dependent (AB_TOKENS: token counts).
for p in qwen3-30b-a3b qwen3-235b-a22b mixtral-8x7b deepseek-v3; do
  add "ab-fp8-block-$p" "python3 ab_layer.py --preset $p --dtype fp8-block --m ${AB_TOKENS:-1 8 32 128} --rounds 5 --variant unswapped=ab_patches:unswapped --variant swapped=ab_patches:swapped --out $OUT/host/ab-fp8-block-$p.json"
done
for p in qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b mixtral-8x7b deepseek-v3; do
  add "ab-fp8-channel-pdl-$p" "python3 ab_layer.py --preset $p --dtype fp8-channel --m ${AB_TOKENS:-1 8 32 128} --rounds 5 --variant plain=ab_patches:act_quant_plain_launch --variant dependent --out $OUT/host/ab-fp8-channel-pdl-$p.json"
done
# A few tokens' pairs launched a block each (direct), without the alignment launch, against aligned blocks.
for s in int4 int8 mxfp4 fp8-block fp8-channel; do
  for p in qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b mixtral-8x7b deepseek-v3; do
    [ "$s$p" = fp8-blockgpt-oss-120b ] && continue  # K = N = 2880: no 128x128 blocks
    add "ab-direct-$s-$p" "python3 ab_layer.py --preset $p --dtype $s --m ${AB_TOKENS:-2 4 8} --rounds 5 --variant aligned=ab_patches:direct_one_token_only --variant direct=ab_patches:direct_up_to_8 --out $OUT/host/ab-direct-$s-$p.json"
  done
done
# Block fp8's input quantized by the routing launch (as shipped) against an activation launch of its own.
for p in qwen3-30b-a3b qwen3-235b-a22b mixtral-8x7b deepseek-v3; do
  add "ab-fp8-route-quant-$p" "python3 ab_layer.py --preset $p --dtype fp8-block --m ${AB_TOKENS:-1 8} --rounds 5 --variant apart=ab_patches:input_quantized_apart --variant in-routing --out $OUT/host/ab-fp8-route-quant-$p.json"
done
# Direct (one-token) launches capped at 96 or 80 registers per thread: five or six programs per SM.
for s in int4 int8 mxfp4; do
  add "ab-direct-maxnreg-$s" "python3 ab_layer.py --preset qwen3-235b-a22b qwen3-30b-a3b gpt-oss-120b --dtype $s --m 1 --rounds 5 --variant compiler --variant r96=ab_patches:max_registers_96 --variant r80=ab_patches:max_registers_80 --out $OUT/host/ab-direct-maxnreg-$s.json"
done
# The wide tiles' direct launches (234-251 registers, two programs per SM) capped for three or four.
for s in int4 int8 mxfp4; do
  add "ab-direct-maxnreg-wide-$s" "python3 ab_layer.py --preset gpt-oss-120b mixtral-8x7b deepseek-v3 --dtype $s --m 1 --rounds 5 --variant compiler --variant r168=ab_patches:max_registers_168 --variant r128=ab_patches:max_registers_128 --out $OUT/host/ab-direct-maxnreg-wide-$s.json"
done
# gpt-oss-120b's one-token MXFP4 entry (GEMM2 capped at 168 registers) against the uncapped one it replaced.
add ab-gpt-oss-mxfp4-registers "python3 ab_layer.py --preset gpt-oss-120b --dtype mxfp4 --m 1 --rounds 7 --variant before=ab_patches:gpt_oss_mxfp4_1_before --variant shipped --out $OUT/host/ab-gpt-oss-mxfp4-registers.json"
# A quads K tile's four quarters as one dot against four.
for s in int4 int8 mxfp4; do
  add "ab-one-dot-$s" "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b mixtral-8x7b deepseek-v3 --dtype $s --m ${AB_TOKENS:-1 8} --rounds 5 --variant quarters=ab_patches:quarters_apart --variant one-dot=ab_patches:one_dot --out $OUT/host/ab-one-dot-$s.json"
done
# A one-token GEMM2 asking L2 for more of its weights before its wait (shipped: its first K tile).
for s in int4 mxfp4; do
  add "ab-prefetch-depth-$s" "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b mixtral-8x7b deepseek-v3 --dtype $s --m 1 --rounds 5 --variant shipped --variant t2=ab_patches:prefetch_tiles_2 --variant all=ab_patches:prefetch_tiles_all --out $OUT/host/ab-prefetch-depth-$s.json"
done
# GEMM1 of decode-size aligned calls on the warp-specialized Gluon kernel, and at 32 tokens both GEMMs
# (up to 8 tokens GEMM2's sums finish by last arrival, which that kernel lacks).
for s in int4 mxfp4 int8; do
  add "ab-gluon-decode-$s" "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b mixtral-8x7b --dtype $s --m ${AB_TOKENS:-8 32} --rounds 5 --variant shipped --variant g1-wgmma128=ab_patches:gemm1_wgmma_128 --variant g1-wgmma256=ab_patches:gemm1_wgmma_256 --out $OUT/host/ab-gluon-decode-$s.json"
  add "ab-gluon-both-$s" "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b mixtral-8x7b --dtype $s --m 32 --rounds 5 --variant shipped --variant both-wgmma128=ab_patches:both_wgmma_128 --out $OUT/host/ab-gluon-both-$s.json"
done
# Decode-size int4 launches on the hand-scheduled mma.sync kernel (GemmConfig.mma; direct at 1 and 2 tokens,
# aligned blocks at 8), in two halves of the presets (one per GPU).
add ab-mma-int4-a "python3 ab_layer.py --preset qwen3-30b-a3b gpt-oss-120b deepseek-v3 --dtype int4 --m ${AB_TOKENS:-1 2 8} --rounds 5 --variant shipped --variant mma=ab_patches:mma_both --variant mma-gemm1=ab_patches:mma_gemm1 --variant mma-gemm2=ab_patches:mma_gemm2 --variant mma-split2x=ab_patches:mma_both_split2x --out $OUT/host/ab-mma-int4-a.json"
add ab-mma-int4-b "python3 ab_layer.py --preset qwen3-235b-a22b mixtral-8x7b --dtype int4 --m ${AB_TOKENS:-1 2 8} --rounds 5 --variant shipped --variant mma=ab_patches:mma_both --variant mma-gemm1=ab_patches:mma_gemm1 --variant mma-gemm2=ab_patches:mma_gemm2 --variant mma-split2x=ab_patches:mma_both_split2x --out $OUT/host/ab-mma-int4-b.json"
# int8 and MXFP4 on the mma kernel at one and two tokens: either GEMM or both, GEMM2's whole share before its wait.
# (int8's whole share of 256-wide GEMM2 tiles overflows shared memory: not timed)
add ab-mma-mxfp4 "python3 ab_layer.py --preset qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b deepseek-v3 mixtral-8x7b --dtype mxfp4 --m ${AB_TOKENS:-1 2} --rounds 5 --variant shipped --variant mma=ab_patches:mma_both --variant mma-gemm1=ab_patches:mma_gemm1 --variant mma-gemm2=ab_patches:mma_gemm2 --variant g2ws=ab_patches:gemm2_whole_share --out $OUT/host/ab-mma-mxfp4.json"
add ab-mma-int8 "python3 ab_layer.py --preset qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b deepseek-v3 mixtral-8x7b --dtype int8 --m ${AB_TOKENS:-1 2} --rounds 5 --variant shipped --variant mma=ab_patches:mma_both --variant mma-gemm1=ab_patches:mma_gemm1 --variant mma-gemm2=ab_patches:mma_gemm2 --out $OUT/host/ab-mma-int8.json"
# MXFP4's one-token entries with GEMM2 (or both GEMMs) on the mma kernel as 2-token entries would serve 2-4 tokens.
add ab-mma-mxfp4-entry2 "python3 ab_layer.py --preset qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b --dtype mxfp4 --m 2 3 4 --rounds 7 --variant shipped --variant both=ab_patches:one_token_entry_mma_both --variant gemm2=ab_patches:one_token_entry_mma_gemm2 --out $OUT/host/ab-mma-mxfp4-entry2.json"
# The twenty-first session's H200 mma entries against what served those token counts before.
for s in int4 mxfp4 int8; do
  case $s in int4) ps="qwen3-30b-a3b"; ms="2 3";; mxfp4) ps="qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b"; ms="2 3";; int8) ps="qwen3-30b-a3b gpt-oss-120b"; ms="1 2";; esac
  add "ab-mma-entries-21-$s" "python3 ab_layer.py --preset $ps --dtype $s --m $ms --rounds 7 --variant before=ab_patches:mma_entries_21_before --variant shipped --out $OUT/host/ab-mma-entries-21-$s.json"
done
# The one-token int4 entries' mma tiles on MXFP4 and int8 (qwen3-30b-a3b's GEMM1 64 x split 4, gpt-oss-120b's GEMM2 256 x split 4).
add ab-mma-shapes-qwen3-mxfp4 "python3 ab_layer.py --preset qwen3-30b-a3b --dtype mxfp4 --m 1 --rounds 7 --variant shipped --variant g1-64x4=ab_patches:mma_gemm1_64x4 --variant g1-64x4-g2-64x3=ab_patches:mma_gemm1_64x4_gemm2_64x3 --out $OUT/host/ab-mma-shapes-qwen3-mxfp4.json"
for s in mxfp4 int8; do
  add "ab-mma-shapes-gpt-oss-$s" "python3 ab_layer.py --preset gpt-oss-120b --dtype $s --m 1 --rounds 7 --variant shipped --variant g2-256x4=ab_patches:mma_gemm2_256x4 --variant g2-64x4=ab_patches:mma_gemm2_64x4 --out $OUT/host/ab-mma-shapes-gpt-oss-$s.json"
done
add ab-mma-entries "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b --dtype int4 --m 1 2 --rounds 7 --variant before=ab_patches:mma_entries_before --variant shipped --out $OUT/host/ab-mma-entries.json"
# GEMM2's weights all asked for before its wait on GEMM1 (mma kernel, ring deeper than its split), and
# whether its programs find room on the SMs while GEMM1 runs (trace: GEMM2's start against GEMM1's end).
ws="--variant shipped --variant g2ws=ab_patches:gemm2_whole_share --variant g2wsf=ab_patches:gemm2_whole_share_fewest --variant g2wsf64=ab_patches:gemm2_whole_share_fewest_64 --variant both-g2wsf=ab_patches:both_mma_gemm2_whole_share_fewest"
ws_cells=""
for p in qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b; do
  ws_cells+=" $p/int4/1 $p/int4/1/g2wsf=ab_patches:gemm2_whole_share_fewest $p/int4/1/both-g2wsf=ab_patches:both_mma_gemm2_whole_share_fewest"
done
for v in g2ws=ab_patches:gemm2_whole_share g2ws-s2=ab_patches:gemm2_whole_share_split2 g2ws-s6=ab_patches:gemm2_whole_share_split6 g2ws64=ab_patches:gemm2_whole_share_64; do
  ws_cells+=" qwen3-30b-a3b/int4/1/$v"
done
add trace-whole-share "python3 trace_decode.py --out $OUT/host/trace-whole-share.json --cells ${WS_CELLS:-$ws_cells}"
# qwen3-30b-a3b, whose GEMM1 (mma kernel) leaves GEMM2's programs room on the SMs while it runs.
add ab-whole-share-qwen3 "python3 ab_layer.py --preset qwen3-30b-a3b --dtype int4 --m ${AB_TOKENS:-1 2} --rounds 7 --variant shipped --variant g2ws=ab_patches:gemm2_whole_share --variant g2ws-s2=ab_patches:gemm2_whole_share_split2 --variant g2ws-s6=ab_patches:gemm2_whole_share_split6 --variant g2ws64=ab_patches:gemm2_whole_share_64 --out $OUT/host/ab-whole-share-qwen3.json"
add ab-whole-share-entry2 "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b --dtype int4 --m 2 3 4 --rounds 7 --variant shipped --variant entry2=ab_patches:one_token_entry_gemm2_whole_share --out $OUT/host/ab-whole-share-entry2.json"
add ab-whole-share-a "python3 ab_layer.py --preset qwen3-30b-a3b gpt-oss-120b --dtype int4 --m ${AB_TOKENS:-1 2} --rounds 5 $ws --out $OUT/host/ab-whole-share-a.json"
add ab-whole-share-b "python3 ab_layer.py --preset qwen3-235b-a22b deepseek-v3 mixtral-8x7b --dtype int4 --m ${AB_TOKENS:-1 2} --rounds 5 $ws --out $OUT/host/ab-whole-share-b.json"
# This session's 8-token retunes against the entries they replaced.
add ab-retune-mixtral-int4 "python3 ab_layer.py --preset mixtral-8x7b --dtype int4 --m 8 --rounds 7 --variant before=ab_patches:mixtral_int4_8_before --variant shipped --out $OUT/host/ab-retune-mixtral-int4.json"
add ab-retune-qwen3-fp8-block "python3 ab_layer.py --preset qwen3-30b-a3b --dtype fp8-block --m 8 --rounds 7 --variant before=ab_patches:qwen3_fp8_block_8_before --variant shipped --out $OUT/host/ab-retune-qwen3-fp8-block.json"
# The twenty-second session's one-token entries (per-GEMM searches with the mma grid) against what served
# 1-3 tokens before them, and the new one-token entry at 2 and 3 tokens.
e22="--m 1 2 3 --rounds 7 --variant before=ab_patches:one_token_entries_22_before --variant shipped --variant one-token-entry=ab_patches:one_token_entry"
add ab-entries-22-int4 "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b deepseek-v3 --dtype int4 $e22 --out $OUT/host/ab-entries-22-int4.json"
add ab-entries-22-mxfp4 "python3 ab_layer.py --preset deepseek-v3 --dtype mxfp4 $e22 --out $OUT/host/ab-entries-22-mxfp4.json"
# The twenty-third session's int8 2048-token searches against the served entries, at token counts the entry serves.
i8="--m 1024 2048 4000 --rounds 5 --variant shipped --variant tuned=ab_patches:int8_2048_tuned"
add ab-int8-2048-deepseek "python3 ab_layer.py --preset deepseek-v3 --dtype int8 $i8 --variant tuned-tail16=ab_patches:int8_2048_tuned_tail16 --out $OUT/host/ab-int8-2048-deepseek.json"
add ab-int8-2048-gpt-oss "python3 ab_layer.py --preset gpt-oss-120b --dtype int8 $i8 --out $OUT/host/ab-int8-2048-gpt-oss.json"
# int8 at 1024-2048 tokens on the 8192-token entry's wgmma tile, against the tl.dot entry that serves them.
add ab-int8-2048-wgmma "python3 ab_layer.py --preset gpt-oss-120b deepseek-v3 --dtype int8 --m 1024 2048 --rounds 5 --variant shipped --variant tile-of-8192=ab_patches:tile_of_8192 --out $OUT/host/ab-int8-2048-wgmma.json"
add ab-int8-3072-deepseek "python3 ab_layer.py --preset deepseek-v3 --dtype int8 --m 2600 3072 4095 --rounds 5 --variant shipped --variant tile-of-8192=ab_patches:tile_of_8192 --out $OUT/host/ab-int8-3072-deepseek.json"
# GEMM1 ranking its own pairs' experts (GemmConfig.own_route, one token) against waiting for the routing launch's.
own="--m 1 --rounds 7 --variant waits=ab_patches:own_route_off --variant own=ab_patches:own_route_on"
add ab-own-route-int4 "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b --dtype int4 $own --out $OUT/host/ab-own-route-int4.json"
add ab-own-route-qwen3 "python3 ab_layer.py --preset qwen3-30b-a3b --dtype int8 $own --out $OUT/host/ab-own-route-qwen3.json"
# own_route with GEMM1 in one wave (ab_patches.gemm1_128w4_own and the rest), where its served shape runs in two.
add ab-own-route-one-wave-235b "python3 ab_layer.py --preset qwen3-235b-a22b --dtype int4 --m 1 --rounds 7 --variant shipped --variant own=ab_patches:own_route_on --variant g1-128w4=ab_patches:gemm1_128w4 --variant g1-128w4-own=ab_patches:gemm1_128w4_own --variant g1-64w4-own=ab_patches:gemm1_64w4_own --out $OUT/host/ab-own-route-one-wave-235b.json"
add ab-own-route-one-wave-gpt-oss "python3 ab_layer.py --preset gpt-oss-120b --dtype int4 --m 1 --rounds 7 --variant shipped --variant own=ab_patches:own_route_on --variant g1-split3=ab_patches:gemm1_split3 --variant g1-split3-own=ab_patches:gemm1_split3_own --out $OUT/host/ab-own-route-one-wave-gpt-oss.json"
# qwen3-235b-a22b int4's one-token GEMM2 in one wave (ab_patches.gemm2_split3 and the rest).
add ab-one-wave-gemm2 "python3 ab_layer.py --preset qwen3-235b-a22b --dtype int4 --m 1 2 3 --rounds 7 --variant shipped --variant split3=ab_patches:gemm2_split3 --variant split3-ring4=ab_patches:gemm2_split3_ring4 --variant split2=ab_patches:gemm2_split2 --variant split2-ring6=ab_patches:gemm2_split2_ring6 --variant n128-split3=ab_patches:gemm2_n128_split3 --out $OUT/host/ab-one-wave-gemm2.json"
# The 8-token cells below issue 60's 0.6, latency-bound with few warps per scheduler: more programs per SM
# (register caps) or more K tiles in flight (deeper pipelines).
occ="--m 8 --rounds 5 --variant shipped --variant r96=ab_patches:max_registers_96 --variant r80=ab_patches:max_registers_80 --variant r64=ab_patches:max_registers_64 --variant s4=ab_patches:stages4 --variant s5=ab_patches:stages5"
add ab-eight-token-occupancy-int4 "python3 ab_layer.py --preset qwen3-30b-a3b gpt-oss-120b mixtral-8x7b --dtype int4 $occ --out $OUT/host/ab-eight-token-occupancy-int4.json"
add ab-eight-token-occupancy-mxfp4 "python3 ab_layer.py --preset qwen3-30b-a3b gpt-oss-120b mixtral-8x7b --dtype mxfp4 $occ --out $OUT/host/ab-eight-token-occupancy-mxfp4.json"
add ab-eight-token-occupancy-qwen3 "python3 ab_layer.py --preset qwen3-30b-a3b --dtype int8 fp8-channel $occ --out $OUT/host/ab-eight-token-occupancy-qwen3.json"
# One-token GEMM1 asking for all its weight tiles up front (a deeper pipeline, or shorter K-splits).
for s in int4 mxfp4 int8; do
  add "ab-gemm1-upfront-$s" "python3 ab_layer.py --preset qwen3-30b-a3b --dtype $s --m 1 --rounds 5 --variant shipped --variant stages5=ab_patches:gemm1_stages5 --variant n128-stages5=ab_patches:gemm1_n128_stages5 --variant split8=ab_patches:gemm1_split8 --variant n128-split8=ab_patches:gemm1_n128_split8 --out $OUT/host/ab-gemm1-upfront-$s.json"
done
# Where an fp8 decode-size call's time goes beside int8's (the same weight bytes): GPU time per kernel in a graph.
add profile-fp8-decode "python3 profile_layer.py --out $OUT/host/profile-fp8 --preset qwen3-30b-a3b --m 1 8 --dtypes int8 fp8-block fp8-channel --graph; python3 profile_layer.py --out $OUT/host/profile-fp8-gpt-oss --preset gpt-oss-120b --m 1 8 --dtypes int8 fp8-channel --graph"
# The shipped aligned-GEMM2 prefetch (qwen3-30b-a3b int4's 8-token entry) against the same entry without it, over
# the token counts that entry serves.
add ab-gemm2-prefetch-entry "python3 ab_layer.py --preset qwen3-30b-a3b --dtype int4 --m 5 8 12 15 --rounds 7 --variant off=ab_patches:gemm2_prefetch_off --variant shipped --out $OUT/host/ab-gemm2-prefetch-entry.json"
# GEMM2 waiting per block of GEMM1's rows (GemmConfig.block_ready): its tests (a deadlock would stop at the timeout),
# then against the shipped entries; AB_TOKENS: the token counts.
add block-ready-tests "cd $ROOT && MOE_TEST_REQUIRE_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider packages/moe-triton/tests/test_block_ready.py"
for d in int4 mxfp4 int8; do
  add ab-block-ready-$d "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b mixtral-8x7b deepseek-v3 --dtype $d --m ${AB_TOKENS:-8 32} --rounds 5 --variant shipped --variant ready=ab_patches:gemm2_block_ready --out $OUT/host/ab-block-ready-$d.json"
done
# The shipped entries without block_ready, over the token counts each serves (an entry keyed 8 serves 3-15 or 4-15):
# where GEMM1 runs in fewer waves than at the key, GEMM2's spin may cost more than the overlap gains.
for d in int4 mxfp4 int8; do
  add ab-block-ready-off-$d "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b mixtral-8x7b deepseek-v3 --dtype $d --m ${AB_TOKENS:-3 4 16 64 256} --rounds 5 --variant off=ab_patches:gemm2_block_ready_off --variant shipped --out $OUT/host/ab-block-ready-off-$d.json"
done
# The entries that took block_ready last (qwen3-30b-a3b and mixtral-8x7b int4 keyed 8, deepseek-v3 MXFP4 keyed 32)
# without it, over the token counts each serves.
add ab-block-ready-new-int4 "python3 ab_layer.py --preset qwen3-30b-a3b mixtral-8x7b --dtype int4 --m 3 4 8 15 --rounds 5 --variant off=ab_patches:gemm2_block_ready_off --variant shipped --out $OUT/host/ab-block-ready-new-int4.json"
add ab-block-ready-new-mxfp4 "python3 ab_layer.py --preset deepseek-v3 --dtype mxfp4 --m 16 32 63 --rounds 5 --variant off=ab_patches:gemm2_block_ready_off --variant shipped --out $OUT/host/ab-block-ready-new-mxfp4.json"
# gpt-oss-120b MXFP4's retuned 8-token entry against the one before and each of its changes alone, over the tokens it serves.
add ab-gpt-oss-mxfp4-8-retune "python3 ab_layer.py --preset gpt-oss-120b --dtype mxfp4 --m 4 5 8 12 15 --rounds 7 --variant before=ab_patches:gpt_oss_mxfp4_8_before --variant shipped --variant grouped=ab_patches:gpt_oss_mxfp4_8_grouped --variant unsplit=ab_patches:gpt_oss_mxfp4_8_unsplit --out $OUT/host/ab-gpt-oss-mxfp4-8-retune.json"
# A `moe tune` output folder's entry (AB_TUNED_DIR) against the shipped ones: AB_PRESET, AB_DTYPE, AB_TOKENS.
add ab-tuned-entry "python3 ab_layer.py --preset \${AB_PRESET:?} --dtype \${AB_DTYPE:?} --m \${AB_TOKENS:?} --rounds 5 --variant shipped --variant tuned=ab_patches:tuned_entry --out $OUT/host/ab-tuned-entry.json"
# The wgmma kernel's 128-pair blocks at 240 or 248 registers per thread instead of 255 (more spilled copy
# addresses), on the cells whose entries run them (128-row wgmma tiles at 512-2048 tokens): int8 first.
folded="--rounds 5 --variant shipped --variant r240=ab_patches:folded_regs_240 --variant r248=ab_patches:folded_regs_248"
add ab-folded-regs-int8 "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b --dtype int8 --m 2048 $folded --out $OUT/host/ab-folded-regs-int8-qwen.json && python3 ab_layer.py --preset mixtral-8x7b --dtype int8 --m 512 2048 $folded --out $OUT/host/ab-folded-regs-int8-mixtral.json"
add ab-folded-regs-qwen "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b --dtype int4 mxfp4 --m 2048 $folded --out $OUT/host/ab-folded-regs-qwen.json"
add ab-folded-regs-mixtral "python3 ab_layer.py --preset mixtral-8x7b --dtype int4 mxfp4 --m 512 2048 $folded --out $OUT/host/ab-folded-regs-mixtral.json"
# qwen3-235b-a22b int4 at 3-6 tokens: its entries keyed 2 and 8 as shipped, and the 8-token one without block_ready.
add ab-entry8-off-qwen3-235b "python3 ab_layer.py --preset qwen3-235b-a22b --dtype int4 --m 3 4 5 6 --rounds 5 --variant shipped --variant off=ab_patches:gemm2_block_ready_off --variant entry8-off=ab_patches:entry8_block_ready_off --out $OUT/host/ab-entry8-off-qwen3-235b.json"
# 4 and 5 tokens (served by the 8-token entry) on the 2-token entry, where a file has one (int4, MXFP4).
add ab-entry2 "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b deepseek-v3 gpt-oss-120b --dtype int4 mxfp4 --m 4 5 --rounds 5 --variant shipped --variant entry2=ab_patches:entry2 --out $OUT/host/ab-entry2.json"
# gpt-oss-120b int4's 8-token entry on 128-row tiles (more programs per SM) over the tokens it serves.
add ab-gpt-oss-int4-n128 "python3 ab_layer.py --preset gpt-oss-120b --dtype int4 --m 3 5 8 12 --rounds 5 --variant shipped --variant g1-n128=ab_patches:gemm1_n128 --variant g1-n128-s3=ab_patches:gemm1_n128_s3 --variant both-n128=ab_patches:both_n128 --variant both-n128-g16=ab_patches:both_n128_g16 --out $OUT/host/ab-gpt-oss-int4-n128.json"
# One-token entries whose GEMM1 runs on the tl.dot kernel (where own_route cannot be set) with GEMM1 moved onto
# the mma kernel, alone and ranking its pairs' experts itself, and both GEMMs moved with it; routings that
# choose by logit only (not deepseek-v3's).
own_mma="--m 1 --rounds 7 --variant shipped --variant mma-g1=ab_patches:mma_gemm1 --variant mma-g1-own=ab_patches:mma_gemm1_own_route --variant mma-both-own=ab_patches:mma_both_own_route"
add ab-mma-own-route-mxfp4 "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b mixtral-8x7b --dtype mxfp4 $own_mma --out $OUT/host/ab-mma-own-route-mxfp4.json"
add ab-mma-own-route-int8 "python3 ab_layer.py --preset gpt-oss-120b qwen3-235b-a22b mixtral-8x7b --dtype int8 $own_mma --out $OUT/host/ab-mma-own-route-int8.json"
add ab-mma-own-route-int4 "python3 ab_layer.py --preset mixtral-8x7b --dtype int4 $own_mma --out $OUT/host/ab-mma-own-route-int4.json"
# The mma kernel's scale rows copied with each K tile's words against loaded in the tile (GemmConfig.scales_in_tile),
# in both GEMMs or one, where one-token to 4-token entries run that kernel (each entry as shipped against both,
# or one GEMM, loading them in the tile).
staged="--rounds 5 --variant shipped --variant in-tile=ab_patches:scales_in_tile --variant in-tile-g1=ab_patches:scales_in_tile_gemm1 --variant in-tile-g2=ab_patches:scales_in_tile_gemm2"
add ab-staged-scales-int4 "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b deepseek-v3 --dtype int4 --m 1 2 3 4 $staged --out $OUT/host/ab-staged-scales-int4.json"
add ab-staged-scales-mxfp4 "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b deepseek-v3 --dtype mxfp4 --m 1 2 3 4 $staged --out $OUT/host/ab-staged-scales-mxfp4.json"
add ab-staged-scales-int8 "python3 ab_layer.py --preset qwen3-30b-a3b gpt-oss-120b --dtype int8 --m 1 $staged --out $OUT/host/ab-staged-scales-int8.json"
# The copied scale row read at its group's start, before the group's MMAs (a patch of the installed kernel, run
# where the entries run it), against the shipped kernel: with the entries as shipped, and copying the rows in every
# GEMM (where entries load them in the tile for the copied build's registers). The kernel reads them so since: the
# patch applies to builds before fa799ae only (this job and ab-entries-gpt-oss-int4).
group_start="patch -s -o /tmp/_mma_group_start.py $SITE/moe_triton/quant_gemm_details/_mma.py $ROOT/benchmarks/results/gpu-h200/session-2026-12-01-33/patches/scale-loaded-at-group-start.diff && AB_MMA_SOURCE=/tmp/_mma_group_start.py"
early="--rounds 5 --variant shipped --variant early=ab_patches:mma_kernel_from_source --variant early-copied=ab_patches:mma_kernel_from_source,ab_patches:scales_copied"
add ab-scale-at-group-start-int4 "$group_start python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b deepseek-v3 --dtype int4 --m 1 2 3 4 $early --out $OUT/host/ab-scale-at-group-start-int4.json"
add ab-scale-at-group-start-int8 "$group_start python3 ab_layer.py --preset qwen3-30b-a3b gpt-oss-120b --dtype int8 --m 1 $early --out $OUT/host/ab-scale-at-group-start-int8.json"
# One-token int4 launch shapes now that the mma kernel copies scale rows with the words: GEMM1 (GEMM2) of gpt-oss-120b
# (shipped 64 rows in split 6; 128 in split 8) and qwen3-235b-a22b (256 rows, split 4, 8 warps) in fewer or more programs.
shape() { printf -- "--variant %s=AB_%s=%s,ab_patches:reshaped " "$1" "$2" "$3"; }
add ab-one-token-shapes-gpt-oss "python3 ab_layer.py --preset gpt-oss-120b --dtype int4 --m 1 2 --rounds 5 --variant shipped $(shape g1-64x3 GEMM1 64x3x4)$(shape g1-64x4 GEMM1 64x4x4)$(shape g1-128x4 GEMM1 128x4x4)$(shape g1-128x6 GEMM1 128x6x4)$(shape g2-128x6 GEMM2 128x6x4)--out $OUT/host/ab-one-token-shapes-gpt-oss.json"
add ab-one-token-shapes-qwen3-235b "python3 ab_layer.py --preset qwen3-235b-a22b --dtype int4 --m 1 --rounds 5 --variant shipped $(shape g1-128x4 GEMM1 128x4x4)$(shape g1-256x8 GEMM1 256x8x8)$(shape g1-128x8 GEMM1 128x8x4)$(shape g1-256x4w4 GEMM1 256x4x4)$(shape g2-128x4 GEMM2 128x4x4)--out $OUT/host/ab-one-token-shapes-qwen3-235b.json"
# MXFP4's one- and two-token entries against the int4 entry of their shape on the mma kernel (exponent words copied
# with the words), and against GEMM1 moved onto the mma kernel ranking its own experts.
add ab-int4-entry-mxfp4 "python3 ab_layer.py --preset qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b --dtype mxfp4 --m 1 2 --rounds 5 --variant shipped --variant int4-entry=ab_patches:int4_entry --variant mma-g1-own=ab_patches:mma_gemm1_own_route --out $OUT/host/ab-int4-entry-mxfp4.json"
# Candidates for one- and two-token entries: gpt-oss-120b int4 with the group-start scale read (GEMM2 copying its rows)
# and reshaped GEMMs; MXFP4 on the int4 entries' mma shapes, reshaped; per preset and token count.
v() { printf -- "--variant %s " "$1"; }
early_kernel="ab_patches:mma_kernel_from_source,ab_patches:scales_copied"
add ab-entries-gpt-oss-int4 "$group_start python3 ab_layer.py --preset gpt-oss-120b --dtype int4 --m 1 2 --rounds 7 $(v shipped)$(v early-copied=$early_kernel)$(v early-copied-g2=AB_GEMM2=128x6x4,$early_kernel,ab_patches:reshaped)$(v early-copied-g1g2=AB_GEMM1=64x4x4,AB_GEMM2=128x6x4,$early_kernel,ab_patches:reshaped)$(v g2=AB_GEMM2=128x6x4,ab_patches:reshaped)$(v g1g2=AB_GEMM1=64x4x4,AB_GEMM2=128x6x4,ab_patches:reshaped)--out $OUT/host/ab-entries-gpt-oss-int4.json"
add ab-entries-gpt-oss-mxfp4 "python3 ab_layer.py --preset gpt-oss-120b --dtype mxfp4 --m 1 2 --rounds 7 $(v shipped)$(v int4-entry=ab_patches:int4_entry)$(v int4-entry-g1=AB_GEMM1=64x4x4,ab_patches:int4_entry,ab_patches:reshaped)$(v int4-entry-g2=AB_GEMM2=128x6x4,ab_patches:int4_entry,ab_patches:reshaped)$(v int4-entry-g1g2=AB_GEMM1=64x4x4,AB_GEMM2=128x6x4,ab_patches:int4_entry,ab_patches:reshaped)--out $OUT/host/ab-entries-gpt-oss-mxfp4.json"
add ab-entries-qwen3-235b-mxfp4-1 "python3 ab_layer.py --preset qwen3-235b-a22b --dtype mxfp4 --m 1 --rounds 7 $(v shipped)$(v int4-entry=ab_patches:int4_entry)$(v int4-entry-g2-128x4=AB_GEMM2=128x4x4,ab_patches:int4_entry,ab_patches:reshaped)$(v int4-entry-g2-256x4=AB_GEMM2=256x4x8,ab_patches:int4_entry,ab_patches:reshaped)$(v int4-entry-g1-256x8=AB_GEMM1=256x8x8,ab_patches:int4_entry,ab_patches:reshaped)--out $OUT/host/ab-entries-qwen3-235b-mxfp4-1.json"
add ab-entries-qwen3-235b-mxfp4-2 "python3 ab_layer.py --preset qwen3-235b-a22b --dtype mxfp4 --m 2 3 --rounds 7 $(v shipped)$(v mma-g1=ab_patches:mma_gemm1)$(v mma-g1-256x4=AB_GEMM1=256x4x8,ab_patches:mma_gemm1,ab_patches:reshaped)$(v int4-entry=ab_patches:int4_entry)--out $OUT/host/ab-entries-qwen3-235b-mxfp4-2.json"
add ab-entries-qwen3-30b-mxfp4 "python3 ab_layer.py --preset qwen3-30b-a3b --dtype mxfp4 --m 1 --rounds 7 $(v shipped)$(v int4-entry=ab_patches:int4_entry)$(v int4-entry-g1-128x4=AB_GEMM1=128x4x4,ab_patches:int4_entry,ab_patches:reshaped)$(v int4-entry-g2-128x4=AB_GEMM2=128x4x4,ab_patches:int4_entry,ab_patches:reshaped)--out $OUT/host/ab-entries-qwen3-30b-mxfp4.json"
add ab-entries-mixtral-mxfp4 "python3 ab_layer.py --preset mixtral-8x7b deepseek-v3 --dtype mxfp4 --m 1 --rounds 7 $(v shipped)$(v int4-entry=ab_patches:int4_entry)--out $OUT/host/ab-entries-mixtral-mxfp4.json"
# MXFP4's searched decode shapes (benchmarks/results/mxfp4_lender_retune_2026-12-02.md) on int4's entries of the same
# layers, at the token count each key alone serves: qwen3-30b-a3b's one-token GEMM1 in split 2 and GEMM2 on 64 rows in
# split 6; qwen3-235b-a22b's two-token GEMM1 on 128 rows in split 8 (4 warps) and GEMM2 on 128 rows in split 3.
ab_int4="python3 ab_layer.py --dtype int4 --rounds 7 $(v shipped)"
add ab-mxfp4-shapes-on-int4 "$ab_int4 --preset qwen3-30b-a3b --m 1 $(v g1=AB_GEMM1=64x2x4,ab_patches:reshaped)$(v g2=AB_GEMM2=64x6x4,ab_patches:reshaped)$(v g1g2=AB_GEMM1=64x2x4,AB_GEMM2=64x6x4,ab_patches:reshaped)$(v g1g2-copied=AB_GEMM1=64x2x4,AB_GEMM2=64x6x4,ab_patches:reshaped,ab_patches:scales_copied)--out $OUT/host/ab-mxfp4-shapes-on-int4-qwen3-30b.json; $ab_int4 --preset qwen3-235b-a22b --m 2 $(v g1=AB_GEMM1=128x8x4,ab_patches:reshaped)$(v g2=AB_GEMM2=128x3x4,ab_patches:reshaped)$(v g1g2=AB_GEMM1=128x8x4,AB_GEMM2=128x3x4,ab_patches:reshaped)$(v g1g2-copied=AB_GEMM1=128x8x4,AB_GEMM2=128x3x4,ab_patches:reshaped,ab_patches:scales_copied)--out $OUT/host/ab-mxfp4-shapes-on-int4-qwen3-235b.json"
# The same shapes over the token counts the int4 entries serve (1-4), with and without every mma GEMM copying its scale
# rows (the int4 entries load some in the tile): ab-mxfp4-shapes-on-int4 measured the copied pair fastest.
copied="ab_patches:reshaped,ab_patches:scales_copied"
add ab-int4-decode-copied "$ab_int4 --preset qwen3-30b-a3b --m 1 2 3 4 $(v copied=ab_patches:scales_copied)$(v g1g2-copied=AB_GEMM1=64x2x4,AB_GEMM2=64x6x4,$copied)$(v g2-copied=AB_GEMM2=64x6x4,$copied)--out $OUT/host/ab-int4-decode-copied-qwen3-30b.json; $ab_int4 --preset qwen3-235b-a22b --m 1 2 3 4 $(v copied=ab_patches:scales_copied)$(v g1g2-copied=AB_GEMM1=128x8x4,AB_GEMM2=128x3x4,$copied)$(v g1-copied=AB_GEMM1=128x8x4,$copied)--out $OUT/host/ab-int4-decode-copied-qwen3-235b.json"
# And back: int4's new 2-4-token shapes on MXFP4's entries of the same layers, where MXFP4's search did not reach
# (qwen3-235b-a22b at 3-4 tokens, qwen3-30b-a3b at 2-4).
ab_mxfp4="python3 ab_layer.py --dtype mxfp4 --rounds 7 $(v shipped)"
add ab-int4-shapes-on-mxfp4 "$ab_mxfp4 --preset qwen3-235b-a22b --m 2 3 4 $(v g1g2=AB_GEMM1=128x8x4,AB_GEMM2=128x3x4,ab_patches:reshaped)--out $OUT/host/ab-int4-shapes-on-mxfp4-qwen3-235b.json; $ab_mxfp4 --preset qwen3-30b-a3b --m 2 3 4 $(v g1g2=AB_GEMM1=64x2x4,AB_GEMM2=64x6x4,ab_patches:reshaped)$(v g1g2-64x4-128x8=AB_GEMM1=64x4x4,AB_GEMM2=128x8x4,ab_patches:reshaped)--out $OUT/host/ab-int4-shapes-on-mxfp4-qwen3-30b.json"
# qwen3-30b-a3b MXFP4's 8-token entry (5-16 tokens; 0.98x with the factor words at 8 tokens only, where its
# GEMM1's programs, about 594, would be a wave of 528 and a few at four per SM): other tiles, and GEMM1 capped at
# 96 registers (five per SM: one wave).
add ab-q30-mxfp4-8-shapes "$ab_mxfp4 --preset qwen3-30b-a3b --m 5 8 12 $(v g1-64=AB_GEMM1=64x1x4,ab_patches:reshaped)$(v g1-split2=AB_GEMM1=128x2x4,ab_patches:reshaped)$(v g1-cap96=AB_GEMM1=128x1x4x96,ab_patches:reshaped)$(v g2-64=AB_GEMM2=64x1x4,ab_patches:reshaped)--out $OUT/host/ab-q30-mxfp4-8-shapes.json"
# gpt-oss-120b's one-token GEMM1 in one wave: 128 rows in three splits is 540 programs, four per SM at the
# builds' 99-105 registers (a second wave of 12), five under a cap of 96 (docs/design/triton-gemm-quantized.md).
r96="AB_GEMM1=128x3x4x96,ab_patches:reshaped"
add ab-gpt-oss-gemm1-one-wave "python3 ab_layer.py --preset gpt-oss-120b --dtype int4 mxfp4 --m 1 --rounds 7 $(v shipped)$(v g1-128x3=AB_GEMM1=128x3x4,ab_patches:reshaped)$(v g1-128x3-r96=$r96)$(v g1-128x3-r96-own=$r96,ab_patches:own_routed)--out $OUT/host/ab-gpt-oss-gemm1-one-wave.json"
# The same launches traced (each program's start, release and end): whether GEMM1's last programs end sooner.
ow_cells=""
for q in int4 mxfp4; do ow_cells+=" gpt-oss-120b/$q/1 gpt-oss-120b/$q/1/g1-128x3-r96=$r96"; done
add trace-gpt-oss-gemm1-one-wave "python3 trace_decode.py --out $OUT/host/trace-gpt-oss-gemm1-one-wave.json --cells $ow_cells"
# Entries against those they replaced, as copies of the files before them (AB_BEFORE_DIR; here: .carry/before-configs),
# over the token counts each serves.
before="AB_TUNED_DIR=\${AB_BEFORE_DIR:-$ROOT/.carry/before-configs} python3 ab_layer.py --rounds 7 --variant before=ab_patches:tuned_entry --variant shipped"
add ab-entries-replaced "$before --preset gpt-oss-120b --dtype int4 --m 1 2 --out $OUT/host/ab-entries-replaced-gpt-oss-int4.json; $before --preset gpt-oss-120b --dtype mxfp4 --m 1 2 3 4 --out $OUT/host/ab-entries-replaced-gpt-oss-mxfp4.json; $before --preset qwen3-235b-a22b --dtype mxfp4 --m 1 2 3 4 --out $OUT/host/ab-entries-replaced-qwen3-235b.json; $before --preset qwen3-30b-a3b --dtype mxfp4 --m 1 --out $OUT/host/ab-entries-replaced-qwen3-30b.json"
# ab-decode-shapes-replaced: int4's and MXFP4's decode-shape entries (int4_decode_shapes_2026-12-02.md) against
# AB_BEFORE_DIR=.carry/before-configs-int4, the three files before them.
add ab-decode-shapes-replaced "$before --preset qwen3-30b-a3b qwen3-235b-a22b --dtype int4 --m 1 2 3 4 --out $OUT/host/ab-int4-entries-replaced.json; $before --preset qwen3-235b-a22b --dtype mxfp4 --m 2 3 4 --out $OUT/host/ab-mxfp4-entries-replaced.json"
# NCU_CELLS: "PRESET DTYPE M" cells separated by commas.
ncu_cells=${NCU_CELLS:-qwen3-30b-a3b int4 1,gpt-oss-120b int4 1,mixtral-8x7b int4 1,qwen3-30b-a3b int8 1}
add ncu-decode "IFS=, read -ra cells <<< '$ncu_cells'; bash ncu_cells.sh $OUT/host/ncu \"\${cells[@]}\""
# gpt-oss-120b at 8 tokens: int4's 256-row entry (5d28011's), int4 with a 128-row GEMM1, MXFP4's entry.
n128='{"gemm1":{"block_m":16,"block_n":128,"split_k":1,"num_warps":4,"num_stages":3,"swap_ab":true},"gemm2":{"block_m":16,"block_n":256,"split_k":2,"num_warps":4,"num_stages":3,"swap_ab":true,"block_ready":true}}'
add ncu-gpt-oss-8 "bash ncu_cells.sh $OUT/host/ncu 'gpt-oss-120b int4 8' 'gpt-oss-120b int4 8 n128 $n128' 'gpt-oss-120b mxfp4 8'"
add load-checkpoint "python3 bench_load_checkpoint.py --dir /dev/shm/qwen3-30b-a3b-gptq --layers 48 --profile $OUT/e2e/load_checkpoint_profile.txt --out $OUT/e2e"
# The load's host transient (peak - after) does not grow with the layers (the CPU loads: 0.28 GiB at 8
# and 16): 16 layers measure it on the GPU path in a third of the 48-layer job's time.
add load-checkpoint-16 "python3 bench_load_checkpoint.py --dir /dev/shm/qwen3-30b-a3b-gptq-16 --layers 16 --out $OUT/e2e/load-16"
add loaders-fp8 "python3 bench_checkpoint_loaders.py --format fp8 --dir /dev/shm/ckpt-fp8 --layers 16 --out $OUT/e2e/loaders-fp8"
add loaders-mxfp4 "python3 bench_checkpoint_loaders.py --format mxfp4 --dir /dev/shm/ckpt-mxfp4 --layers 24 --out $OUT/e2e/loaders-mxfp4"
# compressed-tensors is not on the GPU image: its wheels go on this job's path only. Fetched here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     -d .carry/ct-wheels compressed-tensors==0.20.0 pydantic==2.14.3 pydantic-core==2.50.4 loguru==0.7.3 \
#     annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
add loaders-ct "python3 -m pip install -q --no-deps --no-index --target /tmp/ct-site $ROOT/.carry/ct-wheels/*.whl && PYTHONPATH=/tmp/ct-site:\$PYTHONPATH python3 bench_checkpoint_loaders.py --format ct-w4a16 --dir /dev/shm/ckpt-ct --layers 16 --out $OUT/e2e/loaders-ct"
add host-profile "python3 bench_host_path.py --out $OUT/host/profile --presets qwen3-30b-a3b --schemes bf16 int4 --tokens 1 64 --profile"
cat "$jobs"
status=0
if [ -n "${EP_TESTS:-}" ]; then
  # Expert parallelism over NCCL needs two GPUs in one process group: run before the one-GPU jobs.
  (cd "$ROOT" && MOE_TEST_REQUIRE_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
    integration/test_expert_parallel_nccl.py) > "$OUT/jobs/ep-nccl-tests.log" 2>&1 || status=1
  echo "ep-nccl-tests: exit $status"; tail -3 "$OUT/jobs/ep-nccl-tests.log"
fi
python3 gpu_jobs.py "$jobs" --out "$OUT/jobs" --deadline-s "${DEADLINE:-540}" || status=1
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for f in sorted((out / "e2e").rglob("*.json")):
    r = json.loads(f.read_text())
    keys = [k for k in r if k.startswith(("prefill", "decode", "logits", "peak", "fuse_peak", "model_gib"))]
    print(f.stem, {k: r[k] for k in keys})
PY
tar czf "$OUT/results.tar.gz" -C "$OUT" jobs host e2e
exit $status
