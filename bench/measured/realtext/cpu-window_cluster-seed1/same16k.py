"""Score a seed's Cluster-Former after B on the same-16000 cell beside the main worker (same code path, same file):
``same16k.py [SEED]`` (default 1). Since cells are claimed, a second process of the study's own command does this."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/
import realtext as rt  # noqa: E402

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
args = rt.parse_args(["--seeds", str(seed), "--models", "clusterformer"])
study = rt.Study(args)
torch.set_num_threads(1)
model = rt.load_model(study.seed_dir(seed) / "B" / "clusterformer" / "model", study)
rt.score_cell(study, seed, "B", "clusterformer", model, ("same", 16000), 0.0)
