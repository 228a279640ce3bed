#!/usr/bin/env bash
# Continued MLM pretraining on CPU at small size (bench/measured/mlm/README.md): all-MiniLM-L6-v2 converted with a new
# MLM head, 1024-token blocks of the SQuAD v1.1 dev articles (42 for training, 6 held out), 120 steps of one block,
# for Cluster-Former (a cluster layer at layer 3) and the sliding-window model, seeds 0 and 1. One thread, niced.
# Usage: bash bench/measured/mlm/run.sh [OUT_DIR]   (models go to OUT_DIR, default /tmp/mlm-runs; results here)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-/tmp/mlm-runs}
MINILM=${MINILM:-$HOME/.cache/hf_clusterformer/all-MiniLM-L6-v2}
for seed in 0 1; do
  for model in clusterformer sliding; do
    layers=(--cluster_layers 3 --global_layer_type cluster); [ "$model" = sliding ] && layers=(--cluster_layers)
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python examples/run_mlm.py --model_name_or_path "$MINILM" \
      --window_size 128 --window_stride 112 "${layers[@]}" --num_clusters 16 \
      --max_seq_length 1024 --max_eval_samples 16 --initial_centroid_blocks 8 \
      --centroid_update_steps 40 --memory_size 20000 --max_capture_per_forward 2048 \
      --do_train --do_eval --max_steps 120 --per_device_train_batch_size 1 --learning_rate 1e-4 --warmup_steps 10 \
      --seed "$seed" --output_dir "$OUT/$model-seed$seed" --overwrite --save_strategy no --report_to none \
      --logging_steps 10 --disable_tqdm true
    .venv/bin/python - "$OUT/$model-seed$seed" "bench/measured/mlm/$model-seed$seed.json" <<'PY'
import json, sys
run, out = sys.argv[1:]
results = json.load(open(f"{run}/all_results.json"))
history = json.load(open(f"{run}/trainer_state.json"))["log_history"]
json.dump({"results": results, "log_history": history}, open(out, "w"), indent=1)
PY
  done
done
