#!/usr/bin/env bash
# One GPU lease, one part of the speed table (issue 34 item 5), on the device machine from the repo root:
#
#   bash scripts/gpu/lease.sh a_gmlp        # (see scripts/gpu/run_gpu.sh for the parts a_ .. j_)
#
# Prepared here first with `bash scripts/gpu/prepare_lease.sh` (wheels the device lacks in .whl/, data in gpu_data/,
# both git-ignored and named in the device call's carry). The device call:
#   command: bash scripts/gpu/lease.sh a_gmlp    carry: [".whl", "gpu_data"]    timeout_s: 540
# Outputs come back under $OUT: rows.md (the table rows), parts.tgz (logs, benchmark CSV / JSON / markdown, the
# top-kernel profiles). Commit the rows to results/gpu/README.md with the device, date and versions they name.
set -u
OUT=${OUT:-output/gpu}
if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export WORK=${WORK:-$OUT/work} DATA=${DATA:-gpu_data/imagenette-mini} TEXT=${TEXT:-gpu_data/tinyshakespeare/input.txt}
export PY=${PY:-python3}
mkdir -p "$WORK"
bash scripts/gpu/run_gpu.sh "$@"
$PY scripts/gpu/speed_rows.py "$WORK"/bench/*.json | tee "$OUT/rows.md"
for f in "$WORK"/bench/*_profile.txt; do [ -f "$f" ] && { echo "=== $f"; head -n 16 "$f"; }; done
tar czf "$OUT/parts.tgz" -C "$WORK" .
