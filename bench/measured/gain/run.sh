#!/usr/bin/env bash
# The twin study with a gated near stage: num_places=20 (the issue's recipe), the near stage ends at the first
# evaluation (every 50 steps) whose held-out near start EM reaches 85, or after 600 steps; then 420 far steps.
# Both models, seeds 0-2, one thread each, all six side by side (nice 19) on the 2-core machine.
cd "$(dirname "$0")/../../.."
NEAR='{"context_tokens":[62,72],"num_facts":5,"placement":"gap","num_places":20}'
FAR='{"context_tokens":[300,340],"num_facts":16,"min_gap_tokens":200,"num_places":20}'
for seed in 0 1 2; do
  for variant in clusterformer sliding; do
    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python bench/twin_swaps.py --variant $variant --seed $seed \
      --near "$NEAR" --far "$FAR" --near-steps 600 --near-gate 85 --far-steps 420 --eval-every 50 \
      --out bench/measured/gain/$variant-seed$seed.json > bench/measured/gain/$variant-seed$seed.log 2>&1 &
  done
done
wait
