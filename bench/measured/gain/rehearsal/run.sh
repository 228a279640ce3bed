#!/usr/bin/env bash
# The gated twin recipe (../run.sh) with one change: every far step also trains on 4 near questions (their own
# forward pass; the step's loss is the mean over its 8 far and 4 near questions), so the far stage keeps the near
# skill. The two models side by side (one thread each), each through the seeds in turn (default 1 0 2).
# Checkpoints every 25 steps in outputs/gain-rehearsal/; the same command resumes where it stopped, and a finished
# run is not run again (its JSON record is here).
#   bash bench/measured/gain/rehearsal/run.sh [SEED ...]
cd "$(dirname "$0")/../../../.."
HERE=bench/measured/gain/rehearsal
NEAR='{"context_tokens":[62,72],"num_facts":5,"placement":"gap","num_places":20}'
FAR='{"context_tokens":[300,340],"num_facts":16,"min_gap_tokens":200,"num_places":20}'
for variant in clusterformer sliding; do
  for seed in ${*:-1 0 2}; do
    [ -f $HERE/$variant-seed$seed.json ] && continue
    OMP_NUM_THREADS=1 .venv/bin/python bench/twin_swaps.py --variant $variant --seed $seed \
      --near "$NEAR" --far "$FAR" --near-steps 600 --near-gate 85 --far-steps 420 --eval-every 50 \
      --rehearsal-batch 4 --checkpoint-dir outputs/gain-rehearsal/$variant-seed$seed \
      --out $HERE/$variant-seed$seed.json >> $HERE/$variant-seed$seed.log 2>&1
  done &
done
wait
