#!/usr/bin/env bash
# The figures of results/visualize/: three short trainings (outputs under output/vis/, not committed), then
# `python -m mlp_vision.visualize` on each. Run from the repository root; one compute thread each (the machine is
# shared). The visualize command refuses a non-empty --out: move the committed figures away before a rerun.
set -euo pipefail
export OMP_NUM_THREADS=1
OUT=${OUT:-output/vis}

# sMLPNet: the README's training demo (sMLPNet-T at width 32, depths 1/1/2/1, 32x32 digits)
python -m mlp_vision.train --output "$OUT" --experiment demo_smlpnet_t

# gMLP: the demo recipe with a 4-block gMLP-Ti (d 128, d_ffn 384) on 4x4 patches of 56x56 digits: a 14x14 token
# grid, the grid of the gMLP paper's Fig. 3 (224 px / 16)
python -m mlp_vision.train -c demo_digits --model gmlp_ti --img-size 56 \
  --model-kwargs patch_size=4 num_blocks=4 mlp_ratio=3 \
  --lr 1e-3 --clip-grad 1.0 --drop-path 0 --epochs 12 --output "$OUT" --experiment gmlp_digits56

# gMLP on photos: the same model on imagenette-mini at 56x56, the imagenette CPU recipe with gMLP's settings
python -m mlp_vision.train -c imagenette_mini_cpu --model gmlp_ti --img-size 56 \
  --model-kwargs patch_size=4 num_blocks=4 mlp_ratio=3 \
  --lr 5e-4 --clip-grad 1.0 --drop-path 0 --epochs 10 --output "$OUT" --experiment gmlp_imagenette56

# BiGS: bigs_small (4 layers, d 256, N 64) as a char-level masked LM on Tiny Shakespeare, 128 positions
python -m mlp_vision.train_text --task mlm --model bigs_small \
  --model-kwargs max_position_embeddings=128 hidden_dropout_prob=0.0 \
  --train-file ../shared/data/tinyshakespeare/input.txt --tokenizer char --block-size 128 \
  --steps 400 -b 16 --warmup-steps 40 --eval-interval 100 --log-interval 50 --seed 1337 \
  --threads 1 --output "$OUT" --experiment bigs_shakespeare

# the BiGS run's initial weights, for comparison: the trainer seeds with transformers.set_seed(1337) before create_model
python -c "
import torch
from mlp_vision.text.registry import create_model
torch.manual_seed(1337)
create_model('bigs_small', max_position_embeddings=128, hidden_dropout_prob=0.0, vocab_size=69,
             pad_token_id=65).save_pretrained('$OUT/bigs_shakespeare_init')"

FIGS=results/visualize
python -m mlp_vision.visualize "$OUT/gmlp_digits56/model_best.pth" --out $FIGS/gmlp_digits56
python -m mlp_vision.visualize "$OUT/gmlp_imagenette56/model_best.pth" --out $FIGS/gmlp_imagenette56
python -m mlp_vision.visualize "$OUT/demo_smlpnet_t/model_best.pth" --out $FIGS/smlpnet_demo
python -m mlp_vision.visualize "$OUT/bigs_shakespeare" --out $FIGS/bigs_shakespeare
python -m mlp_vision.visualize "$OUT/bigs_shakespeare_init" --out $FIGS/bigs_shakespeare_init
