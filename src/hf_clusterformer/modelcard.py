"""Model cards (README.md with Hub metadata) for Cluster-Former checkpoints.

`make_model_card` turns a config plus what is known about a checkpoint (base model, data, measured EM/F1,
centroid state, widget examples) into a `huggingface_hub.ModelCard`. A card can also be described by a JSON
*spec* (`card_from_spec`), which is how the example card in ``model_cards/`` is kept in sync::

    python -m hf_clusterformer.modelcard --spec model_cards/clusterformer-demo/card.json \\
        --out model_cards/clusterformer-demo/README.md
    # after an evaluation, record its results (and the trained config) in the spec and rewrite the card:
    python -m hf_clusterformer.modelcard --spec model_cards/clusterformer-demo/card.json \\
        --results outputs/results.json --config outputs/model --save-spec \\
        --out model_cards/clusterformer-demo/README.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .configuration_clusterformer import ClusterFormerConfig

__all__ = [
    "CITATION",
    "card_from_spec",
    "default_widget",
    "load_results",
    "main",
    "make_model_card",
    "write_model_card",
]

CITATION = """@inproceedings{wang-etal-2021-cluster,
    title = "Cluster-Former: Clustering-based Sparse Transformer for Question Answering",
    author = "Wang, Shuohang and Zhou, Luowei and Gan, Zhe and Chen, Yen-Chun and Fang, Yuwei and Sun, Siqi and Cheng, Yu and Liu, Jingjing",
    booktitle = "Findings of the Association for Computational Linguistics: ACL-IJCNLP 2021",
    year = "2021",
    pages = "3958--3968",
    doi = "10.18653/v1/2021.findings-acl.346",
}"""

_METRICS = {"exact_match": "Exact Match", "f1": "F1"}
_METRIC_ALIASES = {"exact_match": "exact_match", "exact": "exact_match", "em": "exact_match", "f1": "f1"}
_PREFIXES = ("eval_", "test_", "predict_", "validation_")
_DEFAULT_TAGS = ("clusterformer", "long-context", "extractive-qa", "question-answering", "custom_code")
_CONFIG_FILE_FIELDS = ("transformers_version", "auto_map", "custom_pipelines", "architectures", "_name_or_path")


# ----------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------


def load_results(
    results: str | os.PathLike | Mapping | Sequence[Mapping] | None, dataset: Mapping[str, str] | None = None
) -> list[dict]:
    """Normalise evaluation results to ``[{"task", "dataset": {"name", "type", ...}, "metrics": {...}}]``.

    Accepts a JSON file path or an object: a list of such entries, one entry, or a flat metrics dict such as
    ``{"exact_match": 81.2, "f1": 88.0}`` or trainer output (``eval_exact_match``, ``eval_f1``; ``exact`` is read
    as exact match). Flat metrics and entries without a dataset use ``dataset``. Only exact match and F1 are kept;
    values are percentages.

    Raises:
        ValueError: no exact match / F1 value, a value that is not a number in [0, 100], or no dataset.
    """
    if results is None:
        return []
    if isinstance(results, (str, os.PathLike)):
        results = json.loads(Path(results).read_text(encoding="utf-8"))
    entries = list(results) if isinstance(results, Sequence) and not isinstance(results, (str, bytes)) else [results]
    normalised = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise ValueError(f"A result must be a mapping, got {type(entry).__name__}.")
        raw_metrics = entry["metrics"] if "metrics" in entry else entry
        metrics = {}
        for key, value in raw_metrics.items():
            name = key
            for prefix in _PREFIXES:
                name = name.removeprefix(prefix)
            name = _METRIC_ALIASES.get(name)
            if name is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
                raise ValueError(f"Metric {key!r} must be a percentage in [0, 100], got {value!r}.")
            metrics[name] = round(float(value), 2)
        if not metrics:
            raise ValueError(f"No exact match or F1 value in {dict(raw_metrics)!r}.")
        data = dict(entry.get("dataset") or dataset or {})
        if not data.get("name") or not data.get("type"):
            raise ValueError("Each result needs a dataset with a name and a type (e.g. a Hub dataset id).")
        normalised.append({"task": entry.get("task", "question-answering"), "dataset": data, "metrics": metrics})
    return normalised


def default_widget() -> list[dict[str, str]]:
    """One widget example whose context spans several paragraphs (about 600 tokens), answer in the last one."""
    towns = ["Arden", "Belmor", "Calder", "Dunmere", "Elstow", "Fenwick", "Garlow", "Harrow", "Ilsby", "Jarrow"]
    trades = ["weaver", "baker", "smith", "potter", "miller", "tanner", "cooper", "mason", "fisher", "carter"]
    paragraphs = []
    for i, (town, trade) in enumerate(zip(towns, trades)):
        paragraphs.append(
            f"{town} lies on the old river road, {3 + i} days from the coast. Most families there have worked as "
            f"{trade}s for generations, and the market fills every {['Monday', 'Wednesday', 'Friday'][i % 3]} with "
            f"their goods. Travellers say the bridge at {town} is the oldest in the valley, although nobody agrees on "
            "who built it or when. In winter the road is often closed and the town lives on what it stored."
        )
    paragraphs.append(
        "The lighthouse keeper of the northern cape, Maren Holt, was born in Garlow and moved to the coast at nineteen."
    )
    return [
        {
            "text": "Where was the lighthouse keeper born?",
            "context": "\n\n".join(paragraphs),
            "example_title": "Long context",
        }
    ]


def _config(config: ClusterFormerConfig | Mapping | str | os.PathLike) -> ClusterFormerConfig:
    if isinstance(config, ClusterFormerConfig):
        return config
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        config = json.loads((path / "config.json" if path.is_dir() else path).read_text(encoding="utf-8"))
    values = {k: v for k, v in dict(config).items() if k not in _CONFIG_FILE_FIELDS and k != "model_type"}
    return ClusterFormerConfig(**values)


# ----------------------------------------------------------------------------------------------------------------
# Card
# ----------------------------------------------------------------------------------------------------------------


def make_model_card(
    config: ClusterFormerConfig | Mapping | str | os.PathLike,
    *,
    model_id: str | None = None,
    base_model: str | None = None,
    datasets: Sequence[str] = (),
    training_data: str | None = None,
    results: Sequence[Mapping] | Mapping | str | os.PathLike | None = None,
    results_dataset: Mapping[str, str] | None = None,
    centroids_fitted: Mapping[int, bool] | None = None,
    centroid_fitting: str | None = None,
    widget: Sequence[Mapping[str, str]] | None = None,
    license: str = "apache-2.0",
    language: str | Sequence[str] | None = "en",
    tags: Sequence[str] = (),
    description: str | None = None,
) -> ModelCard:
    """Build the README.md of a Cluster-Former checkpoint.

    Args:
        config: the model's config (object, dict, ``config.json`` path or checkpoint directory).
        model_id: Hub repo id (``user/name``) or name, used in the title, model-index and loading examples.
        base_model: Hub id of the RoBERTa checkpoint it was initialised from.
        datasets: Hub dataset ids it was trained on (metadata ``datasets``).
        training_data: free text about the training data (e.g. for generated data without a Hub id).
        results: measured results, see `load_results`; ``None`` or empty writes "not evaluated".
        results_dataset: ``{"name", "type", "split", "config"}`` of results given without a dataset; defaults to
            the first of ``datasets``.
        centroids_fitted: per cluster layer, whether K-Means centroids were fitted (``fitted`` buffers);
            ``None`` when unknown.
        centroid_fitting: how/when centroids were fitted (e.g. "every 500 steps on 20k context states").
        widget: Hub widget examples ``{"text": question, "context": ..., "example_title": ...}``; by default
            `default_widget`.
        license, language, tags: metadata; tags are added to the Cluster-Former defaults.
        description: an opening paragraph.

    Returns:
        A `ModelCard` with YAML metadata (``library_name: transformers``, ``pipeline_tag: question-answering``,
        model-index when there are results) and a body describing the cluster configuration and usage.
    """
    config = _config(config)
    name = model_id.split("/")[-1] if model_id else "clusterformer-qa"
    if results_dataset is None and datasets:
        results_dataset = {"name": datasets[0], "type": datasets[0]}
    results = load_results(results, results_dataset) if results else []
    eval_results = [
        EvalResult(
            task_type=entry["task"],
            task_name="Extractive Question Answering",
            dataset_type=entry["dataset"]["type"],
            dataset_name=entry["dataset"]["name"],
            dataset_config=entry["dataset"].get("config"),
            dataset_split=entry["dataset"].get("split"),
            metric_type=metric,
            metric_name=_METRICS[metric],
            metric_value=value,
        )
        for entry in results
        for metric, value in entry["metrics"].items()
    ]
    examples = [dict(example) for example in (widget if widget is not None else default_widget())]
    question = examples[0].get("text", "Who wrote it?") if examples else "Who wrote it?"
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag="question-answering",
        license=license,
        language=language,
        tags=list(dict.fromkeys([*_DEFAULT_TAGS, *tags])),
        datasets=list(datasets) or None,
        base_model=base_model,
        model_name=name if eval_results else None,
        eval_results=eval_results or None,
        widget=examples,
    )
    body = _body(
        config, name, model_id, base_model, datasets, training_data, results, centroids_fitted, centroid_fitting,
        description, question,
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def _body(
    config: ClusterFormerConfig,
    name: str,
    model_id: str | None,
    base_model: str | None,
    datasets: Sequence[str],
    training_data: str | None,
    results: list[dict],
    centroids_fitted: Mapping[int, bool] | None,
    centroid_fitting: str | None,
    description: str | None,
    question: str,
) -> str:
    repo = model_id or "path/to/checkpoint"
    kinds = config.encoder_layer_kinds
    global_layers = [i for i, kind in enumerate(kinds) if kind != "sliding"]
    lines = [f"# {name}", ""]
    if description:
        lines += [description.strip(), ""]
    lines += [
        "An extractive question-answering model with the Cluster-Former architecture (Wang et al., 2021): RoBERTa "
        "layers over overlapping sliding windows, plus clustering-based layers that let tokens attend to related "
        "tokens anywhere in the context. The question and the whole context, up to "
        f"{config.max_context_length:,} tokens, go through one forward pass; start and end logits cover every input token.",
        "",
    ]
    if base_model:
        lines += [f"Initialised from [`{base_model}`](https://huggingface.co/{base_model}).", ""]

    lines += ["## Cluster configuration", "", "| Setting | Value |", "| --- | --- |"]
    layer_list = ", ".join(f"{i} ({kinds[i]})" for i in global_layers) or "none (sliding-window layers only)"
    rows = [
        ("Encoder layers", f"{config.num_hidden_layers} (hidden size {config.hidden_size}, "
                           f"{config.num_attention_heads} heads)"),
        ("Global layers (0-based)", layer_list),
        ("Clusters per global layer", str(config.num_clusters)),
        ("Window size / stride", f"{config.window_size} / {config.window_stride} context tokens"),
        ("Longest question", f"{config.max_question_length} tokens"),
        ("Longest context", f"{config.max_context_length:,} tokens"),
        ("Answerability head", "yes" if config.use_answerability_head else "no"),
        ("Centroids", _centroid_state(kinds, centroids_fitted)),
    ]
    lines += [f"| {key} | {value} |" for key, value in rows]
    lines += [
        "",
        f"All other layers are sliding-window layers: each window of {config.window_size} context tokens, "
        f"{config.window_stride} tokens apart, is encoded together with the question, and tokens covered by "
        "several windows take the mean of their copies. A cluster layer assigns every token to its nearest "
        "K-Means centroid (cosine similarity), sorts the tokens by cluster and attends within chunks of "
        f"{config.window_stride} tokens of that order, so that similar tokens far apart see each other."
        + (" An LSH layer does the same with random-hyperplane buckets." if "lsh" in kinds else "")
        + (" A sparse layer attends across windows between tokens at the same window position."
           if "sparse" in kinds else ""),
        "",
    ]
    if centroid_fitting:
        lines += [f"Centroid fitting: {centroid_fitting.strip()}", ""]

    lines += ["## Evaluation", ""]
    if results:
        lines += ["| Dataset | Split | Exact match | F1 |", "| --- | --- | --- | --- |"]
        for entry in results:
            metrics = entry["metrics"]
            lines.append(
                f"| {entry['dataset']['name']} | {entry['dataset'].get('split') or '-'} | "
                f"{_fmt(metrics.get('exact_match'))} | {_fmt(metrics.get('f1'))} |"
            )
        lines += ["", "Exact match and F1 are SQuAD v1.1 scores in percent, measured on the whole contexts.", ""]
    else:
        lines += ["Not evaluated: no exact match / F1 has been measured for this checkpoint.", ""]

    if datasets or training_data:
        lines += ["## Training data", ""]
        if datasets:
            lines += [", ".join(f"[`{d}`](https://huggingface.co/datasets/{d})" for d in datasets), ""]
        if training_data:
            lines += [training_data.strip(), ""]

    lines += [
        "## Usage",
        "",
        "With the `hf_clusterformer` plugin installed (`pip install hf-clusterformer`):",
        "",
        "```python",
        "import hf_clusterformer",
        "",
        f'qa = hf_clusterformer.pipeline(model="{repo}")',
        f"qa(question={json.dumps(question)}, context=long_text, top_k=3)",
        "```",
        "",
        "Without the plugin, the model, configuration and pipeline code stored in this repository are used:",
        "",
        "```python",
        "from transformers import AutoModelForQuestionAnswering, AutoTokenizer, pipeline",
        "",
        f'qa = pipeline("question-answering", model="{repo}", trust_remote_code=True)',
        f"qa(question={json.dumps(question)}, context=long_text)",
        "",
        f'model = AutoModelForQuestionAnswering.from_pretrained("{repo}", trust_remote_code=True)',
        f'tokenizer = AutoTokenizer.from_pretrained("{repo}")',
        "```",
        "",
        "The pipeline returns `answer`, `score`, `start` and `end` (character offsets, `answer == context[start:end]`) "
        "and accepts `top_k`, `max_answer_len`, `handle_impossible_answer` and `long_answer=True` (paragraph-level "
        "answers; paragraphs start with `<p>` or are separated by blank lines).",
        "",
        "## Citation",
        "",
        "```bibtex",
        CITATION,
        "```",
        "",
    ]
    return "\n".join(lines)


def _centroid_state(kinds: list[str], fitted: Mapping[int, bool] | None) -> str:
    cluster_layers = [i for i, kind in enumerate(kinds) if kind == "cluster"]
    if not cluster_layers:
        return "none (no K-Means cluster layer)"
    if fitted is None:
        return "not recorded"
    fitted = {int(k): bool(v) for k, v in fitted.items()}
    done = [i for i in cluster_layers if fitted.get(i)]
    if len(done) == len(cluster_layers):
        return "fitted by K-Means on the model's own hidden states"
    if not done:
        return "not fitted (seeded random unit vectors): fit them before relying on the cluster layers"
    return f"fitted by K-Means for layers {', '.join(map(str, done))} only"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def write_model_card(path: str | os.PathLike, *args: Any, **kwargs: Any) -> ModelCard:
    """`make_model_card` and save it to ``path`` (a README.md file, or a directory that gets one)."""
    card = make_model_card(*args, **kwargs)
    path = Path(path)
    if path.is_dir():
        path = path / "README.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(card), encoding="utf-8")
    return card


# ----------------------------------------------------------------------------------------------------------------
# Specs and command line
# ----------------------------------------------------------------------------------------------------------------

_SPEC_KEYS = {
    "model_id", "base_model", "datasets", "training_data", "results", "results_dataset", "centroids_fitted",
    "centroid_fitting", "widget", "license", "language", "tags", "description",
}


def card_from_spec(spec: Mapping[str, Any]) -> ModelCard:
    """Build a card from a JSON-able spec: ``{"config": {...}, <make_model_card keyword arguments>}``.

    ``centroids_fitted`` keys may be strings (as JSON writes them).
    """
    unknown = set(spec) - _SPEC_KEYS - {"config"}
    if unknown:
        raise ValueError(f"Unknown card spec keys: {sorted(unknown)}.")
    if "config" not in spec:
        raise ValueError("A card spec needs a 'config'.")
    kwargs = {k: v for k, v in spec.items() if k in _SPEC_KEYS}
    if kwargs.get("centroids_fitted") is not None:
        kwargs["centroids_fitted"] = {int(k): v for k, v in kwargs["centroids_fitted"].items()}
    return make_model_card(spec["config"], **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write (or ``--check``) a card from a spec file or a config."""
    parser = argparse.ArgumentParser(prog="python -m hf_clusterformer.modelcard", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", help="card spec JSON (config plus card fields)")
    parser.add_argument("--config", help="config.json or checkpoint directory (replaces the spec's config)")
    parser.add_argument("--results", help="evaluation results JSON (replaces the spec's results)")
    parser.add_argument("--model-id", help="Hub repo id or name")
    parser.add_argument("--base-model", help="Hub id of the base RoBERTa checkpoint")
    parser.add_argument("--dataset", action="append", default=None, help="Hub dataset id (repeatable)")
    parser.add_argument("--save-spec", action="store_true", help="write the merged spec back to --spec")
    parser.add_argument("--check", action="store_true", help="fail if --out differs from the generated card")
    parser.add_argument("--out", required=True, help="README.md path (or directory)")
    args = parser.parse_args(argv)

    spec: dict[str, Any] = json.loads(Path(args.spec).read_text(encoding="utf-8")) if args.spec else {}
    if args.config:
        spec["config"] = _config(args.config).to_diff_dict()
        for key in _CONFIG_FILE_FIELDS:
            spec["config"].pop(key, None)
    if args.results:
        spec["results"] = json.loads(Path(args.results).read_text(encoding="utf-8"))
    for key, value in (("model_id", args.model_id), ("base_model", args.base_model), ("datasets", args.dataset)):
        if value:
            spec[key] = value
    if "config" not in spec:
        parser.error("give --spec or --config")
    card = str(card_from_spec(spec))
    out = Path(args.out)
    if out.is_dir():
        out = out / "README.md"
    if args.check:
        current = out.read_text(encoding="utf-8") if out.exists() else ""
        if current != card:
            print(f"{out} is out of date; regenerate it without --check.", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(card, encoding="utf-8")
    if args.save_spec:
        if not args.spec:
            parser.error("--save-spec needs --spec")
        Path(args.spec).write_text(json.dumps(spec, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
