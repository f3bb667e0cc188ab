#!/usr/bin/env bash
# One round of the pretrain-then-fine-tune study (issue 13.4) as one command, with today's text trainer
# (python -m mlp_vision.train_text on transformers.Trainer). The defaults are sized for one GPU and a 10-minute
# limit; the 2-core CPU knobs of rounds 3 to 6 are in results/text/study/roundN/README.md (those rounds ran on the
# trainer before Trainer, at commit cc06155 and earlier: their files are results.json / summary.csv).
#
#   bash scripts/text_study/run_study.sh            # DATA=../shared/data RUNS=output/study by default
#   python scripts/text_study/collect.py output/study --out DIR   # the round's tables
#
# 1. prepare.py (PREPARE_FLAGS): the splits of rounds 2-4 and one WordPiece 8,000 vocabulary.
# 2. Masked-LM pretraining (on PRE_TEXT: WikiText-2 + the unlabelled fit.tsv sentences by default) of the four encoders
#    (4 layers, hidden WIDTH, max length 128) at PRE_LRS (PRE_LRS_GMLP, ... for one encoder), all runs at once on the
#    one device, in RUNS/pre_<name>_lr<lr>/. Each encoder's run is the one with the lowest held-out MLM loss
#    (collect.py --encoder); fine-tuning starts (--init-from) from its final model, or from its latest checkpoint-N/
#    when the run was stopped before its last update.
# 3. Fine-tuning on fit.tsv, pretrained and from scratch (same vocabulary and architecture), at FT_LRS, in
#    RUNS/ft_<name>_<pre|scratch>_lr<lr>[_seed<S>]/; the checkpoint is chosen on heldout.tsv (the run keeps the best
#    as its final model), the LR by collect.py, and dev.tsv is scored once by that checkpoint (--test-file:
#    test_results.json).
#
# Every stage runs under `timeout`, so the script ends inside the device's limit and whatever finished is kept: the
# SIGTERM makes each run save a checkpoint-N/ at its next update and stop, and running the script again continues
# every such run in place (--resume of its run folder) up to its --steps; a finished run (eval_results.json /
# test_results.json) is not run again.
# Knobs (environment): WIDTH, PREPARE_FLAGS, PRE_TEXT (file under RUNS/data), PRE_STEPS, PRE_BATCH, PRE_LRS,
# PRE_LRS_<NAME>, PRE_EVALS (evaluations + checkpoints per pretraining run), PRE_LIMIT (seconds for the whole
# pretraining stage), FT_STEPS, FT_EVAL (updates between fine-tuning evaluations), FT_LRS, FT_SEEDS, FT_ARMS,
# FT_PAR (fine-tuning runs at once), FT_LIMIT, FT_KWARGS (config fields) / FT_FLAGS (trainer flags) of both
# fine-tuning arms, THREADS (per process), AMP (flags for pretraining), DROPOUT, ENCODER_NAMES (a subset of
# "gmlp amlp bigs bert"), STAGES ("pretrain finetune", or one of them), PY.
# Gone with the old trainer: CONTINUE_FROM (continuing an earlier round's run into a new folder; Trainer continues a
# run in its own folder: raise PRE_STEPS and --resume it with its checkpoint's schedule, or pretrain anew) and the
# evaluation sizes (--eval-batches: Trainer scores the whole held-out text).
set -u
PY=${PY:-python3}
DATA=${DATA:-../shared/data}
RUNS=${RUNS:-output/study}
PREPARE_FLAGS=${PREPARE_FLAGS:-}
PRE_TEXT=${PRE_TEXT:-pretrain_text.txt}
PRE_STEPS=${PRE_STEPS:-8000}
PRE_BATCH=${PRE_BATCH:-128}
PRE_LRS=${PRE_LRS-5e-4 1e-3}
PRE_EVALS=${PRE_EVALS:-16}
PRE_LIMIT=${PRE_LIMIT:-330}
FT_STEPS=${FT_STEPS:-2000}
FT_EVAL=${FT_EVAL:-100}
FT_LRS=${FT_LRS-3e-5 1e-4 3e-4 1e-3}
FT_PAR=${FT_PAR:-8}
FT_LIMIT=${FT_LIMIT:-200}
FT_KWARGS=${FT_KWARGS:-}   # config fields for both fine-tuning arms, e.g. classifier_pooling=mean
FT_FLAGS=${FT_FLAGS:-}     # trainer flags for both fine-tuning arms, e.g. --freeze-embeddings
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

# how a run folder stands: done (its final results), resume (a checkpoint-N/ to continue), new (absent or empty),
# or stuck (files but no checkpoint: left for a look, move it away to run it again)
run_state() {  # FOLDER DONE_FILE
  if [ -f "$1/$2" ]; then echo done
  elif compgen -G "$1/checkpoint-*/trainer_state.json" > /dev/null; then echo resume
  elif [ ! -d "$1" ] || [ -z "$(ls -A "$1")" ]; then echo new
  else echo stuck; fi
}

t0=$SECONDS
echo "=== prepare ($(date -u +%H:%M:%S))"
[ -f "$RUNS/data/fit.tsv" ] || $PY scripts/text_study/prepare.py --data "$DATA" --out "$RUNS/data" $PREPARE_FLAGS || exit 1

if [[ " $STAGES " == *" pretrain "* ]]; then
echo "=== pretraining on $PRE_TEXT: ${#ENCODERS[@]} encoders x lr {$PRE_LRS}, $PRE_STEPS updates x $PRE_BATCH x 128 tokens"
eval_interval=$((PRE_STEPS / PRE_EVALS > 0 ? PRE_STEPS / PRE_EVALS : 1))
for enc in "${ENCODERS[@]}"; do
  IFS='|' read -r name model kwargs <<< "$enc"
  # PRE_LRS_GMLP, PRE_LRS_BERT, ...: this encoder's learning rates instead of PRE_LRS
  lrs_var="PRE_LRS_${name^^}"
  for lr in ${!lrs_var:-$PRE_LRS}; do
    exp=pre_${name}_lr${lr}
    resume=""
    case $(run_state "$RUNS/$exp" eval_results.json) in
      done) echo "--- $exp: finished earlier"; continue ;;
      stuck) echo "--- $exp: $RUNS/$exp holds no checkpoint to continue; move it away to run it again" >&2; continue ;;
      resume) resume="--resume $RUNS/$exp" ;;  # its latest checkpoint, in place
    esac
    timeout "$PRE_LIMIT" $PY -m mlp_vision.train_text --task mlm --model "$model" $resume \
      --model-kwargs $kwargs sparse_prediction=True --tokenizer-from "$RUNS/data/tokenizer" \
      --train-file "$RUNS/data/$PRE_TEXT" --val-file "$RUNS/data/wikitext_val.txt" --block-size 128 \
      --steps "$PRE_STEPS" -b "$PRE_BATCH" --lr "$lr" --opt-betas 0.9 0.98 --opt-eps 1e-6 --weight-decay 0.01 \
      --sched linear --warmup-steps $((PRE_STEPS / 10)) --eval-interval $eval_interval --log-interval 200 $AMP \
      --threads "$THREADS" --output "$RUNS" --experiment "$exp" >> "$RUNS/$exp.out" 2>&1 &
  done
done
wait
echo "=== pretraining done after $((SECONDS - t0)) s"
for f in "$RUNS"/pre_*.out; do [ -f "$f" ] && { echo "--- $f"; tail -n 2 "$f"; }; done
fi
[[ " $STAGES " == *" finetune "* ]] || exit 0

# one job list per invocation: a second invocation (e.g. the pretrained arm once pretraining ends) must not rewrite
# the list an earlier one is still reading
declare -A chosen_of  # once per encoder, not per seed and learning rate
for enc in "${ENCODERS[@]}"; do chosen_of[${enc%%|*}]=$($PY scripts/text_study/collect.py "$RUNS" --encoder "${enc%%|*}"); done

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
--test-file $DATA/rt-polarity/dev.tsv --steps $FT_STEPS -b 32 --eval-interval $FT_EVAL --block-size 64 --lr $lr \
--seed $seed --threads $THREADS --log-interval 200 --output $RUNS${FT_FLAGS:+ $FT_FLAGS}"
      for arm in pre scratch; do
        exp=ft_${name}_${arm}_lr${lr}$suffix
        [[ " $FT_ARMS " == *" $arm "* ]] || continue
        [ $arm = pre ] && [ -z "$chosen" ] && continue
        resume=""
        case $(run_state "$RUNS/$exp" test_results.json) in
          done) continue ;;
          stuck) echo "--- $exp: $RUNS/$exp holds no checkpoint to continue; move it away to run it again" >&2
                 continue ;;
          resume) resume=" --resume $RUNS/$exp" ;;
        esac
        if [ $arm = pre ]; then
          echo "$PY -m mlp_vision.train_text $common --init-from $chosen ${FT_KWARGS:+--model-kwargs $FT_KWARGS }\
--experiment $exp$resume" >> "$jobs_file"
        else
          echo "$PY -m mlp_vision.train_text $common --model $model --model-kwargs $kwargs $FT_KWARGS \
--tokenizer-from $RUNS/data/tokenizer --experiment $exp$resume" >> "$jobs_file"
        fi
      done
    done
  done
done
echo "=== fine-tuning: $(wc -l < "$jobs_file") runs, $FT_PAR at once"
# each job logs to RUNS/<experiment>.out
timeout "$FT_LIMIT" xargs -P "$FT_PAR" -I CMD sh -c \
  'exp=$(echo "CMD" | sed "s/.*--experiment \([^ ]*\).*/\1/"); CMD >> '"$RUNS"'/$exp.out 2>&1' < "$jobs_file"
echo "=== fine-tuning done after $((SECONDS - t0)) s"
for f in "$RUNS"/ft_*/test_results.json; do [ -f "$f" ] && echo "$(basename "$(dirname "$f")"): $(tr -d '\n ' < "$f")"; done
exit 0
