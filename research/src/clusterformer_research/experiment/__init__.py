"""Fine-tuning experiments from a pretrained start: Cluster-Former against the same model with other global layers.

Three rooms: `recipes` (what is trained: variants, data, stages; `make_preset`), `running` (the training loop, the
evaluation, the queue of runs; `compare`) and `report` (the Markdown/JSON record, positional shortcuts, PNGs).
``bench/reproduce_longrange.py`` and ``examples/demo.py`` run them.

The data are the generated long-range questions (`clusterformer_research.longrange`): ``twin`` (one-hop: the place
named twice, its two mentions further apart than any stack of windows relays), ``longrange`` (two-hop) and ``local``
(one sentence, the control). Training only: inference never imports this package.
"""

from .recipes import MAIN_VARIANTS, PRESETS, VARIANTS, Preset, Stage, make_preset
from .report import positional_shortcuts, write_report
from .running import RunSetup, compare, run_one

__all__ = ["MAIN_VARIANTS", "PRESETS", "Preset", "RunSetup", "Stage", "VARIANTS", "compare", "make_preset",
           "positional_shortcuts", "run_one", "write_report"]
