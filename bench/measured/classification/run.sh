#!/usr/bin/env bash
# Long-document classification on CPU at small size (bench/measured/classification/README.md): which of 6 SQuAD
# articles a 2k-4k token excerpt comes from, all-MiniLM-L6-v2 with a new 6-way head, 2 epochs of 48 excerpts, for
# Cluster-Former (a cluster layer at layer 3) and the sliding-window model, seeds 0 and 1. One thread, niced.
# Usage: bash bench/measured/classification/run.sh [OUT_DIR]   (models go to OUT_DIR, default /tmp/cls-runs)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-/tmp/cls-runs}
MINILM=${MINILM:-$HOME/.cache/hf_clusterformer/all-MiniLM-L6-v2}
for seed in 0 1; do
  for model in clusterformer sliding; do
    layers=(--cluster_layers 3 --global_layer_type cluster); [ "$model" = sliding ] && layers=(--cluster_layers)
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python examples/run_classification.py --model_name_or_path "$MINILM" \
      --window_size 128 --window_stride 112 "${layers[@]}" --num_clusters 16 \
      --num_classes 6 --train_per_class 8 --test_per_class 4 --excerpt_tokens_min 2000 --excerpt_tokens_max 4000 \
      --centroid_update_steps 24 --memory_size 20000 --max_capture_per_forward 2048 \
      --do_train --do_eval --num_train_epochs 2 --per_device_train_batch_size 1 --per_device_eval_batch_size 1 \
      --learning_rate 5e-5 --warmup_steps 10 --seed "$seed" --output_dir "$OUT/$model-seed$seed" --overwrite \
      --save_strategy no --report_to none --logging_steps 8 --disable_tqdm true
    cp "$OUT/$model-seed$seed/all_results.json" "bench/measured/classification/$model-seed$seed.json"
  done
done
