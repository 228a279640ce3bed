"""Score seed 1's Cluster-Former after B on the same-16000 cell beside the main worker (same code path, same file)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/
import realtext as rt  # noqa: E402

args = rt.parse_args(["--seeds", "1", "--models", "clusterformer"])
study = rt.Study(args)
torch.set_num_threads(1)
model = rt.load_model(study.seed_dir(1) / "B" / "clusterformer" / "model", study)
rt.score_cell(study, 1, "B", "clusterformer", model, ("same", 16000), 0.0)
