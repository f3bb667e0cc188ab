#!/usr/bin/env bash
# NOTE: this script drives the text trainer as it was before it moved onto transformers.Trainer (last.pth /
# model_best.pth, --eval-batches, results.json / summary.csv, CONTINUE_FROM into a new folder), the trainer that
# recorded rounds 3 to 6; it does not run with today's trainer (README, "What changed") until it is updated.
# One round of the pretrain-then-fine-tune study (issue 13.4) as one command (rounds 3 to 6). The defaults are sized
# for one GPU and a 10-minute limit; the 2-core CPU runs recorded in round3/ to round6/README.md set the
# knobs below:
#
#   bash scripts/text_study/run_study.sh            # DATA=../shared/data RUNS=output/study by default
#
# 1. prepare.py (PREPARE_FLAGS): the splits of rounds 2-4 and one WordPiece 8,000 vocabulary.
# 2. Masked-LM pretraining (on PRE_TEXT: WikiText-2 + the unlabelled fit.tsv sentences by default) of the four encoders
#    (4 layers, hidden WIDTH, max length 128) at PRE_LRS (PRE_LRS_GMLP, ... for one encoder), all runs at once on the
#    one device; each encoder's run is the one with the lowest held-out MLM loss, and fine-tuning starts from its
#    model_best.pth (the checkpoint with the lowest periodic held-out loss).
# 3. Fine-tuning on fit.tsv, pretrained and from scratch (same vocabulary and architecture), at FT_LRS; the LR and
#    checkpoint are chosen on heldout.tsv and dev.tsv is scored once by that checkpoint (--test-file).
#
# Every stage runs under `timeout`, so the script ends inside the device's limit and whatever finished is kept; a
# pretraining run stopped by it continues from its last.pth when the script runs again.
# Knobs (environment): WIDTH, PREPARE_FLAGS, PRE_TEXT (file under RUNS/data), PRE_STEPS, PRE_BATCH, PRE_LRS,
# PRE_LRS_<NAME>, PRE_LIMIT (seconds for the whole pretraining stage), FT_STEPS, FT_LRS, FT_PAR (fine-tuning runs at
# once), FT_LIMIT, FT_KWARGS (config fields) / FT_FLAGS (trainer flags) of both fine-tuning arms, THREADS (per
# process), AMP (flags for pretraining), DROPOUT, ENCODER_NAMES (a subset of
# "gmlp amlp bigs bert"), STAGES ("pretrain finetune", or one of them), PY, CONTINUE_FROM (an earlier round's RUNS:
# each pretraining run without a last.pth in RUNS continues that round's run of the same name from its last.pth,
# up to PRE_STEPS updates in all, writing into RUNS; that round's folder is only read).
set -u
PY=${PY:-python3}
DATA=${DATA:-../shared/data}
RUNS=${RUNS:-output/study}
PREPARE_FLAGS=${PREPARE_FLAGS:-}
PRE_TEXT=${PRE_TEXT:-pretrain_text.txt}
PRE_STEPS=${PRE_STEPS:-8000}
PRE_BATCH=${PRE_BATCH:-128}
PRE_LRS=${PRE_LRS-5e-4 1e-3}
PRE_LIMIT=${PRE_LIMIT:-330}
FT_STEPS=${FT_STEPS:-2000}
FT_LRS=${FT_LRS-3e-5 1e-4 3e-4 1e-3}
FT_PAR=${FT_PAR:-8}
FT_LIMIT=${FT_LIMIT:-200}
FT_KWARGS=${FT_KWARGS:-}   # config fields for both fine-tuning arms, e.g. classifier_pooling=mean
FT_FLAGS=${FT_FLAGS:-}     # trainer flags for both fine-tuning arms, e.g. --model-ema --model-ema-decay 0.995
FT_SEEDS=${FT_SEEDS-42}   # fine-tuning seeds (init of new weights, dropout, data order); 42 keeps the old run names
FT_ARMS=${FT_ARMS:-pre scratch}  # "scratch" alone can run while the encoders are still pretraining
THREADS=${THREADS:-2}
AMP=${AMP---amp --amp-dtype bfloat16}  # AMP="" turns it off
export PYTHONUNBUFFERED=1
# a list set to nothing (e.g. from a selection that found nothing) stops here instead of running the defaults
for var in PRE_LRS FT_LRS FT_SEEDS; do
  [ -n "${!var// /}" ] || { echo "run_study.sh: $var is empty; give at least one value" >&2; exit 2; }
done
mkdir -p "$RUNS"

# NAME | registry model | architecture flags: one width W and depth for all four (round 2's ratios: gMLP/aMLP
# d_ffn 6W, aMLP tiny attention W/4, BiGS d_i 3W, BERT d_ffn 4W with 4 heads)
W=${WIDTH:-256}
ARCH="num_hidden_layers=4 hidden_size=$W max_position_embeddings=128"
# DROPOUT (empty: each family's default) sets every dropout inside the encoder, in pretraining and in the scratch
# arm alike (the classifier's own dropout stays the family default)
DROP=""
[ -n "${DROPOUT:-}" ] && DROP="hidden_dropout_prob=$DROPOUT"
ENCODERS=(
  "gmlp|gmlp_base|$ARCH intermediate_size=$((6 * W)) $DROP"
  "amlp|amlp_base|$ARCH intermediate_size=$((6 * W)) tiny_attention_size=$((W / 4)) $DROP"
  "bigs|bigs_small|$ARCH intermediate_size=$((3 * W)) $DROP"
  "bert|bert_small|$ARCH intermediate_size=$((4 * W)) num_attention_heads=4 $DROP${DROP:+ attention_probs_dropout_prob=$DROPOUT}"
)
ENCODER_NAMES=${ENCODER_NAMES:-gmlp amlp bigs bert}
selected=()
for enc in "${ENCODERS[@]}"; do [[ " $ENCODER_NAMES " == *" ${enc%%|*} "* ]] && selected+=("$enc"); done
ENCODERS=("${selected[@]}")
STAGES=${STAGES:-pretrain finetune}

t0=$SECONDS
echo "=== prepare ($(date -u +%H:%M:%S))"
[ -f "$RUNS/data/fit.tsv" ] || $PY scripts/text_study/prepare.py --data "$DATA" --out "$RUNS/data" $PREPARE_FLAGS || exit 1

if [[ " $STAGES " == *" pretrain "* ]]; then
# CONTINUE_FROM must hold every run to continue before any starts (not one run started and the next refused)
for enc in "${ENCODERS[@]}"; do
  name=${enc%%|*} lrs_var="PRE_LRS_${enc%%|*}"; lrs_var=${lrs_var^^}
  for lr in ${!lrs_var:-$PRE_LRS}; do
    [ -n "${CONTINUE_FROM:-}" ] && [ ! -f "$RUNS/pre_${name}_lr${lr}/last.pth" ] && \
      [ ! -f "$CONTINUE_FROM/pre_${name}_lr${lr}/last.pth" ] && {
        echo "run_study.sh: CONTINUE_FROM=$CONTINUE_FROM has no pre_${name}_lr${lr}/last.pth to continue" >&2; exit 2; }
  done
done
echo "=== pretraining on $PRE_TEXT: ${#ENCODERS[@]} encoders x lr {$PRE_LRS}, $PRE_STEPS updates x $PRE_BATCH x 128 tokens"
for enc in "${ENCODERS[@]}"; do
  IFS='|' read -r name model kwargs <<< "$enc"
  # PRE_LRS_GMLP, PRE_LRS_BERT, ...: this encoder's learning rates instead of PRE_LRS
  lrs_var="PRE_LRS_${name^^}"
  for lr in ${!lrs_var:-$PRE_LRS}; do
    # a run stopped earlier (time limit, SIGTERM) continues from its resumable checkpoint
    resume=""
    if [ -f "$RUNS/pre_${name}_lr${lr}/last.pth" ]; then
      resume="--resume $RUNS/pre_${name}_lr${lr}/last.pth"
    elif [ -n "${CONTINUE_FROM:-}" ]; then
      # continued pretraining: the earlier run's weights, optimizer and data position; the new --steps /
      # --warmup-steps give a new linear schedule positioned at that run's last update (logged by the trainer)
      resume="--resume $CONTINUE_FROM/pre_${name}_lr${lr}/last.pth"
    fi
    timeout "$PRE_LIMIT" $PY -m mlp_vision.train_text --task mlm --model "$model" $resume \
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
fi
[[ " $STAGES " == *" finetune "* ]] || exit 0

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

# one job list per invocation: a second invocation (e.g. the pretrained arm once pretraining ends) must not rewrite
# the list an earlier one is still reading
declare -A chosen_of  # once per encoder, not per seed and learning rate
for enc in "${ENCODERS[@]}"; do chosen_of[${enc%%|*}]=$(choose "${enc%%|*}"); done

jobs_file="$RUNS/finetune_jobs_$(date -u +%Y%m%dT%H%M%S)_$$.txt"
: > "$jobs_file"
# one seed, then one learning rate after the other (the first in FT_LRS for every encoder first), so that a stage cut
# by FT_LIMIT leaves whole comparisons
for seed in $FT_SEEDS; do
  suffix=""
  [ "$seed" != 42 ] && suffix="_seed$seed"
  for lr in $FT_LRS; do
    for enc in "${ENCODERS[@]}"; do
      IFS='|' read -r name model kwargs <<< "$enc"
      chosen=${chosen_of[$name]}
      [[ " $FT_ARMS " == *" pre "* ]] && echo "=== $name, lr $lr, seed $seed: the pretrained arm starts from ${chosen:-nothing (no pretraining run finished an evaluation)}"
      common="--task classify --train-file $RUNS/data/fit.tsv --val-file $RUNS/data/heldout.tsv \
--test-file $DATA/rt-polarity/dev.tsv --steps $FT_STEPS -b 32 --eval-interval 100 --block-size 64 --lr $lr \
--seed $seed --threads $THREADS --log-interval 200 --output $RUNS${FT_FLAGS:+ $FT_FLAGS}"
      # a run that finished (results.json) is not run again; one that did not is left for a look (the trainer
      # never writes into an existing run folder): move it away to run it again
      pre=ft_${name}_pre_lr${lr}$suffix scratch=ft_${name}_scratch_lr${lr}$suffix
      [[ " $FT_ARMS " == *" pre "* && -n "$chosen" && ! -f "$RUNS/$pre/results.json" ]] && \
        echo "$PY -m mlp_vision.train_text $common --init-from $chosen/model_best.pth \
${FT_KWARGS:+--model-kwargs $FT_KWARGS }--experiment $pre" >> "$jobs_file"
      [[ " $FT_ARMS " == *" scratch "* && ! -f "$RUNS/$scratch/results.json" ]] && \
        echo "$PY -m mlp_vision.train_text $common --model $model --model-kwargs $kwargs $FT_KWARGS \
--tokenizer-from $RUNS/data/tokenizer --experiment $scratch" >> "$jobs_file"
    done
  done
done
echo "=== fine-tuning: $(wc -l < "$jobs_file") runs, $FT_PAR at once"
# each job logs to RUNS/<experiment>.out
timeout "$FT_LIMIT" xargs -P "$FT_PAR" -I CMD sh -c 'exp=$(echo "CMD" | sed "s/.*--experiment //"); CMD > '"$RUNS"'/$exp.out 2>&1' \
  < "$jobs_file"
echo "=== fine-tuning done after $((SECONDS - t0)) s"
for f in "$RUNS"/ft_*.out; do printf '%s: ' "$(basename "$f" .out)"; grep -ho 'best dev acc [0-9.]*%\|test (.*' "$f" | tr '\n' ' '; echo; done
