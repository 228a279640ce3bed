#!/usr/bin/env bash
# One command for a GPU machine (at most 9 minutes): the encoder benchmark (bf16, forward and training step, peak
# memory, Cluster-Former vs the floor, Longformer, BigBird and ModernBERT), the K-Means benchmark on the GPU, and the
# `gpu` reproduction preset, everything written under $OUT (or the folder given as $1). PARTS picks the steps
# (default "encoder kmeans reproduce"); PARTS=study runs the long-range study (about 9 minutes on one H200);
# PARTS=gain the gain study's gated recipe (near stage to 85 near EM, far stage with rehearsal) for seeds 0-2, both
# models (`gain-gpu` preset, at most 9 minutes).
# Encoder efficiency parts: encoder (every peer, 20 interleaved rounds, MFU; ~4 min), encoder-profile (where
# Cluster-Former's time above the floor goes), encoder-compile (torch.compile vs eager, forward and training step),
# encoder-cudagraphs (mode="reduce-overhead"); e.g. PARTS="encoder encoder-profile encoder-compile".
# PARTS=realtext: the real-text study (bench/realtext.py --preset gpu: every training and held-out question, seeds
# 0-2, about 9 minutes; record in $out/realtext). It reads the SQuAD v1.1 dev zip from $SQUAD (default
# .cache/squad-v1.1-dev.json.zip), which the machine does not have: it lives outside the repository, so copy
# ../shared/data/squad-v1.1-dev.json.zip into .cache/ and carry .cache (with the MiniLM copy) to the machine.
#
#   bash bench/device_run.sh [OUT_DIR]          # on the GPU machine
#   SIZE=tiny bash bench/device_run.sh /tmp/t   # the same steps at tiny sizes, on CPU (one process each), in about a minute
#
# Needs torch and transformers (no faiss, no datasets, no network): the library is used from src/, the research
# package (the reproduction's recipes and data) from research/src/, and the MiniLM weights from $PRETRAINED (default .cache/minilm, written by `python -m hf_clusterformer.pretrained --pack
# .cache/minilm`; hash-checked before use).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/results/device}}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD/research/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
python=${PYTHON:-python3}
pretrained="${PRETRAINED:-.cache/minilm}"
squad="${SQUAD:-.cache/squad-v1.1-dev.json.zip}"
size="${SIZE:-full}"
parts="${PARTS:-encoder kmeans reproduce}"  # PARTS=study: the long-range study (`study-gpu` recipe) alone
want() { [[ " $parts " == *" $1 "* ]]; }
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
  smoke="--preset smoke --workers 1 --threads 1"  # one process per reproduction
  want encoder && step encoder 120 $python bench/bench_encoder.py --lengths 256 512 --hidden 32 --layers 3 --heads 2 --train \
    --repeats 3 --warmup 1 --json "$out/encoder.json"
  want encoder-profile && step encoder-profile 60 $python bench/bench_encoder.py --lengths 256 --hidden 32 --layers 3 \
    --heads 2 --peers clusterformer floor --repeats 3 --warmup 1 --profile --profile_steps 2 --json "$out/encoder-profile.json"
  want encoder-compile && step encoder-compile 300 $python bench/bench_encoder.py --lengths 256 --hidden 32 --layers 3 \
    --heads 2 --peers clusterformer floor --compile --repeats 3 --warmup 2 --json "$out/encoder-compile.json"
  want kmeans && step kmeans 60 $python bench/bench_kmeans.py --n 4000 --dim 32 --clusters 8 --iters 3 --backends torch
  want reproduce && step reproduce 300 $python bench/reproduce_longrange.py $smoke --output_dir "$out"
  want study && step study 300 $python bench/reproduce_longrange.py $smoke --variants clusterformer \
    clusterformer-prefix sliding --output_dir "$out/study"
  want gain && step gain 300 $python bench/reproduce_longrange.py $smoke --variants clusterformer sliding \
    --output_dir "$out/gain"
  want realtext && step realtext 300 $python bench/realtext.py --preset tiny --no-parallel --pretrained "$pretrained" \
    --squad_path "$squad" --output_dir "$out/realtext/run" --record_dir "$out/realtext"
else
  want encoder && step encoder 300 $python bench/bench_encoder.py --lengths 4096 8192 16384 32768 131072 --train \
    --repeats 20 --warmup 3 --max_seconds 0.15 --json "$out/encoder.json"
  want encoder-profile && step encoder-profile 120 $python bench/bench_encoder.py --lengths 4096 8192 32768 \
    --peers clusterformer floor --repeats 20 --profile --json "$out/encoder-profile.json"
  want encoder-compile && step encoder-compile 300 $python bench/bench_encoder.py --lengths 4096 32768 \
    --peers clusterformer floor --train --compile --repeats 20 --json "$out/encoder-compile.json"
  want encoder-cudagraphs && step encoder-cudagraphs 240 $python bench/bench_encoder.py --lengths 4096 32768 \
    --peers clusterformer floor --compile --compile_mode reduce-overhead --repeats 20 --json "$out/encoder-cudagraphs.json"
  want kmeans && step kmeans 40 $python bench/bench_kmeans.py --n 100000 --dim 1024 --clusters 64 256 512 --backends torch
  want reproduce && step reproduce 370 $python bench/reproduce_longrange.py --preset gpu --pretrained "$pretrained" \
    --time_budget 330 --output_dir "$out"
  want study && step study 560 $python bench/reproduce_longrange.py --preset study-gpu --pretrained "$pretrained" \
    --output_dir "$out/study"
  want gain && step gain 540 $python bench/reproduce_longrange.py --preset gain-gpu --pretrained "$pretrained" \
    --output_dir "$out/gain"
  want realtext && step realtext 590 $python bench/realtext.py --preset gpu --pretrained "$pretrained" \
    --squad_path "$squad" --output_dir outputs/realtext/gpu --record_dir "$out/realtext"
fi
echo "done in $(( $(date +%s) - started )) s; results in $out" | tee -a "$out/summary.txt"
exit $status
