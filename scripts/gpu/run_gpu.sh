#!/usr/bin/env bash
# GPU checks of issues 3 (train.py / validate.py on CUDA) and 6 (benchmark table on GPU), run on a lent
# single-GPU machine. Usage, from the repo root:
#
#   bash scripts/gpu/run_gpu.sh train   # imagenette-mini: AMP + channels_last + compile, then validate.py
#   bash scripts/gpu/run_gpu.sh ddp     # imagenette-mini: 2-rank DDP (two one-GPU "nodes" on the one GPU)
#   bash scripts/gpu/run_gpu.sh bench   # benchmark.py pairs: bf16 autocast + channels_last (+ compile)
#   bash scripts/gpu/run_gpu.sh text    # benchmark.py BiGS / BERT layers
#   bash scripts/gpu/run_gpu.sh peers_smlpnet peers_gmlp peers_mixer   # issue 25 item 3: compiled training steps
#                                       # of ours vs timm's same model and vs the peers a user would pick instead
#                                       # (ConvNeXt-T / Swin-T, ViT-S, ViT-B), each pair in one process, profiled
#   bash scripts/gpu/run_gpu.sh bigs_models  # issue 26: BiGS conv routes vs length (auto's crossovers), 12-layer
#                                         # BiGS vs BERT (flash attention) training tokens/s at 1K-16K tokens, the
#                                         # longest sequence each fits at batch 1, the text trainer eager vs compiled
#   bash scripts/gpu/run_gpu.sh longconv  # the Triton long convolution of BiGS (issue 15 item 2): CUDA results vs
#                                         # float64, tile sweep, kernel vs FFT route vs attention, BiGS vs BERT layers
#   bash scripts/gpu/run_gpu.sh token_pad token_pad_models  # issue 34 item 1: the SGU / Mixer token GEMMs with the
#                                         # token axis zero-padded to a multiple of 1 / 8 / 16 (bf16): the GEMM alone,
#                                         # the layers eager and compiled (token_pad, ~4 min), then gMLP-S and
#                                         # Mixer-B compiled training steps (token_pad_models, ~7 min); choose the
#                                         # default token_multiple from these
#
# Issue 34 item 5: parts that each fit one 15-minute lease (a machine start costs 1-2 minutes), in order of value;
# each part's steps sum to at most 480 s including compiles. Run one per lease with scripts/gpu/lease.sh, which
# also writes the table rows (scripts/gpu/speed_rows.py) and packs the outputs:
#   a_gmlp          gmlp_s vs vit_small_patch16_224 and vs timm's gmlp_s16_224 (compiled training step, profiled)
#   b_smlpnet       smlpnet_t vs convnext_tiny (compiled training step, profiled)
#   c_mixer         mixer_b16 vs vit_base_patch16_224 and vs timm's mixer_b16_224 (% of the matmul rate, profiled)
#   d_bigs_layer    the BiGS-large layer (conv_impl auto) vs the flash-attention BERT-large layer at 4K / 16K tokens
#   e_bigs_model    12-layer BiGS vs 12-layer BERT training tokens/s at 1K-16K, and the longest sequence at batch 1
#   f_text_trainer  the text trainer's blocks/s (trainer_state.json), eager vs --torchcompile
#   g_bigs_layer_compiled  d_bigs_layer in the goals' mode: both layers compiled (training step, step memory)
#   h_bigs_linear   issue 42 item 5: the BiGS-large layer (conv_impl auto = the linear-time chunked route from ~3.3K
#                   tokens) vs the flash-attention BERT-large layer at 4K / 16K / 64K tokens, eager, and at 64K
#                   compiled: training step, step memory, top kernels
#   j_vision_variants  issue 45 items 3 and 5: every layout variant of gMLP-S (split_fc1, token_major) vs timm's
#                   gMLP-S and ViT-S, of sMLPNet-T (one_gemm_mixes) vs ConvNeXt-T, and Mixer-B vs timm's Mixer-B,
#                   compiled bf16 channels_last training steps alternating in one process per group, % of the
#                   matmul rate, top kernels (scripts/gpu/vision_variants.py); the fastest variant becomes the default
#   i_bigs_linear_more  issue 42 item 5, the rest: that pair compiled at 16K (4K compiled: g_bigs_layer_compiled),
#                   the longest sequence the 12-layer BiGS (and BERT) trains at batch 1, and the routes (direct / fft
#                   / triton / chunked, BERT beside) at 2K / 4K / 16K: where auto switches from Triton to chunked
#                   Issue 42's goals for these two (bf16, training step): BiGS-large layer >= 1.4x BERT-large + flash
#                   attention at 4K, >= 3x at 16K, >= 8x at 64K, memory per token <= BERT's; the 12-layer BiGS
#                   trains at 4x the length BERT fits at batch 1
# DRY=1 prints each step (name, limit, command) instead of running it (tests/test_gpu_scripts.py checks the plan).
#
# Several parts in one call: bash scripts/gpu/run_gpu.sh bench text
#
# Environment: DATA (imagenette-mini folder holding train.tar / val.tar; default ../shared/data/imagenette-mini),
# WORK (output folder; default output/gpu), PY (python; default python3). Every step runs under `timeout` so
# that one stuck step cannot eat the whole run, and every step's output lands in WORK. The committed results
# (results/gpu/README.md) are these commands' outputs; results/benchmarks/gpu_h100_* are WORK/bench/gpu_*.
# torch.compile costs minutes per deep model and mode (inductor compiled sMLPNet-T's training graph in 3.5 min
# on the H100 machine's 16 cores), so only the compiled sMLPNet-T inference pair is in `bench`.
set -u
[ $# -gt 0 ] || { echo 'usage: run_gpu.sh a_gmlp|b_smlpnet|c_mixer|d_bigs_layer|e_bigs_model|f_text_trainer|g_bigs_layer_compiled|h_bigs_linear|i_bigs_linear_more|j_vision_variants|train|ddp|bench|text|longconv|bigs_models|peers_smlpnet|peers_gmlp|peers_mixer|token_pad|token_pad_models ...'; exit 2; }
PY=${PY:-python3}
DATA=${DATA:-../shared/data/imagenette-mini}
WORK=${WORK:-output/gpu}
export PYTHONUNBUFFERED=1
mkdir -p "$WORK"

step() {  # step NAME SECONDS CMD...: run CMD with a time limit, log to WORK/NAME.log, report its exit status
    local name=$1 secs=$2; shift 2
    if [ -n "${DRY:-}" ]; then printf 'STEP\t%s\t%s\t' "$name" "$secs"; printf '%q ' "$@"; echo; return 0; fi
    echo "=== $name ($(date -u +%H:%M:%S), limit ${secs}s): $*"
    local t0=$SECONDS
    timeout "$secs" "$@" > "$WORK/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0))s"
    tail -n 4 "$WORK/$name.log"
}

text_trainer_pair() {  # NAME SECONDS STEPS: the text trainer on the study's BiGS encoder (4 x 256, 128 tokens,
    # batch 128, sparse prediction), bf16 autocast, eager then --torchcompile: blocks/s of 128 tokens from each run's
    # checkpoint-STEPS/trainer_state.json (train_samples_per_second)
    local name=$1 secs=$2 steps=$3 text=${TEXT:-../shared/data/tinyshakespeare/input.txt} mode flag
    for mode in eager compiled; do
        flag=(); [ "$mode" = compiled ] && flag=(--torchcompile)
        step "${name}_$mode" "$secs" $PY -m mlp_vision.train_text --task mlm --model bigs_small --model-kwargs \
            num_hidden_layers=4 hidden_size=256 intermediate_size=768 max_position_embeddings=128 \
            sparse_prediction=True --tokenizer char --train-file "$text" --block-size 128 -b 128 --steps "$steps" \
            --eval-interval "$steps" --amp --amp-dtype bfloat16 "${flag[@]}" \
            --output "$WORK/text_trainer" --experiment "bigs_4x256_$mode"
    done
}

for part in "$@"; do
[ -n "${DRY:-}" ] || {
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    $PY -c 'import torch, timm; print("torch", torch.__version__, "cuda", torch.version.cuda, "timm", timm.__version__,
"gpu", torch.cuda.get_device_name(0))'
} > "$WORK/env_$part.txt" 2>&1
[ -n "${DRY:-}" ] || cat "$WORK/env_$part.txt"

case $part in
train)
    # sMLPNet-T at its real 224x224 resolution, bf16 autocast, channels_last, torch.compile (inductor). The
    # validation batch divides the 1,000 validation images, so no smaller last batch triggers a recompile.
    common=(-c configs/imagenette_mini_cpu.yaml --data-dir "$DATA" --model smlpnet_t --img-size 224
            --amp --amp-dtype bfloat16 --channels-last --workers 12 --log-interval 10 --output "$WORK" -vb 200)
    step train_smlpnet_t "${TRAIN_LIMIT:-420}" $PY train.py "${common[@]}" -b 128 --lr 2e-3 \
        --epochs "${EPOCHS:-8}" --torchcompile --experiment smlpnet_t-224-amp-cl-compile
    step validate_smlpnet_t 90 $PY validate.py --model smlpnet_t --data-dir "$DATA" --split val.tar -b 200 \
        --checkpoint "$WORK/smlpnet_t-224-amp-cl-compile/model_best.pth" --amp --amp-dtype bfloat16 \
        --channels-last --workers 12 --results-file "$WORK/smlpnet_t-224-amp-cl-compile/validate_best.json"
    ;;
ddp)
    # Two DDP ranks on the one GPU, started the way two single-GPU nodes are (torchrun --nnodes 2, one process
    # each, rendezvous at 127.0.0.1). NCCL refuses two ranks on one device, so these two use gloo (which reduces
    # CUDA tensors through the host); with one GPU per rank the same command runs NCCL (the default backend).
    common=(-c configs/imagenette_mini_cpu.yaml --data-dir "$DATA" --model smlpnet_t --img-size 224
            --amp --amp-dtype bfloat16 --channels-last --log-interval 10 --output "$WORK")
    for r in 0 1; do
        timeout 120 $PY -m torch.distributed.run --nnodes 2 --nproc_per_node 1 --node_rank $r \
            --master_addr 127.0.0.1 --master_port 29533 train.py "${common[@]}" -b 64 --epochs 3 \
            --dist-backend gloo --workers 4 --experiment smlpnet_t-224-ddp2-gloo-cuda > "$WORK/ddp_rank$r.log" 2>&1 &
    done
    wait
    echo "=== ddp: $(grep -h 'ranks_agree' "$WORK"/smlpnet_t-224-ddp2-gloo-cuda/results.json)"
    tail -n 3 "$WORK"/ddp_rank0.log
    ;;
bench)
    # eager bf16 autocast + channels_last, both modes, every pair; then torch.compile where the compile time
    # fits the lease (inductor takes minutes per deep model and mode)
    flags=(--device cuda --precision amp_bf16 --channels-last --samples 10 --min-sample-time 0.3 --warmup 3)
    step bench_smlpnet_t 180 $PY benchmark.py --compare smlpnet_t ref:smlpnet_t -b 256 --bench both "${flags[@]}" \
        --samples 6 --out "$WORK/bench/gpu_smlpnet_t" --title "GPU, eager: sMLPNet-T vs the straightforward sMLPNet"
    step bench_gmlp_s 90 $PY benchmark.py --compare gmlp_s gmlp_s16_224 -b 256 --bench both "${flags[@]}" \
        --out "$WORK/bench/gpu_gmlp_s" --title "GPU, eager: gMLP-S vs timm gmlp_s16_224"
    step bench_mixer_b16 90 $PY benchmark.py --compare mixer_b16 mixer_b16_224 -b 128 --bench both "${flags[@]}" \
        --out "$WORK/bench/gpu_mixer_b16" --title "GPU, eager: Mixer-B/16 vs timm mixer_b16_224"
    step bench_smlpnet_t_compile 240 $PY benchmark.py --compare smlpnet_t ref:smlpnet_t -b 256 --bench inference \
        --compile --no-memory "${flags[@]}" --out "$WORK/bench/gpu_smlpnet_t_compile" \
        --title "GPU, torch.compile: sMLPNet-T vs the straightforward sMLPNet"
    ;;
text)
    flags=(--device cuda --precision amp_bf16 --bench both --samples 10 --min-sample-time 0.3 --warmup 3)
    step bench_bigs_vs_bert_4096 90 $PY benchmark.py --compare bigs_layer bert_layer --seq-len 4096 -b 8 \
        "${flags[@]}" --out "$WORK/bench/gpu_bigs_vs_bert_4096" --title "GPU, eager: BiGS layer vs BERT layer, 4096 tokens"
    step bench_bigs_layer_128 180 $PY benchmark.py --compare bigs_layer ref:bigs_layer --seq-len 128 -b 64 \
        "${flags[@]}" --out "$WORK/bench/gpu_bigs_layer_128" --title "GPU, eager: BiGS layer vs straightforward, 128 tokens"
    ;;
peers_smlpnet|peers_gmlp|peers_mixer)
    # bf16 autocast, channels_last, torch.compile on both sides, training step at a batch that fills the GPU; the
    # pairs alternate in one process (wall-clock ratios) and --profile writes the top kernels of each side.
    # Two architectures share no weights (speed only). Compile time is logged per contender by benchmark.py.
    flags=(--device cuda --precision amp_bf16 --channels-last --compile --bench train --samples 6
           --min-sample-time 0.3 --warmup 3 --profile --no-memory)
    case $part in
    peers_smlpnet) pairs=("smlpnet_t ref:smlpnet_t 256" "smlpnet_t convnext_tiny 256"
                          "smlpnet_t swin_tiny_patch4_window7_224 256") ;;
    peers_gmlp) pairs=("gmlp_s gmlp_s16_224 256" "gmlp_s vit_small_patch16_224 256") ;;
    peers_mixer) pairs=("mixer_b16 mixer_b16_224 128" "mixer_b16 vit_base_patch16_224 128") ;;
    esac
    for pair in "${pairs[@]}"; do
        read -r a b batch <<< "$pair"
        step "${part}_${b//:/_}" "${PEER_LIMIT:-540}" $PY benchmark.py --compare "$a" "$b" -b "$batch" "${flags[@]}" \
            --out "$WORK/bench/gpu_compiled_train_${a}_vs_${b//:/_}" \
            --title "GPU, torch.compile, training step: $a vs $b"
    done
    ;;
bigs_models)
    tm=(scripts/gpu/text_models.py --device cuda --precision amp_bf16)
    # 1. item 1: the BiGS-large layer's routes (direct / fft / triton) from 256 to 16,384 tokens, 32K tokens a step:
    #    where conv_impl='auto' should switch on CUDA
    step bigs_routes 240 $PY "${tm[@]}" routes --hidden 1024 --seq-lens 256 512 1024 2048 4096 8192 16384 \
        --out "$WORK/bench/gpu_bigs_routes"
    # 2. item 3: 12-layer BiGS vs 12-layer BERT (hidden 768, SDPA = flash attention), training step, paired
    for impl in triton auto; do
        step "bigs_vs_bert_model_$impl" 300 $PY "${tm[@]}" pair --conv-impl "$impl" --seq-lens 1024 4096 16384 \
            --out "$WORK/bench/gpu_bigs12_vs_bert12_train_$impl"
    done
    # 3. item 3: the longest sequence each trains on at batch 1 (BiGS with the Triton route)
    step bigs_vs_bert_longest 420 $PY "${tm[@]}" longest --conv-impl triton --start-len 4096 --granularity 2048 \
        --out "$WORK/bench/gpu_bigs12_vs_bert12_longest"
    # 4. item 4: the text trainer on the study's BiGS encoder (4 x 256, 128 tokens, batch 128, sparse prediction),
    #    bf16 autocast, eager vs --torchcompile: blocks/s from each run's trainer_state.json
    text_trainer_pair text_trainer 240 600
    ;;
longconv)
    # 1. the compiled kernels' results on CUDA vs the float64 dense-Toeplitz reference (fp32 / bf16 / fp16, gated or
    #    not, forward and all gradients, L up to 4,096); the first call also JIT-compiles every variant
    step longconv_check 240 $PY scripts/gpu/longconv_check.py check
    # 2. tile sizes (block_l x block_c) at 4,096 tokens, d 1,024, batch 8: forward and training-step TFLOP/s
    step longconv_sweep_4096 180 $PY scripts/gpu/longconv_check.py sweep --seq-len 4096 --batch 8 \
        --out "$WORK/bench/gpu_longconv_sweep_4096"
    # 3. the convolution alone (tiles LONGCONV_BLOCK_L x LONGCONV_BLOCK_C, default 128 x 128; set them from step 2)
    #    vs the layer's FFT route and vs the attention core of the BERT layer, 32K tokens per step, with memory
    tiles=(--block-l "${LONGCONV_BLOCK_L:-128}" --block-c "${LONGCONV_BLOCK_C:-128}")
    step longconv_bench_4096 150 $PY scripts/gpu/longconv_check.py bench --seq-len 4096 --batch 8 "${tiles[@]}" \
        --out "$WORK/bench/gpu_longconv_4096"
    step longconv_bench_16384 240 $PY scripts/gpu/longconv_check.py bench --seq-len 16384 --batch 2 "${tiles[@]}" \
        --out "$WORK/bench/gpu_longconv_16384"
    # 4. the issue's goal: BiGS layer with the Triton route vs BERT-large with flash attention, inference and
    #    training step, step memory (per token: step_mem_mb / tokens per step). The layer runs the route with
    #    conv_impl='triton', selected by benchmark.py --bigs-conv-impl triton (BIGS_CONV_FLAG overrides the flag)
    conv_flag=(${BIGS_CONV_FLAG:---bigs-conv-impl triton})
    if $PY benchmark.py --help 2>/dev/null | grep -q -- "${conv_flag[0]}"; then
        flags=(--device cuda --precision amp_bf16 --bench both --samples 10 --min-sample-time 0.3 --warmup 3)
        step bench_bigs_triton_vs_bert_4096 180 $PY benchmark.py --compare bigs_layer bert_layer --seq-len 4096 -b 8 \
            "${conv_flag[@]}" "${flags[@]}" --out "$WORK/bench/gpu_bigs_triton_vs_bert_4096" \
            --title "GPU, eager: BiGS layer (Triton long convolution) vs BERT layer, 4096 tokens"
        step bench_bigs_triton_vs_bert_16384 300 $PY benchmark.py --compare bigs_layer bert_layer --seq-len 16384 \
            -b 2 "${conv_flag[@]}" "${flags[@]}" --out "$WORK/bench/gpu_bigs_triton_vs_bert_16384" \
            --title "GPU, eager: BiGS layer (Triton long convolution) vs BERT layer, 16384 tokens"
    else
        echo "=== bench_bigs_triton_vs_bert: skipped, benchmark.py has no ${conv_flag[0]} option yet"
    fi
    ;;
a_gmlp|b_smlpnet|c_mixer)
    # compiled training step, bf16 autocast, channels_last, at a batch that fills the GPU; each pair alternates in
    # one process (one process for the part: inductor's caches are warm for the second compile of our model)
    flags=(--device cuda --precision amp_bf16 --channels-last --compile --bench train --samples 6
           --min-sample-time 0.3 --warmup 3 --profile --no-memory)
    case $part in
    a_gmlp) pairs=(--compare gmlp_s vit_small_patch16_224 --compare gmlp_s gmlp_s16_224); batch=256 ;;
    b_smlpnet) pairs=(--compare smlpnet_t convnext_tiny); batch=256 ;;
    c_mixer) pairs=(--compare mixer_b16 vit_base_patch16_224 --compare mixer_b16 mixer_b16_224); batch=128 ;;
    esac
    step "$part" 470 $PY benchmark.py "${pairs[@]}" -b "$batch" "${flags[@]}" --out "$WORK/bench/$part" \
        --title "GPU, torch.compile, training step ($part)"
    ;;
d_bigs_layer)
    # eager, bf16 autocast, training step and inference, step memory; BiGS takes the route conv_impl='auto' takes
    flags=(--device cuda --precision amp_bf16 --bench both --samples 8 --min-sample-time 0.3 --warmup 3
           --bigs-conv-impl auto --profile)  # the layers at their large sizes (benchmark.py defaults)
    step d_bigs_layer_4096 200 $PY benchmark.py --compare bigs_layer bert_layer --seq-len 4096 -b 8 "${flags[@]}" \
        --out "$WORK/bench/d_bigs_layer_4096" --title "GPU, eager: BiGS-large layer vs BERT-large layer, 4096 tokens"
    step d_bigs_layer_16384 270 $PY benchmark.py --compare bigs_layer bert_layer --seq-len 16384 -b 2 "${flags[@]}" \
        --out "$WORK/bench/d_bigs_layer_16384" --title "GPU, eager: BiGS-large layer vs BERT-large layer, 16384 tokens"
    ;;
e_bigs_model)
    tm=(scripts/gpu/text_models.py --device cuda --precision amp_bf16 --conv-impl auto)
    step e_bigs12_vs_bert12_train 270 $PY "${tm[@]}" pair --seq-lens 1024 4096 16384 --profile \
        --out "$WORK/bench/e_bigs12_vs_bert12_train"
    step e_bigs12_vs_bert12_longest 200 $PY "${tm[@]}" longest --start-len 4096 --granularity 4096 \
        --out "$WORK/bench/e_bigs12_vs_bert12_longest"
    ;;
f_text_trainer)
    text_trainer_pair f_text_trainer 205 400
    # the top kernels of the study's encoder size (4 x 256, d_i 768, 128 tokens, batch 128; BERT of that size beside)
    step f_text_trainer_profile 60 $PY scripts/gpu/text_models.py --device cuda --precision amp_bf16 --conv-impl auto \
        pair --layers 4 --hidden 256 --seq-lens 128 --batch-tokens 16384 --samples 2 --warmup 1 --profile \
        --out "$WORK/bench/f_text_trainer_profile"
    ;;
g_bigs_layer_compiled)
    # the goals' mode: torch.compile of both layers, training step, bf16 autocast, step memory (its child process
    # compiles too); the Triton convolution is a custom op, an extern call in BiGS's compiled graph
    flags=(--device cuda --precision amp_bf16 --compile --bench train --samples 6 --min-sample-time 0.3 --warmup 3
           --bigs-conv-impl auto --profile)
    for len_batch in 4096:8 16384:2; do
        seq=${len_batch%%:*}
        step "g_bigs_layer_compiled_$seq" 240 $PY benchmark.py --compare bigs_layer bert_layer --seq-len "$seq" \
            -b "${len_batch##*:}" "${flags[@]}" --out "$WORK/bench/g_bigs_layer_compiled_$seq" \
            --title "GPU, torch.compile: BiGS-large layer vs BERT-large layer, $seq tokens"
    done
    ;;
h_bigs_linear|i_bigs_linear_more)
    # issue 42 item 5: BiGS in linear time. bf16 autocast, training step, step memory (a child process per layer;
    # compiled runs compile there too), top kernels; conv_impl auto takes the chunked route at these lengths. The
    # layers at their large sizes (benchmark.py defaults: d 1,024, BiGS d_i 3,072, BERT 16 heads, FFN 4,096)
    flags=(--device cuda --precision amp_bf16 --bench train --min-sample-time 0.3 --warmup 3 --bigs-conv-impl auto
           --profile)
    layer_pair() {  # NAME SECONDS SEQ BATCH [--compile]: the BiGS-large layer vs the BERT-large layer
        local name=$1 secs=$2 seq=$3 batch=$4 mode=eager samples=8; shift 4
        [ $# -gt 0 ] && { mode=torch.compile; samples=6; }
        step "$name" "$secs" $PY benchmark.py --compare bigs_layer bert_layer --seq-len "$seq" -b "$batch" \
            "${flags[@]}" --samples "$samples" "$@" --out "$WORK/bench/$name" \
            --title "GPU, $mode, training step: BiGS-large layer (conv_impl auto) vs BERT-large layer, $seq tokens"
    }
    if [ "$part" = h_bigs_linear ]; then
        # eager at 4K / 16K / 64K tokens (32K / 32K / 64K tokens a step), then the 64K pair compiled (its compiles
        # dominate: both layers here and again in the memory probes' children)
        layer_pair h_bigs_linear_4096 80 4096 8
        layer_pair h_bigs_linear_16384 80 16384 2
        layer_pair h_bigs_linear_65536 100 65536 1
        layer_pair h_bigs_linear_compiled_65536 220 65536 1 --compile
    else
        layer_pair i_bigs_linear_more_compiled_16384 200 16384 2 --compile
        # the 12-layer models (text_models.py defaults: 12 layers, hidden 768, BiGS d_i 2,304, BERT FFN 3,072; search
        # capped at --max-len, default 2^20 tokens): doubling from 16K, then bisection to 16K tokens, BiGS first
        # (its row is in the log even if BERT's search, whose steps grow as L^2, runs out of time)
        step i_bigs_linear_more_longest 200 $PY scripts/gpu/text_models.py --device cuda --precision amp_bf16 \
            --conv-impl auto longest --start-len 16384 --granularity 16384 --out "$WORK/bench/i_bigs_linear_more_longest"
        # the BiGS-large layer's routes (direct up to 8K, fft, triton, chunked) and the BERT layer of that width,
        # 32K tokens a step, time and memory per token: where auto's Triton -> chunked switch (~3.3K) belongs
        step i_bigs_linear_more_routes 80 $PY scripts/gpu/text_models.py --device cuda --precision amp_bf16 routes \
            --hidden 1024 --seq-lens 2048 4096 16384 --out "$WORK/bench/i_bigs_linear_more_routes"
    fi
    ;;
j_vision_variants)
    # batch 128, few steps, regional compilation (each block once per shape; the whole-model compile of sMLPNet-T
    # alone took 3.5 min on the H100 machine); a group per process and step, so that a slow group costs only itself
    vv=(scripts/gpu/vision_variants.py --device cuda --precision bf16 --batch 128 --samples 5 --iters 5 --warmup 2
        --profile)
    step j_vision_variants_gmlp 230 $PY "${vv[@]}" --groups gmlp --out "$WORK/bench/j_vision_variants_gmlp"
    step j_vision_variants_smlp 150 $PY "${vv[@]}" --groups smlp --out "$WORK/bench/j_vision_variants_smlp"
    step j_vision_variants_mixer 100 $PY "${vv[@]}" --groups mixer --out "$WORK/bench/j_vision_variants_mixer"
    ;;
token_pad)
    # the SGU token GEMM of gMLP-S (batch 256, 768 gated channels, 196 tokens) alone: unpadded, the contracted axis
    # padded (what the modules do) and both axes padded; then the SGU and Mixer-B's token MLP, eager and compiled
    tp=(scripts/gpu/token_padding.py --device cuda --precision bf16 --multiples 1 8 16)
    step token_pad_gemm 60 $PY "${tp[@]}" gemm --out "$WORK/bench/gpu_token_pad_gemm"
    step token_pad_layers 60 $PY "${tp[@]}" layers --out "$WORK/bench/gpu_token_pad_layers"
    step token_pad_layers_compiled 120 $PY "${tp[@]}" layers --compile --out "$WORK/bench/gpu_token_pad_layers_compiled"
    ;;
token_pad_models)
    # compiled training steps (forward, loss, backward) of gMLP-S (b 256) and Mixer-B/16 (b 128) with every
    # module's token_multiple 1 / 8 / 16 (one graph each), alternating in one process, same weights
    tp=(scripts/gpu/token_padding.py --device cuda --precision bf16 --multiples 1 8 16 models --compile --samples 5)
    step token_pad_gmlp_s 270 $PY "${tp[@]}" --models gmlp_s --batch 256 --out "$WORK/bench/gpu_token_pad_gmlp_s"
    step token_pad_mixer_b16 200 $PY "${tp[@]}" --models mixer_b16 --batch 128 --out "$WORK/bench/gpu_token_pad_mixer_b16"
    ;;
*)
    echo "unknown part $part (a_gmlp|b_smlpnet|c_mixer|d_bigs_layer|e_bigs_model|f_text_trainer|g_bigs_layer_compiled|h_bigs_linear|i_bigs_linear_more|j_vision_variants|train|ddp|bench|text|"\
"longconv|bigs_models|peers_smlpnet|peers_gmlp|peers_mixer|token_pad|token_pad_models)"; exit 2 ;;
esac
done
