#!/usr/bin/env bash
# Round 3 of the pretrain-then-fine-tune study (issue 13.4) as one command. The defaults are sized for one GPU and a
# 10-minute limit; the 2-core CPU run recorded in README.md set the knobs below:
#
#   bash results/text/study/run_round3.sh            # DATA=../shared/data RUNS=output/study3 by default
#
# 1. prepare.py: the same splits and the same kind of WordPiece 8,000 vocabulary as round 2 (trained on the
#    pretraining text only).
# 2. Masked-LM pretraining (on PRE_TEXT: WikiText-2 + the unlabelled fit.tsv sentences by default) of the four encoders (4 layers, hidden 256, max length 128) at two learning rates each,
#    all eight runs at once on the one device; each encoder's run is the one with the lowest held-out MLM loss, and
#    fine-tuning starts from its model_best.pth (the checkpoint with the lowest periodic held-out loss).
# 3. Fine-tuning on fit.tsv, pretrained and from scratch (same vocabulary and architecture), at FT_LRS; the LR and
#    checkpoint are chosen on heldout.tsv and dev.tsv is scored once by that checkpoint (--test-file).
#
# Every stage runs under `timeout`, so the script ends inside the device's limit and whatever finished is kept.
# Knobs (environment): WIDTH, PRE_TEXT (file under RUNS/data), PRE_STEPS, PRE_BATCH, PRE_LRS, PRE_LIMIT (seconds for the whole pretraining stage), FT_STEPS,
# FT_LRS, FT_PAR (fine-tuning runs at once), FT_LIMIT, THREADS (per process), AMP (flags for pretraining), PY.
set -u
PY=${PY:-python3}
DATA=${DATA:-../shared/data}
RUNS=${RUNS:-output/study3}
PRE_TEXT=${PRE_TEXT:-pretrain_text.txt}
PRE_STEPS=${PRE_STEPS:-8000}
PRE_BATCH=${PRE_BATCH:-128}
PRE_LRS=${PRE_LRS:-5e-4 1e-3}
PRE_LIMIT=${PRE_LIMIT:-330}
FT_STEPS=${FT_STEPS:-2000}
FT_LRS=${FT_LRS:-3e-5 1e-4 3e-4 1e-3}
FT_PAR=${FT_PAR:-8}
FT_LIMIT=${FT_LIMIT:-200}
THREADS=${THREADS:-2}
AMP=${AMP---amp --amp-dtype bfloat16}  # AMP="" turns it off
export PYTHONUNBUFFERED=1
mkdir -p "$RUNS"

# NAME | registry model | architecture flags: one width W and depth for all four (round 2's ratios: gMLP/aMLP
# d_ffn 6W, aMLP tiny attention W/4, BiGS d_i 3W, BERT d_ffn 4W with 4 heads)
W=${WIDTH:-256}
ARCH="num_hidden_layers=4 hidden_size=$W max_position_embeddings=128"
ENCODERS=(
  "gmlp|gmlp_base|$ARCH intermediate_size=$((6 * W))"
  "amlp|amlp_base|$ARCH intermediate_size=$((6 * W)) tiny_attention_size=$((W / 4))"
  "bigs|bigs_small|$ARCH intermediate_size=$((3 * W))"
  "bert|bert_small|$ARCH intermediate_size=$((4 * W)) num_attention_heads=4"
)

t0=$SECONDS
echo "=== prepare ($(date -u +%H:%M:%S))"
[ -f "$RUNS/data/fit.tsv" ] || $PY results/text/study/prepare.py --data "$DATA" --out "$RUNS/data" || exit 1

echo "=== pretraining on $PRE_TEXT: ${#ENCODERS[@]} encoders x lr {$PRE_LRS}, $PRE_STEPS updates x $PRE_BATCH x 128 tokens"
for enc in "${ENCODERS[@]}"; do
  IFS='|' read -r name model kwargs <<< "$enc"
  for lr in $PRE_LRS; do
    # a run stopped earlier (time limit, SIGTERM) continues from its resumable checkpoint
    resume=""
    [ -f "$RUNS/pre_${name}_lr${lr}/last.pth" ] && resume="--resume $RUNS/pre_${name}_lr${lr}/last.pth"
    timeout "$PRE_LIMIT" $PY -m mlp_vision.text.train --task mlm --model "$model" $resume \
      --model-kwargs $kwargs sparse_prediction=True --tokenizer-from "$RUNS/data/tokenizer" \
      --train-file "$RUNS/data/$PRE_TEXT" --val-file "$RUNS/data/wikitext_val.txt" --block-size 128 \
      --steps "$PRE_STEPS" -b "$PRE_BATCH" --lr "$lr" --opt-betas 0.9 0.98 --opt-eps 1e-6 --weight-decay 0.01 \
      --sched linear --warmup-steps $((PRE_STEPS / 10)) --eval-interval $((PRE_STEPS / 16)) --eval-batches 8 \
      --final-eval-batches 40 --log-interval 200 $AMP --threads "$THREADS" --output "$RUNS" \
      --experiment "pre_${name}_lr${lr}" >> "$RUNS/pre_${name}_lr${lr}.out" 2>&1 &
  done
done
wait
echo "=== pretraining done after $((SECONDS - t0)) s"
for f in "$RUNS"/pre_*.out; do echo "--- $f"; tail -n 2 "$f"; done

# the encoder of each family: the pretraining run with the lowest held-out MLM loss (its best periodic value, so a
# run stopped by the time limit still counts through its model_best.pth)
choose() {
  $PY - "$RUNS" "$1" <<'EOF'
import csv, sys
from pathlib import Path
runs, name = Path(sys.argv[1]), sys.argv[2]
best = None
for run in sorted(runs.glob(f'pre_{name}_lr*')):
    if not (run / 'model_best.pth').exists() or not (run / 'summary.csv').exists():
        continue
    losses = [float(r['val_loss']) for r in csv.DictReader(open(run / 'summary.csv')) if r.get('val_loss')]
    if losses and (best is None or min(losses) < best[0]):
        best = (min(losses), run)
print(best[1] if best else '')
EOF
}

jobs_file="$RUNS/finetune_jobs.txt"
: > "$jobs_file"
# one learning rate after the other (the first in FT_LRS for every encoder first), so that a stage cut by FT_LIMIT
# leaves whole comparisons
for lr in $FT_LRS; do
  for enc in "${ENCODERS[@]}"; do
    IFS='|' read -r name model kwargs <<< "$enc"
    chosen=$(choose "$name")
    echo "=== $name, lr $lr: fine-tuning from ${chosen:-nothing (no pretraining run finished an evaluation)}"
    common="--task classify --train-file $RUNS/data/fit.tsv --val-file $RUNS/data/heldout.tsv \
--test-file $DATA/rt-polarity/dev.tsv --steps $FT_STEPS -b 32 --eval-interval 100 --block-size 64 --lr $lr \
--threads $THREADS --log-interval 200 --output $RUNS"
    [ -n "$chosen" ] && echo "$PY -m mlp_vision.text.train $common --init-from $chosen/model_best.pth \
--experiment ft_${name}_pre_lr${lr}" >> "$jobs_file"
    echo "$PY -m mlp_vision.text.train $common --model $model --model-kwargs $kwargs \
--tokenizer-from $RUNS/data/tokenizer --experiment ft_${name}_scratch_lr${lr}" >> "$jobs_file"
  done
done
echo "=== fine-tuning: $(wc -l < "$jobs_file") runs, $FT_PAR at once"
# each job logs to RUNS/<experiment>.out
timeout "$FT_LIMIT" xargs -P "$FT_PAR" -I CMD sh -c 'exp=$(echo "CMD" | sed "s/.*--experiment //"); CMD > '"$RUNS"'/$exp.out 2>&1' \
  < "$jobs_file"
echo "=== fine-tuning done after $((SECONDS - t0)) s"
for f in "$RUNS"/ft_*.out; do printf '%s: ' "$(basename "$f" .out)"; grep -ho 'best dev acc [0-9.]*%\|test (.*' "$f" | tr '\n' ' '; echo; done
