#!/usr/bin/env bash
# A MiniLM QA model fine-tuned on real questions, to measure what int8 costs (bench/measured/export/README.md):
# all-MiniLM-L6-v2 converted to Cluster-Former (a cluster layer at layer 3), trained on the questions of SQuAD v1.1
# dev articles 0-39 with their paragraph as context; articles 40-47 are held out (OUT/heldout.json).
# One thread, niced. Usage: bash bench/measured/export/finetune_qa.sh [OUT_DIR] [STEPS]   (default /tmp/qa-minilm 250)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-/tmp/qa-minilm}
STEPS=${2:-250}
MINILM=${MINILM:-$HOME/.cache/hf_clusterformer/all-MiniLM-L6-v2}
mkdir -p "$OUT"
.venv/bin/python - "$OUT" <<'PY'
import json, sys
from hf_clusterformer.data.multipassage import default_squad_path, read_squad
squad = read_squad(default_squad_path())
for name, articles in (("train", squad["data"][:40]), ("heldout", squad["data"][40:])):
    json.dump({"version": squad.get("version", "1.1"), "data": articles}, open(f"{sys.argv[1]}/{name}.json", "w"))
PY
OMP_NUM_THREADS=1 nice -n 10 .venv/bin/clusterformer train --model_name_or_path "$MINILM" --allow_untrained \
  --cluster_layers 3 --global_layer_type cluster --train_file "$OUT/train.json" --validation_file "$OUT/heldout.json" \
  --eval_samples 400 \
  --max_seq_length 256 --do_train --do_eval --max_steps "$STEPS" --per_device_train_batch_size 16 \
  --learning_rate 2e-4 --warmup_steps 20 --seed 0 --output_dir "$OUT/model" --overwrite --save_strategy no \
  --report_to none --logging_steps 25 --disable_tqdm true
cp "$OUT/model/all_results.json" bench/measured/export/qa_minilm_results.json
