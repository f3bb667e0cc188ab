#!/usr/bin/env bash
# Run here (not on the device) before a GPU lease: what the device machine lacks travels with the call.
#   .whl/      timm at this checkout's version and fvcore (+ iopath, yacs, termcolor) for the MAC counts behind
#              "% of the matmul rate"; pure-Python wheels built here, installed there by scripts/gpu/lease.sh
#   gpu_data/  Tiny Shakespeare (part f_text_trainer) from ../shared/data, and with --images imagenette-mini (44 MB,
#              for the train / ddp parts only): the device gets the checkout, not ../shared
# Both are git-ignored; name them in the device call's carry (the checkout and carried paths: 64 MiB at most).
set -eu
cd "$(dirname "$0")/../.."
rm -rf .whl && mkdir -p .whl
timm_version=$(python3 -c 'import timm; print(timm.__version__)')
python3 -m pip wheel -q --no-deps -w .whl "timm==$timm_version" fvcore iopath yacs termcolor
mkdir -p gpu_data
datasets=(tinyshakespeare); [ "${1:-}" = --images ] && datasets+=(imagenette-mini)
for d in "${datasets[@]}"; do
    [ -d "../shared/data/$d" ] && { rm -rf "gpu_data/$d"; cp -r "../shared/data/$d" gpu_data/; }
done
du -sh .whl gpu_data
