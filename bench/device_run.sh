#!/usr/bin/env bash
# One command for a GPU machine (at most 9 minutes): the encoder benchmark (bf16, forward and training step, peak
# memory, Cluster-Former vs the floor, Longformer, BigBird and ModernBERT), the K-Means benchmark on the GPU, and the
# `gpu` reproduction preset, everything written under $OUT (or the folder given as $1).
#
#   bash bench/device_run.sh [OUT_DIR]          # on the GPU machine
#   SIZE=tiny bash bench/device_run.sh /tmp/t   # the same steps at tiny sizes, on CPU, in about a minute
#
# Needs torch and transformers (no faiss, no datasets, no network): the package is used from src/ and the MiniLM
# weights from $PRETRAINED (default .cache/minilm, written by `python -m hf_clusterformer.pretrained --pack
# .cache/minilm`; hash-checked before use).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/results/device}}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
python=${PYTHON:-python3}
pretrained="${PRETRAINED:-.cache/minilm}"
size="${SIZE:-full}"
started=$(date +%s)
status=0

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $out/NAME.log, keep going on failure
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most ${limit} s) ==" | tee -a "$out/summary.txt"
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$out/$name.log"
  echo "== $name: exit $rc after $(( $(date +%s) - started )) s in all ==" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || status=$rc
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU";
  $python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } \
  | tee "$out/summary.txt"

if [ "$size" = tiny ]; then
  step encoder 120 $python bench/bench_encoder.py --lengths 256 512 --hidden 32 --layers 3 --heads 2 --train \
    --repeats 1 --json "$out/encoder.json"
  step kmeans 60 $python bench/bench_kmeans.py --n 4000 --dim 32 --clusters 8 --iters 3 --backends torch
  step reproduce 300 $python bench/reproduce_longrange.py --preset smoke --output_dir "$out"
else
  step encoder 120 $python bench/bench_encoder.py --lengths 4096 8192 16384 32768 131072 --train --repeats 2 \
    --max_seconds 6 --json "$out/encoder.json"
  step kmeans 40 $python bench/bench_kmeans.py --n 100000 --dim 1024 --clusters 64 256 512 --backends torch
  step reproduce 370 $python bench/reproduce_longrange.py --preset gpu --pretrained "$pretrained" --time_budget 330 --output_dir "$out"
fi
echo "done in $(( $(date +%s) - started )) s; results in $out" | tee -a "$out/summary.txt"
exit $status
