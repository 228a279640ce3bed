"""Model cards (README.md with Hub metadata) for Cluster-Former checkpoints.

`make_model_card` turns a config plus what is known about a checkpoint (base model, data, measured EM/F1,
centroid state, widget examples) into a `huggingface_hub.ModelCard`. A card can also be described by a JSON
*spec* (`card_from_spec`), which is how the example card in ``model_cards/`` is kept in sync::

    clusterformer card outputs/run_qa    # a trained checkpoint: config, centroid state, all_results.json
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
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hf_clusterformer_cli_support import CommandError, OneLineParser, convert_command, expand_home, expand_home_options
from hf_clusterformer_files import GENERATED_MARK, card_state, owned_by_model, stamp_card
from hf_clusterformer_heads import architectures_task, find_head, head_tasks
from hf_clusterformer_writing import write_file

from .configuration_clusterformer import ROUTED_LAYER_TYPES, ClusterFormerConfig, ConfigValueError

__all__ = ["make_model_card"]

CITATION = """@inproceedings{wang-etal-2021-cluster,
    title = "Cluster-Former: Clustering-based Sparse Transformer for Question Answering",
    author = "Wang, Shuohang and Zhou, Luowei and Gan, Zhe and Chen, Yen-Chun and Fang, Yuwei and Sun, Siqi and Cheng, Yu and Liu, Jingjing",
    booktitle = "Findings of the Association for Computational Linguistics: ACL-IJCNLP 2021",
    year = "2021",
    pages = "3958--3968",
    doi = "10.18653/v1/2021.findings-acl.346",
}"""  # noqa: E501 (the BibTeX entry's author line, printed in every card, kept whole)

_METRICS = {"exact_match": "Exact Match", "f1": "F1"}
_METRIC_ALIASES = {"exact_match": "exact_match", "exact": "exact_match", "em": "exact_match", "f1": "f1"}
_PREFIXES = ("eval_", "test_", "predict_", "validation_")
_DEFAULT_TAGS = ("clusterformer", "long-context", "extractive-qa", "question-answering", "custom_code")
#: The pipeline task of a card whose config names no head.
DEFAULT_TASK = "question-answering"
_CONFIG_FILE_FIELDS = ("transformers_version", "auto_map", "custom_pipelines", "architectures", "_name_or_path")
#: The layer kinds whose router holds K-Means centroids, fitted during training (`modeling_clusterformer`'s
#: `ClusterRouter` kinds): ``cluster`` and ``window_cluster``; their fitted state is the card's "Centroids" row.
CENTROID_KINDS = ("cluster", "window_cluster")
#: The card body, a Jinja template rendered by `huggingface_hub.ModelCard.from_template`.
TEMPLATE = Path(__file__).resolve().parent / "modelcard_template.md"
#: Data sets this package builds (no Hub page): their result name and training-data description.
GENERATED_DATASETS = {
    "squad-multipassage": {
        "name": "SQuAD v1.1 multi-passage (built from the dev set)",
        "description": (
            "Multi-passage contexts built from the SQuAD v1.1 dev set (`hf_clusterformer.data.multipassage`)"
        ),
    },
}


# ----------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------


def load_results(
    results: str | os.PathLike | Mapping | Sequence[Mapping] | None, dataset: Mapping[str, str] | None = None
) -> list[dict]:
    """Normalise evaluation results to ``[{"task", "dataset": {"name", "type", ...}, "metrics": {...}}]``.

    Accepts a JSON file path or an object: a list of such entries, one entry, or a flat metrics dict such as
    ``{"exact_match": 81.2, "f1": 88.0}`` or trainer output (``eval_exact_match``, ``eval_f1``; ``exact`` is read
    as exact match), or the ``all_results.json`` of ``clusterformer train`` / ``evaluate`` (its ``data`` names the
    dataset). Flat metrics and entries without a dataset use ``dataset``. Only exact match and F1 are kept;
    values are percentages.

    Raises:
        ValueError: no exact match / F1 value, a value that is not a number in [0, 100], or no dataset.
    """
    if results is None:
        return []
    if isinstance(results, (str, os.PathLike)):
        results = _read_json(str(results), "results file")
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
        run_data = entry.get("data") if isinstance(entry.get("data"), Mapping) else None
        data = entry.get("dataset") or (run_card_data(entry)["results_dataset"] if run_data else None)
        data = dict(data or dataset or {})
        if not data.get("name") or not data.get("type"):
            raise ValueError("Each result needs a dataset with a name and a type (e.g. a Hub dataset id).")
        normalised.append({"task": entry.get("task", "question-answering"), "dataset": data, "metrics": metrics})
    return normalised


def default_widget(task: str = DEFAULT_TASK, mask_token: str = "<mask>") -> list[dict[str, str]]:
    """One widget example of the ``task`` (a pipeline task of `hf_clusterformer_heads.HEADS`) over a text of several
    paragraphs (about 600 tokens), the answer in the last one: a question and context, a text with ``mask_token``, or
    a text; none for multiple choice (the Hub has no widget for it)."""
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
        "The lighthouse keeper of the northern cape, Maren Holt, was born in Garlow and moved to the coast at "
        "nineteen."
    )
    context = "\n\n".join(paragraphs)
    widget = find_head(task).card.get("widget", "text")
    if widget == "none":
        return []
    if widget == "question":
        return [{"text": "Where was the lighthouse keeper born?", "context": context, "example_title": "Long context"}]
    if widget == "masked text":
        context += f"\n\nThe keeper still goes back to {mask_token} every spring."
    return [{"text": context, "example_title": "Long context"}]


def run_card_data(run: Mapping[str, Any]) -> dict[str, Any]:
    """`make_model_card` arguments (``datasets``, ``training_data``, ``results``, ``results_dataset``) from the
    ``all_results.json`` that ``clusterformer train`` / ``evaluate`` write (``{"metrics", "data", "model"}``)."""
    data = run.get("data") or {}
    metrics = run.get("metrics") or {}
    results = metrics if any(_METRIC_ALIASES.get(key.removeprefix("eval_")) for key in metrics) else None
    if data.get("train_file") or data.get("validation_file"):
        splits = (("training", "train_file"), ("validation", "validation_file"))
        files = [f"{split} `{Path(data[key]).name}`" for split, key in splits if data.get(key)]
        name = Path(data.get("validation_file") or data["train_file"]).name
        return {"datasets": [], "training_data": f"Local SQuAD-format files: {', '.join(files)}.", "results": results,
                "results_dataset": {"name": name, "type": "json", "split": "validation"}}
    dataset = data.get("dataset")
    if not dataset:
        return {"datasets": [], "training_data": None, "results": results, "results_dataset": None}
    details = None
    if dataset in GENERATED_DATASETS:
        details = (f"{data.get('train_samples')} training and {data.get('eval_samples')} validation examples, "
                   f"contexts of {data.get('context_tokens_min')}-{data.get('context_tokens_max')} tokens, seed "
                   f"{data.get('dataset_seed')}.")
    name = GENERATED_DATASETS.get(dataset, {}).get("name", dataset)
    return {"datasets": [dataset], "training_data": details, "results": results,
            "results_dataset": {"name": name, "type": dataset, "split": "validation"}}


def checkpoint_centroids_fitted(path: str | os.PathLike) -> dict[int, bool] | None:
    """Per cluster layer, whether a checkpoint directory's weights hold fitted centroids (``None`` without weights)."""
    from safetensors import safe_open

    fitted: dict[int, bool] = {}
    files = sorted(Path(path).glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            for key in weights.keys():
                # encoder.layer.{i}.router.fitted, or encoder.routers.{i}.fitted in checkpoints from before
                match = re.search(r"encoder\.(?:layer\.(\d+)\.router|routers\.(\d+))\.fitted$", key)
                if match:
                    fitted[int(match[1] or match[2])] = bool(weights.get_tensor(key).all())
    return fitted if files else None


def checkpoint_mask_token(path: str | os.PathLike) -> str | None:
    """The mask token of the tokenizer saved in a checkpoint directory (``None`` without one)."""
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        file = Path(path, name)
        if file.is_file():
            try:
                token = json.loads(file.read_text(encoding="utf-8")).get("mask_token")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                continue
            token = token.get("content") if isinstance(token, Mapping) else token
            if isinstance(token, str) and token:
                return token
    return None


def _config(config: ClusterFormerConfig | Mapping | str | os.PathLike) -> ClusterFormerConfig:
    if isinstance(config, ClusterFormerConfig):
        return config
    where = "the config"
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        where = str(path)
        config = _read_json(str(path / "config.json" if path.is_dir() else path), "config")
    kind = dict(config).get("model_type", ClusterFormerConfig.model_type)
    if kind != ClusterFormerConfig.model_type:
        raise ValueError(
            f"{where} is a plain {kind} checkpoint's config, not a Cluster-Former one, so a card would describe "
            "cluster layers it does not have; convert it first "
            f"(`{convert_command(where, dict(config).get('architectures'))}`) and write the card of OUT."
        )
    values = {k: v for k, v in dict(config).items()
              if (k not in _CONFIG_FILE_FIELDS or k == "architectures") and k != "model_type"}
    try:
        return ClusterFormerConfig.from_dict(values)  # architectures kept: they name the head (the card's task)
    except ConfigValueError as error:
        raise (error if where == "the config" else error.at(where)) from None


# ----------------------------------------------------------------------------------------------------------------
# Card
# ----------------------------------------------------------------------------------------------------------------


def make_model_card(
    config: ClusterFormerConfig | Mapping | str | os.PathLike, *, model_id: str | None = None,
    base_model: str | None = None, datasets: Sequence[str] = (), training_data: str | None = None,
    results: Sequence[Mapping] | Mapping | str | os.PathLike | None = None,
    results_dataset: Mapping[str, str] | None = None, centroids_fitted: Mapping[int, bool] | None = None,
    centroid_fitting: str | None = None, widget: Sequence[Mapping[str, str]] | None = None,
    license: str = "apache-2.0", language: str | Sequence[str] | None = "en", tags: Sequence[str] = (),
    description: str | None = None, revision: str | None = None, task: str | None = None,
    mask_token: str | None = None,
) -> ModelCard:
    """Build the README.md of a Cluster-Former checkpoint.

    Args:
        config: the model's config (object, dict, ``config.json`` path or checkpoint directory).
        model_id: Hub repo id (``user/name``) or name, used in the title, model-index and loading examples.
        base_model: Hub id of the RoBERTa checkpoint it was initialised from.
        datasets: Hub dataset ids it was trained on (metadata ``datasets``).
        training_data: free text about the training data (e.g. for generated data without a Hub id).
        results: measured results, see `load_results`; ``None`` or empty writes "not evaluated".
        results_dataset: ``{"name", "type", "split", "config"}`` of results without a dataset (default:
            ``datasets[0]``).
        centroids_fitted: per cluster layer, whether K-Means centroids were fitted (``None`` when unknown).
        centroid_fitting: how/when centroids were fitted (e.g. "every 500 steps on 20k context states").
        widget: Hub widget examples (``{"text": question, "context": ..., "example_title": ...}`` for QA); by
            default `default_widget` of the task.
        license, language, tags: metadata; tags are added to the Cluster-Former defaults. description: an opening.
        revision: the Hub commit (or tag) the remote-code snippets pin with ``revision=``; default ``"main"``, with a
            note to pin the tested commit (`hub.push_model` returns it, ``clusterformer push`` prints it).
        task: the pipeline task of the head (`hf_clusterformer_heads.HEADS`), which sets the pipeline tag, widget,
            snippets and wording; default: the head the config's ``architectures`` name, else question answering (the
            only one with results).
        mask_token: the tokenizer's mask token, for a fill-mask widget and snippet (default ``<mask>``).

    Returns:
        A `ModelCard`: YAML metadata (transformers, the pipeline tag, model-index when there are results) and a body
        on the cluster configuration and usage.
    """
    config = _config(config)
    task = _card_task(config, task, results)
    question_answering = task == DEFAULT_TASK
    name = model_id.split("/")[-1] if model_id else "clusterformer-" + ("qa" if question_answering else task)
    results, eval_results = _card_results(results, results_dataset, datasets)
    mask_token = mask_token or "<mask>"
    examples = [dict(example) for example in (widget if widget is not None else default_widget(task, mask_token))]
    hub_datasets, training_data = _split_datasets(datasets, training_data)
    data = ModelCardData(
        library_name="transformers", pipeline_tag=task, license=license, language=language,
        tags=list(dict.fromkeys([*_task_tags(task), *tags])), datasets=hub_datasets or None, base_model=base_model,
        model_name=name if eval_results else None, eval_results=eval_results or None, widget=examples or None,
    )
    repo, question, long_text = _usage_inputs(model_id, examples, question_answering)
    return ModelCard.from_template(
        data, template_path=str(TEMPLATE), name=name, description=(description or "").strip(), config=config,
        settings=_settings_rows(config, centroids_fitted, task), **_kind_text(config),
        centroid_fitting=(centroid_fitting or "").strip(), results=_result_rows(results), hub_datasets=hub_datasets,
        training_data=(training_data or "").strip(), repo=repo, revision=revision or "main",
        pinned=bool(revision), question=question,
        long_text=long_text, citation=CITATION, marker=GENERATED_MARK,
        **_task_text(task, repo, long_text, mask_token, revision or "main"),
    )


def _card_results(
    results: Any, results_dataset: Mapping[str, str] | None, datasets: Sequence[str]
) -> tuple[list[dict[str, Any]], list[EvalResult]]:
    """`load_results` of a card's ``results`` (their dataset by default the first of ``datasets``; none: no results)
    and their model-index entries (`_eval_results`)."""
    if results_dataset is None and datasets:
        results_dataset = {"name": GENERATED_DATASETS.get(datasets[0], {}).get("name", datasets[0]),
                           "type": datasets[0]}
    results = load_results(results, results_dataset) if results else []
    return results, _eval_results(results)


def _usage_inputs(
    model_id: str | None, examples: Sequence[Mapping[str, str]], question_answering: bool
) -> tuple[str, str, str]:
    """The repo, the question (JSON) and the ``long_text`` expression of a card's usage snippets."""
    repo = model_id or "path/to/checkpoint"
    question = json.dumps(examples[0].get("text", "Who wrote it?") if examples else "Who wrote it?")
    return repo, question, _snippet_text(examples if question_answering else default_widget())


def _kind_text(config: ClusterFormerConfig) -> dict[str, Any]:
    """What the template's paragraph on the layers reads: the layer kinds, and whether routers compare key
    projections (``route_by`` keys with a routed layer)."""
    kinds = config.layer_kinds
    routed_by_keys = config.route_by == "keys" and any(k in ROUTED_LAYER_TYPES for k in kinds)
    return {"kinds": kinds, "routed_by_keys": routed_by_keys}


def _task_tags(task: str) -> tuple[str, ...]:
    """The default tags of a card of ``task``: the Cluster-Former ones, QA's (extractive-qa) or the task's."""
    return _DEFAULT_TAGS if task == DEFAULT_TASK else (*_DEFAULT_TAGS[:2], task, _DEFAULT_TAGS[-1])


def _card_task(config: ClusterFormerConfig, task: str | None, results: Any) -> str:
    """The card's pipeline task: ``task``, or the head the config's ``architectures`` name, or question answering
    (`ValueError` for another name, or for results of another task: exact match / F1 are question answering's)."""
    task = task or architectures_task(getattr(config, "architectures", None)) or DEFAULT_TASK
    if task not in head_tasks():
        raise ValueError(f"task must be one of {', '.join(head_tasks())}, got {task!r}.")
    if results and task != DEFAULT_TASK:
        raise ValueError(f"results hold exact match / F1 of question answering; this card is of a {task} model.")
    return task


def _task_text(task: str, repo: str, long_text: str, mask: str, revision: str) -> dict[str, Any]:
    """The template's words for the head of ``task`` (its row's ``card`` in `hf_clusterformer_heads.HEADS`) and, but
    for QA's (in the template), its snippets."""
    words = {key: value.format(mask=mask) for key, value in find_head(task).card.items()}
    text: dict[str, Any] = {"task": task, "head": words}
    if task != DEFAULT_TASK:
        text["plugin_snippet"] = _usage(task, repo, long_text, mask, remote=False)
        text["remote_snippet"] = _usage(task, repo, long_text, mask, remote=True, revision=revision)
    return text


def _usage(task: str, repo: str, long_text: str, mask: str, remote: bool, revision: str = "main") -> str:
    """The usage snippet of a head other than QA's (with the plugin imported before it, or ``remote``: the code stored
    with the checkpoint, pinned to ``revision``): a pipeline call, or the model called on (1, choices, length)
    inputs."""
    load = ", trust_remote_code=True, revision=revision" if remote else ""
    pinned = f'\nrevision = "{revision}"' if remote else ""
    imports, call = find_head(task).usage
    call = call.format(task=task, repo=repo, load=load, mask=mask)
    return f"{imports}\n\nlong_text = {long_text}  # your long document{pinned}\n{call}"


#: The filler paragraph of the usage snippets' stand-in for a long document.
_FILLER = "The road along the river is closed in winter, and the town lives on what it stored."


def _snippet_text(examples: Sequence[Mapping[str, str]]) -> str:
    """The Python expression the usage snippets define ``long_text`` with, so that they run as printed: a filler
    paragraph repeated (several hundred tokens) and the widget's last paragraph, which answers its question."""
    context = str(examples[0].get("context", "")) if examples else ""
    paragraph = context.strip().split("\n\n")[-1].strip() if context.strip() else ""
    parts = f"[{json.dumps(_FILLER)}] * 40" + (f" + [{json.dumps(paragraph[:500])}]" if paragraph else "")
    return f'"\\n\\n".join({parts})'


def _eval_results(results: list[dict[str, Any]]) -> list[EvalResult]:
    """The model-index entries of results from `load_results`: one per dataset and metric."""
    return [
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


def _settings_rows(
    config: ClusterFormerConfig, centroids_fitted: Mapping[int, bool] | None, task: str = DEFAULT_TASK
) -> list[tuple[str, str]]:
    """The card's configuration table: (setting, value) rows."""
    kinds = config.layer_kinds
    untrained = (getattr(config, "untrained_weights", None) or {}).get("names")
    row = find_head(task)
    prefix = row.card.get("longest_prefix", "Longest first text of a pair")
    text = row.card.get("longest_text", "Longest text")
    head = row.card.get("untrained_head", f"{row.name[:1].upper()}{row.name[1:]} head")
    refused = " (the pipeline refuses it until then)" if task == DEFAULT_TASK else ""
    return [
        ("Encoder layers", f"{config.num_hidden_layers} (hidden size {config.hidden_size}, "
                           f"{config.num_attention_heads} heads)"),
        ("Global layers (0-based)", ", ".join(f"{i} ({kinds[i]})" for i in config.global_layers)
         or "none (sliding-window layers only)"),
        ("Clusters per global layer", str(config.num_clusters)),
        ("Window size / stride", f"{config.window_size} / {config.window_stride} context tokens"),
        (prefix, f"{config.max_question_length} tokens"),
        (text, f"{config.max_context_length:,} tokens"),
        *([("Answerability head", "yes" if config.use_answerability_head else "no")] if task == DEFAULT_TASK else []),
        *([(head, f"newly initialised, never trained: fine-tune before use{refused}")] if untrained else []),
        ("Centroids", _centroid_state(kinds, centroids_fitted, config.route_by)),
    ]


def _result_rows(results: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """The card's results table: (dataset, split, EM, F1) rows."""
    return [
        (entry["dataset"]["name"], entry["dataset"].get("split") or "-", _fmt(entry["metrics"].get("exact_match")),
         _fmt(entry["metrics"].get("f1")))
        for entry in results
    ]


def _split_datasets(datasets: Sequence[str], training_data: str | None) -> tuple[list[str], str | None]:
    """Hub dataset ids, and the training-data text with the project's generated sets described (they have no Hub
    page)."""
    generated = [GENERATED_DATASETS[d] for d in datasets if d in GENERATED_DATASETS]
    own = [training_data.strip()] if training_data else []
    text = " ".join([*(f"{d['description']}." for d in generated), *own])
    return [d for d in datasets if d not in GENERATED_DATASETS], text or None


def _centroid_state(kinds: list[str], fitted: Mapping[int, bool] | None, route_by: str = "states") -> str:
    """The "Centroids" row: whether the layers of `CENTROID_KINDS` (``fitted``: layer index -> fitted) were fitted, on
    what their routers compare (``route_by``: the hidden states or their key projections)."""
    cluster_layers = [i for i, kind in enumerate(kinds) if kind in CENTROID_KINDS]
    if not cluster_layers:
        return "none (no K-Means cluster layer)"
    if fitted is None:
        return "not recorded"
    fitted = {int(k): bool(v) for k, v in fitted.items()}
    done = [i for i in cluster_layers if fitted.get(i)]
    if len(done) == len(cluster_layers):
        return f"fitted by K-Means on the model's own {'key projections' if route_by == 'keys' else 'hidden states'}"
    if not done:
        return "not fitted (seeded random unit vectors): fit them before relying on the cluster layers"
    return f"fitted by K-Means for layers {', '.join(map(str, done))} only"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# ----------------------------------------------------------------------------------------------------------------
# Specs and command line
# ----------------------------------------------------------------------------------------------------------------

_SPEC_KEYS = {
    "model_id", "base_model", "datasets", "training_data", "results", "results_dataset", "centroids_fitted",
    "centroid_fitting", "widget", "license", "language", "tags", "description", "revision", "task", "mask_token",
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


def main(argv: Sequence[str] | None = None, prog: str = "python -m hf_clusterformer.modelcard") -> int:
    """Command line (``clusterformer card``): write (or ``--check``) a card for a checkpoint, a spec file or a config.

    Errors are one line on stderr, exit status 2.
    """
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", help="checkpoint directory: config, centroid state and its "
                        "all_results.json are read from it, README.md is written into it")
    parser.add_argument("--spec", help="card spec JSON (config plus card fields)")
    parser.add_argument("--config", help="config.json or checkpoint directory (replaces the spec's config)")
    parser.add_argument(
        "--results", help="evaluation results JSON, e.g. all_results.json (replaces the spec's results)"
    )
    parser.add_argument("--model-id", help="Hub repo id or name")
    parser.add_argument("--base-model", help="Hub id of the base RoBERTa checkpoint")
    parser.add_argument("--revision", help="Hub commit the remote-code snippets pin (default: main, to replace)")
    parser.add_argument("--dataset", action="append", default=None,
                        help="Hub dataset id, or squad-multipassage (repeatable)")
    parser.add_argument("--save-spec", action="store_true", help="write the merged spec back to --spec")
    parser.add_argument("--check", action="store_true", help="fail if --out differs from the generated card")
    parser.add_argument("--out", help="README.md path or directory (default: the checkpoint's README.md)")
    parser.add_argument("--overwrite", action="store_true", help="replace a checkpoint's differing README.md")
    label = "clusterformer" if prog.startswith("clusterformer") else prog
    try:  # a quoted ~ (a script's) expanded as the shell would
        args = parser.parse_args(expand_home_options(list(sys.argv[1:] if argv is None else argv)))
        args.checkpoint = expand_home(args.checkpoint)
        return _write_card(args, parser)
    except CommandError as error:
        message = str(error)
    except (OSError, ValueError) as error:
        message = str(error)
    except Exception as error:  # a damaged weights file (safetensors' own error type)
        if type(error).__name__ != "SafetensorError":
            raise
        from .loading import unreadable_weights

        message = unreadable_weights(args.checkpoint, error)
    print(f"{label}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _read_json(path: str, what: str) -> Any:
    """A JSON file, with errors that name it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ValueError(f"{what} {path} does not exist.") from error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{what} {path} is not valid JSON ({error}); fix or regenerate it.") from error


def _write_card(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    spec: dict[str, Any] = _read_json(args.spec, "--spec") if args.spec else {}
    if args.checkpoint is not None:
        _read_checkpoint(args, spec)
    if args.out is None:
        parser.error("give --out or a checkpoint directory")
    if args.config:
        if not Path(args.config).exists():
            raise ValueError(f"--config {args.config} does not exist.")
        config = _config(args.config)
        if architectures_task(config.architectures):  # the head the config names is the card's task
            spec["task"] = architectures_task(config.architectures)
        spec["config"] = config.to_diff_dict()
        for key in _CONFIG_FILE_FIELDS:
            spec["config"].pop(key, None)
    if args.results:
        results = _read_json(args.results, "--results")
        spec["results"] = results
        if isinstance(results, Mapping) and isinstance(results.get("data"), Mapping):  # all_results.json of a run
            for key, value in run_card_data(results).items():
                if key == "results":
                    spec[key] = value
                elif value:
                    spec.setdefault(key, value)
    if args.model_id:  # the card's snippets load it: one a Hub id cannot be is refused, as push refuses it
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id

        try:
            validate_repo_id(args.model_id)
        except HFValidationError:
            parser.error(f"--model-id {args.model_id!r} is no Hub repo id (NAME or USER/NAME of letters, digits, "
                         "'-', '_' and '.'); give the id the model is (or will be) pushed to")
    for key, value in (("model_id", args.model_id), ("base_model", args.base_model), ("datasets", args.dataset),
                       ("revision", args.revision)):
        if value:
            spec[key] = value
    if "config" not in spec:
        parser.error("give a checkpoint directory, --spec or --config")
    card = stamp_card(str(card_from_spec(spec)))
    out = Path(args.out)
    if out.is_dir() or args.out.endswith(("/", os.sep)):  # a folder (one that does not exist yet: a trailing /)
        out = out / "README.md"
    if args.check:
        current = out.read_text(encoding="utf-8") if out.exists() else ""
        if current != card:
            print(f"{out} is out of date; regenerate it without --check.", file=sys.stderr)
            return 1
        return 0
    _check_card_target(out, card, args.overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file(out, card, args.overwrite, "--overwrite", own=out.name == "README.md")
    if args.save_spec:
        if not args.spec:
            parser.error("--save-spec needs --spec")
        Path(args.spec).write_text(json.dumps(spec, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


def _read_checkpoint(args: argparse.Namespace, spec: dict[str, Any]) -> None:
    """What the card of checkpoint directory ``args.checkpoint`` reads from it: its config, README.md as the default
    ``--out``, its folder name as the model id, its centroid state, its tokenizer's mask token, and (for a QA model)
    the EM/F1 of its run's all_results.json."""
    checkpoint = args.checkpoint
    if not Path(checkpoint).exists():
        raise ValueError(f"checkpoint folder {checkpoint} does not exist; give a checkpoint directory.")
    if not Path(checkpoint, "config.json").is_file():
        raise ValueError(f"checkpoint {checkpoint} has no config.json; give a checkpoint directory.")
    args.config = args.config or checkpoint
    from .loading import check_finite_file

    check_finite_file(checkpoint, "a card")
    default_results = Path(checkpoint, "all_results.json")
    question_answering = architectures_task(_config(args.config).architectures) in (None, DEFAULT_TASK)
    if args.results is None and default_results.is_file() and question_answering:  # another head's run: no EM/F1
        args.results = str(default_results)
    args.out = args.out or checkpoint
    spec.setdefault("model_id", Path(checkpoint).resolve().name)
    fitted = checkpoint_centroids_fitted(checkpoint)
    if fitted is not None:
        spec["centroids_fitted"] = fitted
    mask = checkpoint_mask_token(checkpoint)
    if mask:
        spec["mask_token"] = mask


def _check_card_target(out: Path, card: str, overwrite: bool) -> None:
    """A card replaces a card: never a model's other files (its config, weights, tokenizer, records), and a
    hand-written file or a generated card edited since (`card_state`) only with ``--overwrite``."""
    if out.name != "README.md" and owned_by_model(out.name):
        raise ValueError(f"--out {out} is the model's {out.name}, not a card; give --out a folder (its README.md is "
                         "written) or a new .md file.")
    if not out.is_file() or overwrite:
        return
    try:
        current = out.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{out} exists and is not a card (not UTF-8 text); give another --out.") from error
    state = card_state(current)
    if current != card and state != "generated":
        what = "a generated card edited since" if state == "edited" else "hand-written (not generated by this command)"
        raise ValueError(f"{out} exists and differs from the new card, and it is {what}; pass --overwrite to replace "
                         "it, or give another --out.")


if __name__ == "__main__":
    sys.exit(main())
