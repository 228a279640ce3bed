#!/usr/bin/env bash
# Continued MLM pretraining from a start whose MLM head is trained (bench/measured/mlm/head_start/README.md).
# 1. all-MiniLM-L6-v2 has no MLM head: train a new one (dense, LayerNorm, bias; the decoder tied to the frozen word
#    embeddings) with the whole encoder frozen, on 128-token blocks (one window: the encoder is MiniLM itself).
# 2. From that one start, continued pretraining of Cluster-Former (a cluster layer at layer 3) and the sliding-window
#    model on 1024-token blocks, equal steps, seeds 0 and 1; held-out loss split by masked tokens with a visible copy
#    outside their windows ("outside") or not ("inside").
# One thread, niced. Usage: bash bench/measured/mlm/head_start/run.sh [OUT_DIR] [STEPS]   (default /tmp/mlm-head 300)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${1:-/tmp/mlm-head}
STEPS=${2:-300}
HERE=bench/measured/mlm/head_start
MINILM=${MINILM:-$HOME/.cache/hf_clusterformer/all-MiniLM-L6-v2}
RUN=(env OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python examples/run_mlm.py --report_to none --save_strategy no
     --disable_tqdm true --overwrite --do_train --do_eval)
record() {  # record RUN_DIR NAME: the script's results and the Trainer's log history
  .venv/bin/python - "$1" "$HERE/$2.json" <<'PY'
import json, sys
run, out = sys.argv[1:]
results = json.load(open(f"{run}/all_results.json"))
history = json.load(open(f"{run}/trainer_state.json"))["log_history"]
json.dump({"results": results, "log_history": history}, open(out, "w"), indent=1)
PY
}
if [ ! -f "$OUT/head/model.safetensors" ]; then
  "${RUN[@]}" --model_name_or_path "$MINILM" --window_size 128 --window_stride 112 --cluster_layers \
    --max_seq_length 128 --max_eval_samples 64 --train_head_only --max_steps 300 --per_device_train_batch_size 32 \
    --learning_rate 1e-3 --warmup_steps 20 --seed 0 --output_dir "$OUT/head" --logging_steps 20
  record "$OUT/head" head
fi
for seed in 0 1; do
  for model in clusterformer sliding; do
    layers=(--cluster_layers 3 --global_layer_type cluster); [ "$model" = sliding ] && layers=(--cluster_layers)
    "${RUN[@]}" --model_name_or_path "$OUT/head" --window_size 128 --window_stride 112 "${layers[@]}" --num_clusters 16 \
      --max_seq_length 1024 --max_eval_samples 16 --initial_centroid_blocks 8 \
      --centroid_update_steps 40 --memory_size 20000 --max_capture_per_forward 2048 \
      --max_steps "$STEPS" --per_device_train_batch_size 1 --learning_rate 1e-4 --warmup_steps 10 \
      --seed "$seed" --output_dir "$OUT/$model-seed$seed" --logging_steps 20
    record "$OUT/$model-seed$seed" "$model-seed$seed"
  done
done
