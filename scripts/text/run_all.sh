#!/usr/bin/env bash
# The recorded text runs of results/text/README.md, one after the other (2-core CPU, fp32, one process).
# Usage: bash scripts/text/run_all.sh [shakespeare|mlm|all]   (from the repository root; ../shared/data beside it)
# Step counts were fixed from a throughput measurement just before the runs (see README).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=../shared/data
OUT=results/text
WHAT=${1:-all}
SHAKESPEARE_STEPS=${SHAKESPEARE_STEPS:-200}
SHAKESPEARE_MODELS=${SHAKESPEARE_MODELS:-gpt_mlp_attention gpt_sdpa}
SHAKESPEARE_BATCH=${SHAKESPEARE_BATCH:-8}
SHAKESPEARE_EVAL_INTERVAL=${SHAKESPEARE_EVAL_INTERVAL:-40}
SHAKESPEARE_OUT=${SHAKESPEARE_OUT:-$OUT/shakespeare}  # longer runs: SHAKESPEARE_STEPS=1000 SHAKESPEARE_BATCH=16 ...
MLM_STEPS=${MLM_STEPS:-120}
MLM_OUT=${MLM_OUT:-$OUT/wikitext2_mlm}          # the 1,000-update runs: MLM_STEPS=1000 MLM_OUT=results/text/wikitext2_mlm_1000
MLM_MODELS=${MLM_MODELS:-gmlp amlp bigs}
MLM_EVAL_INTERVAL=${MLM_EVAL_INTERVAL:-$((MLM_STEPS / 4))}

stamp() { echo "[$(date -u +%H:%M:%S) UTC] $* | $(uptime | sed 's/.*load average/load average/')"; }

shakespeare() {  # a. MLP-Attention vs dot-product attention, the paper's model settings, same seed and data order
  mkdir -p "$SHAKESPEARE_OUT"
  for model in $SHAKESPEARE_MODELS; do
    rm -rf "${SHAKESPEARE_OUT:?}/$model"
    stamp "start $model"
    python -m mlp_vision.train_text --task causal --model "$model" \
      --train-file $DATA/tinyshakespeare/input.txt --val-fraction 0.1 --block-size 256 \
      --steps "$SHAKESPEARE_STEPS" -b "$SHAKESPEARE_BATCH" --lr 3e-4 --sched constant --warmup-steps 0 \
      --eval-interval "$SHAKESPEARE_EVAL_INTERVAL" --eval-batch-size 32 --log-interval 20 --seed 1337 \
      --output $SHAKESPEARE_OUT --experiment "$model" > "$SHAKESPEARE_OUT/$model.console.log" 2>&1
    python -c "import mlp_vision.text, sys; from transformers import pipeline, set_seed; set_seed(1337)
print(pipeline('text-generation', model=sys.argv[1])('ROMEO:', max_new_tokens=300, do_sample=True, top_k=0)[0]['generated_text'])" \
      "$SHAKESPEARE_OUT/$model" > "$SHAKESPEARE_OUT/$model.samples.txt"
    stamp "end $model"
  done
  python scripts/text/compare.py $SHAKESPEARE_OUT/compare.png \
    --title "Tiny Shakespeare (char): MLP-Attention vs dot-product attention, $SHAKESPEARE_STEPS updates x $SHAKESPEARE_BATCH" \
    MLP-Attention=$SHAKESPEARE_OUT/gpt_mlp_attention SDPA=$SHAKESPEARE_OUT/gpt_sdpa | tee $SHAKESPEARE_OUT/table.md
}

mlm() {  # b. small masked LMs on WikiText-2 (train: valid.txt, evaluate: test.txt), ~3.5 M parameters each
  local common="--task mlm --train-file $DATA/wikitext-2/valid.txt --val-file $DATA/wikitext-2/test.txt \
    --tokenizer char --block-size 128 --steps $MLM_STEPS -b 16 --warmup-steps $((MLM_STEPS / 10)) \
    --eval-interval $MLM_EVAL_INTERVAL --eval-batch-size 64 --log-interval 10 --seed 1337"
  declare -A kwargs=(
    [gmlp]="--model gmlp_base --model-kwargs num_hidden_layers=6 hidden_size=256 intermediate_size=1536 max_position_embeddings=128"
    [amlp]="--model amlp_base --model-kwargs num_hidden_layers=5 hidden_size=256 intermediate_size=1536 tiny_attention_size=64 max_position_embeddings=128"
    [bigs]="--model bigs_small --model-kwargs max_position_embeddings=128 hidden_dropout_prob=0.0"
    # control: BiGS with the gMLP/aMLP optimizer recipe instead of its own (not in the default MLM_MODELS)
    [bigs_gmlp_recipe]="--model bigs_small --model-kwargs max_position_embeddings=128 hidden_dropout_prob=0.0 \
      --lr 7e-4 --opt-betas 0.9 0.999 --weight-decay 0.01 --sched linear"
  )
  local runs=()
  declare -A label=([gmlp]=gMLP [amlp]=aMLP [bigs]=BiGS [bigs_gmlp_recipe]='BiGS (gMLP recipe)')
  mkdir -p "$MLM_OUT"
  for name in $MLM_MODELS; do
    rm -rf "${MLM_OUT:?}/$name"
    stamp "start $name"
    # shellcheck disable=SC2086
    python -m mlp_vision.train_text $common ${kwargs[$name]} \
      --output "$MLM_OUT" --experiment "$name" > "$MLM_OUT/$name.console.log" 2>&1
    stamp "end $name"
  done
  for name in gmlp amlp bigs bigs_gmlp_recipe; do
    if [ -f "$MLM_OUT/$name/eval_results.json" ]; then runs+=("${label[$name]}=$MLM_OUT/$name"); fi
  done
  python scripts/text/compare.py "$MLM_OUT/compare.png" \
    --title "WikiText-2 char MLM (train valid.txt, eval test.txt), ~3.5 M params, $MLM_STEPS updates" \
    "${runs[@]}" | tee "$MLM_OUT/table.md"
}

mkdir -p $OUT/shakespeare $OUT/wikitext2_mlm
case "$WHAT" in
  shakespeare) shakespeare ;;
  mlm) mlm ;;
  all) shakespeare; mlm ;;
  *) echo "usage: $0 [shakespeare|mlm|all]"; exit 2 ;;
esac
stamp done
