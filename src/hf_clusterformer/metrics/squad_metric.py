"""SQuAD v1.1 exact match and F1 as an ``evaluate`` metric.

Loadable by path, without network access::

    metric = evaluate.load("/path/to/squad_metric.py")
    metric.compute(predictions=[{"id": "1", "prediction_text": "Denver Broncos"}],
                   references=[{"id": "1", "answers": {"text": ["Denver Broncos"],
                                                       "answer_start": [177]}}])

Answers are normalised as in the official v1.1 evaluation script (lower case, punctuation and
the articles a/an/the removed, whitespace collapsed); each prediction scores the maximum over
its gold answers; results are percentages. The file imports nothing from its package, so that
``evaluate`` can copy it into its module cache. The scores need neither ``datasets`` nor ``evaluate``: the
``evaluate`` wrapper is defined only where both are installed.
"""

import re
import string
from collections import Counter

try:
    import datasets
    import evaluate
except ImportError:
    datasets = evaluate = None

_CITATION = """\
@inproceedings{rajpurkar-etal-2016-squad,
    title = "{SQ}u{AD}: 100,000+ Questions for Machine Comprehension of Text",
    author = "Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy",
    booktitle = "Proceedings of EMNLP",
    year = "2016",
    pages = "2383--2392",
}
"""

_DESCRIPTION = """\
Exact match and token F1 of the official SQuAD v1.1 evaluation script.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of {"id": str, "prediction_text": str}.
    references: list of {"id": str, "answers": {"text": list[str], "answer_start": list[int]}}.
Returns:
    {"exact_match": float, "f1": float}, percentages over the references. A reference without
    a prediction scores 0; a reference without gold answers scores 100 for an empty prediction.
"""

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    """Harmonic mean of token precision and recall after normalisation."""
    prediction_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(ground_truth).split()
    same = sum((Counter(prediction_tokens) & Counter(truth_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(prediction_tokens)
    recall = same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def metric_max_over_ground_truths(metric_fn, prediction: str, ground_truths: list) -> float:
    """Best score of ``prediction`` against any gold answer.

    Without gold answers (unanswerable), 1.0 for a prediction that normalises to "", else 0.0.
    """
    if not ground_truths:
        return float(normalize_answer(prediction) == "")
    return max(metric_fn(prediction, truth) for truth in ground_truths)


def compute_squad(predictions: dict, references: dict) -> dict:
    """Scores for ``predictions`` (id -> text) against ``references`` (id -> gold texts)."""
    if not references:
        raise ValueError("no references to score")
    exact = f1 = 0.0
    for qid, truths in references.items():
        if qid not in predictions:
            continue
        exact += metric_max_over_ground_truths(exact_match_score, predictions[qid], truths)
        f1 += metric_max_over_ground_truths(f1_score, predictions[qid], truths)
    return {"exact_match": 100.0 * exact / len(references), "f1": 100.0 * f1 / len(references)}


if evaluate is not None:

    @evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
    class SquadMetric(evaluate.Metric):
        """SQuAD v1.1 exact match and F1."""

        def _info(self):
            return evaluate.MetricInfo(
                description=_DESCRIPTION,
                citation=_CITATION,
                inputs_description=_KWARGS_DESCRIPTION,
                features=datasets.Features(
                    {
                        "predictions": {
                            "id": datasets.Value("string"),
                            "prediction_text": datasets.Value("string"),
                        },
                        "references": {
                            "id": datasets.Value("string"),
                            "answers": {
                                "text": datasets.List(datasets.Value("string")),
                                "answer_start": datasets.List(datasets.Value("int32")),
                            },
                        },
                    }
                ),
                reference_urls=["https://rajpurkar.github.io/SQuAD-explorer/"],
            )

        def _compute(self, predictions, references):
            predicted = {p["id"]: p["prediction_text"] for p in predictions}
            gold = {r["id"]: list(r["answers"]["text"]) for r in references}
            return compute_squad(predicted, gold)
