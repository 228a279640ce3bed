"""The long-range studies of Cluster-Former, kept out of the ``hf_clusterformer`` library.

Two parts: `clusterformer_research.longrange`, the synthetic long-range questions (``twin``, ``longrange``,
``local``, ``mention``) and their tokenizer, written as SQuAD-format files for the library's training command
(``python -m clusterformer_research.longrange``); and `clusterformer_research.experiment`, the fine-tuning comparison
of Cluster-Former against the same model with other global layers (recipes, a plain training loop with learning
curves, reports), which ``examples/demo.py`` and ``bench/reproduce_longrange.py`` run.

This package imports ``hf_clusterformer``; the library never imports this package (an import-linter contract in the
repository's ``pyproject.toml``).
"""

__version__ = "0.1.0"
