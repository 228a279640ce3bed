"""What the two export files share (tests/test_export.py, tests/test_export_heads.py): the models' layer settings, the
traced length, and a tiny model ready to export."""

from __future__ import annotations

import torch
from helpers import open_routed_paths, tiny_config

# Window l = 16, stride m = 12 (tiny_config); every layer type, and the traced length is none of those below.
CONFIG = dict(num_hidden_layers=5, cluster_layers=[1, 2, 3, 4],
              global_layer_type=["cluster", "lsh", "sparse", "window_cluster"])
TRACED_LENGTH = 41
#: Two layers (a sliding and a cluster one) where a test checks a head, not the layer types: a smaller program.
SMALL = dict(num_hidden_layers=2, cluster_layers=[1])


def fitted_model(cls, seed: int, **config):
    """A tiny ``cls`` in eval mode, drawn with ``seed``, its centroids marked fitted (random ones do for export) and
    its window_cluster layers' routed projections drawn (at their zero start the routed path would add nothing)."""
    torch.manual_seed(seed)
    model = cls(tiny_config(**config)).eval()
    for router in model.cluster_routers().values():
        router.fitted.fill_(True)
    open_routed_paths(model)
    return model
