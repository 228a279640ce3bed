"""Evaluation metrics; the SQuAD metric is also an ``evaluate`` module loadable by path."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import evaluate

# the metric functions: importable from here (tests, bench), out of __all__
from .squad_metric import compute_squad, exact_match_score, f1_score, normalize_answer  # noqa: F401

__all__ = ["SQUAD_METRIC_PATH", "load_squad_metric"]

SQUAD_METRIC_PATH = str(Path(__file__).with_name("squad_metric.py"))
"""Path of the metric script, for ``evaluate.load(SQUAD_METRIC_PATH)``."""


def load_squad_metric(**kwargs: Any) -> evaluate.EvaluationModule:
    """``evaluate.load`` of the bundled SQuAD v1.1 metric (no network needed)."""
    import evaluate

    return evaluate.load(SQUAD_METRIC_PATH, **kwargs)
