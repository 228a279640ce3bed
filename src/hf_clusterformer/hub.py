"""Self-contained Hub checkpoints: code files, ``auto_map``, safetensors weights, tokenizer and card.

A checkpoint written by `save_for_hub` (or pushed after `prepare_for_hub`) loads without this package::

    AutoModelForQuestionAnswering.from_pretrained(repo, trust_remote_code=True)
    pipeline("question-answering", model=repo, trust_remote_code=True)

because it holds ``configuration_clusterformer.py``, ``modeling_clusterformer.py`` and ``pipeline.py`` (which import
only torch, transformers, huggingface_hub and each other) and ``config.json`` maps the Auto classes and the
``question-answering`` pipeline to them. Weights (including the K-Means centroids and their ``fitted`` flags) are
stored as safetensors only.

`convert_roberta_checkpoint` turns a RoBERTa checkpoint into a Cluster-Former one; `push_model` uploads a
checkpoint directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.dynamic_module_utils import get_imports

from .configuration_clusterformer import ClusterFormerConfig
from .modeling_clusterformer import ClusterFormerForQuestionAnswering, ClusterFormerModel
from .pipeline import TASK, required_model_max_length

__all__ = [
    "CODE_FILES",
    "PICKLE_SUFFIXES",
    "ConvertedCheckpoint",
    "check_hub_checkpoint",
    "convert_roberta_checkpoint",
    "hub_auto_map",
    "hub_code_imports",
    "prepare_for_hub",
    "push_model",
    "save_for_hub",
]

logger = logging.getLogger(__name__)

_PACKAGE_DIR = Path(__file__).resolve().parent
#: Code files a Hub checkpoint carries (the pipeline file only when ``config.json`` names a custom pipeline).
CODE_FILES = ("configuration_clusterformer.py", "modeling_clusterformer.py", "pipeline.py")
#: Weight formats that unpickle on load; never written or uploaded.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
#: Top-level packages the Hub code may import besides the standard library.
_HUB_CODE_PACKAGES = {"torch", "transformers", "huggingface_hub"}
_CUSTOM_PIPELINE = {
    TASK: {
        "impl": "pipeline.ClusterFormerQuestionAnsweringPipeline",
        "pt": ["AutoModelForQuestionAnswering"],
        "type": "text",
    }
}


def hub_auto_map(question_answering: bool = True) -> dict[str, str]:
    """``auto_map`` entries of a Cluster-Former checkpoint (the QA entry only for QA models)."""
    auto_map = {
        "AutoConfig": "configuration_clusterformer.ClusterFormerConfig",
        "AutoModel": "modeling_clusterformer.ClusterFormerModel",
    }
    if question_answering:
        auto_map["AutoModelForQuestionAnswering"] = "modeling_clusterformer.ClusterFormerForQuestionAnswering"
    return auto_map


def _is_question_answering(model: PreTrainedModel) -> bool:
    return type(model).__name__ == ClusterFormerForQuestionAnswering.__name__


def prepare_for_hub(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
    """Make ``model.save_pretrained`` / ``model.push_to_hub`` write checkpoints that load with remote code.

    Registers the config class for ``AutoConfig`` and the model class for ``AutoModelForQuestionAnswering``
    (``AutoModel`` for a bare `ClusterFormerModel`) — a class-level setting, so later saves of these classes in
    this process also copy the code files — and sets ``model.config.auto_map`` to all of `hub_auto_map` (transformers
    itself lists only the saved class). Raises ``tokenizer.model_max_length`` to the longest input the model takes,
    so long contexts cause no length warning.
    """
    if getattr(model.config, "model_type", None) != ClusterFormerConfig.model_type:
        raise ValueError(f"prepare_for_hub needs a Cluster-Former model, got model_type {model.config.model_type!r}.")
    question_answering = _is_question_answering(model)
    if not question_answering and type(model).__name__ != ClusterFormerModel.__name__:
        raise ValueError(
            f"Only ClusterFormerModel and ClusterFormerForQuestionAnswering can be shared, got {type(model).__name__}."
        )
    type(model.config).register_for_auto_class("AutoConfig")
    type(model).register_for_auto_class("AutoModelForQuestionAnswering" if question_answering else "AutoModel")
    model.config.auto_map = {**(getattr(model.config, "auto_map", None) or {}), **hub_auto_map(question_answering)}
    if tokenizer is not None:
        needed = required_model_max_length(model.config)
        if (tokenizer.model_max_length or 0) < needed:
            tokenizer.model_max_length = needed


def save_for_hub(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    save_dir: str | os.PathLike,
    *,
    card: Any = None,
    card_data: Mapping[str, Any] | None = None,
    max_shard_size: int | str = "5GB",
) -> Path:
    """Write a self-contained checkpoint: weights, config, code files, tokenizer and README.md.

    Args:
        model: a `ClusterFormerForQuestionAnswering` (or `ClusterFormerModel`).
        tokenizer: its (fast) tokenizer, or ``None``.
        save_dir: output directory (created).
        card: a ready `huggingface_hub.ModelCard` or README text; by default one is generated with
            `hf_clusterformer.modelcard.make_model_card`.
        card_data: keyword arguments for `make_model_card` (``model_id``, ``base_model``, ``datasets``,
            ``results``, ``centroid_fitting``, ...); the centroid state is read from the model.
        max_shard_size: safetensors shard size.

    Returns:
        The directory. Raises `ValueError` if the result fails `check_hub_checkpoint`.
    """
    from .modelcard import make_model_card

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    prepare_for_hub(model, tokenizer)
    question_answering = _is_question_answering(model)
    config = model.config
    previous = getattr(config, "custom_pipelines", None)
    if question_answering:
        config.custom_pipelines = json.loads(json.dumps(_CUSTOM_PIPELINE))
    try:
        model.save_pretrained(save_dir, max_shard_size=max_shard_size)
    finally:
        # The pipeline file is only written here, so a later model.push_to_hub must not name it.
        if question_answering:
            if previous is None:
                del config.custom_pipelines
            else:
                config.custom_pipelines = previous
    for name in CODE_FILES if question_answering else CODE_FILES[:2]:
        shutil.copyfile(_PACKAGE_DIR / name, save_dir / name)
    if tokenizer is not None:
        tokenizer.save_pretrained(save_dir)
    if card is None:
        fitted = {index: bool(router.fitted) for index, router in model.cluster_routers().items()}
        card = make_model_card(config, **{"centroids_fitted": fitted, **dict(card_data or {})})
    elif card_data:
        raise ValueError("Give either card or card_data, not both.")
    (save_dir / "README.md").write_text(str(card), encoding="utf-8")
    problems = check_hub_checkpoint(save_dir)
    if problems:
        raise ValueError(f"{save_dir} is not a self-contained checkpoint: " + "; ".join(problems))
    return save_dir


def hub_code_imports(path: str | os.PathLike) -> set[str]:
    """Top-level packages a code file needs, as transformers' remote-code loader sees them (``try`` blocks and
    relative imports excluded)."""
    return set(get_imports(path))


def check_hub_checkpoint(path: str | os.PathLike) -> list[str]:
    """Problems that would stop a checkpoint directory from loading without this package (empty when fine).

    Checks ``config.json`` (model type, every `hub_auto_map` entry, the custom pipeline), the code files and their
    imports (standard library, torch, transformers, huggingface_hub and each other only), safetensors weights and
    the absence of pickle files.
    """
    path = Path(path)
    problems = []
    config_file = path / "config.json"
    if not config_file.is_file():
        return [f"no config.json in {path}"]
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.get("model_type") != ClusterFormerConfig.model_type:
        problems.append(f"config.json has model_type {config.get('model_type')!r}, not 'clusterformer'")
    question_answering = any(name.endswith("ForQuestionAnswering") for name in config.get("architectures") or [])
    auto_map = config.get("auto_map") or {}
    for key, target in hub_auto_map(question_answering).items():
        if auto_map.get(key) != target:
            problems.append(f"config.json auto_map[{key!r}] is {auto_map.get(key)!r}, expected {target!r}")
    needed = list(CODE_FILES[:2])
    pipelines = config.get("custom_pipelines") or {}
    if question_answering and pipelines.get(TASK, {}).get("impl") != _CUSTOM_PIPELINE[TASK]["impl"]:
        problems.append(f"config.json custom_pipelines does not map {TASK!r} to {_CUSTOM_PIPELINE[TASK]['impl']}")
    if pipelines:
        needed.append(CODE_FILES[2])
    local = {Path(name).stem for name in CODE_FILES}
    allowed = _HUB_CODE_PACKAGES | set(sys.stdlib_module_names) | local
    for name in needed:
        if not (path / name).is_file():
            problems.append(f"{name} is missing")
            continue
        extra = hub_code_imports(path / name) - allowed
        if extra:
            problems.append(f"{name} imports {sorted(extra)}, which a plain transformers install may lack")
    files = [p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()]
    if not any(name.endswith(".safetensors") for name in files):
        problems.append("no .safetensors weights")
    pickled = [name for name in files if name.endswith(PICKLE_SUFFIXES)]
    if pickled:
        problems.append(f"pickle files present: {pickled}")
    return problems


# ----------------------------------------------------------------------------------------------------------------
# Convert and push
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class ConvertedCheckpoint:
    """Result of `convert_roberta_checkpoint`."""

    path: Path
    config: ClusterFormerConfig
    #: Parameters the source did not have (e.g. ``qa_outputs.*`` from a plain RoBERTa: train before use).
    newly_initialized: list[str] = field(default_factory=list)
    has_tokenizer: bool = False


def convert_roberta_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    cluster_layers: Sequence[int] | None = None,
    num_clusters: int = 64,
    window_size: int = 256,
    window_stride: int = 224,
    global_layer_type: str | Sequence[str] = "cluster",
    max_question_length: int = 64,
    max_context_length: int = 131072,
    use_answerability_head: bool = False,
    tokenizer: str | os.PathLike | None = None,
    card_data: Mapping[str, Any] | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
) -> ConvertedCheckpoint:
    """Turn a RoBERTa / RobertaForQuestionAnswering checkpoint into a self-contained Cluster-Former one.

    RoBERTa weights (and a QA head when present) load 1:1; cluster layers get seeded random centroids (not fitted:
    train with centroid updates before relying on them) and a new QA head is initialised when the source has none.

    Args:
        src: Hub id or directory of a ``roberta`` (or ``clusterformer``) checkpoint.
        dst: output directory, written by `save_for_hub`.
        cluster_layers: 0-based layers to make global layers; default: the paper's placement scaled to the depth.
        num_clusters, window_size, window_stride, global_layer_type, max_question_length, max_context_length,
            use_answerability_head: the Cluster-Former options (see `ClusterFormerConfig`).
        tokenizer: where to load the tokenizer from (default ``src``; a missing tokenizer there is skipped with a
            warning, one named here must load).
        card_data: extra `make_model_card` arguments; ``base_model`` defaults to ``src`` when it is a Hub id.
        revision, token: for loading ``src`` from the Hub.

    Raises:
        ValueError: ``src`` is not a RoBERTa checkpoint, or the options are invalid (e.g. windows that do not fit
        the position table).
    """
    hub_kwargs = {"revision": revision, "token": token}
    source = AutoConfig.from_pretrained(src, **hub_kwargs)
    if source.model_type not in ("roberta", ClusterFormerConfig.model_type):
        raise ValueError(f"{src} is a {source.model_type!r} checkpoint; only RoBERTa checkpoints can be converted.")
    dropped = ("model_type", "architectures", "auto_map", "custom_pipelines", "transformers_version", "_name_or_path")
    values = {k: v for k, v in source.to_dict().items() if k not in dropped}
    values.update(
        cluster_layers=list(cluster_layers) if cluster_layers is not None else None,
        num_clusters=num_clusters,
        window_size=window_size,
        window_stride=window_stride,
        global_layer_type=global_layer_type if isinstance(global_layer_type, str) else list(global_layer_type),
        max_question_length=max_question_length,
        max_context_length=max_context_length,
        use_answerability_head=use_answerability_head,
    )
    config = ClusterFormerConfig(**values)
    config.check_position_budget()
    model, info = ClusterFormerForQuestionAnswering.from_pretrained(
        src, config=config, output_loading_info=True, **hub_kwargs
    )
    routers = {f"roberta.encoder.routers.{i}." for i in config.cluster_layers}
    newly_initialized = sorted(k for k in info["missing_keys"] if not any(k.startswith(r) for r in routers))
    if newly_initialized:
        logger.warning(f"Newly initialised (not in {src}): {', '.join(newly_initialized)}; fine-tune before use.")

    loaded_tokenizer = None
    try:
        loaded_tokenizer = AutoTokenizer.from_pretrained(tokenizer if tokenizer is not None else src, **hub_kwargs)
    except (OSError, ValueError, TypeError) as error:
        if tokenizer is not None:
            raise ValueError(f"Could not load the tokenizer from {tokenizer}: {error}") from error
        logger.warning(f"No tokenizer loaded from {src} ({error}); the checkpoint is written without one.")

    card_kwargs = dict(card_data or {})
    if not Path(src).exists() and "base_model" not in card_kwargs:
        card_kwargs["base_model"] = str(src)
    save_for_hub(model, loaded_tokenizer, dst, card_data=card_kwargs)
    return ConvertedCheckpoint(Path(dst), config, newly_initialized, loaded_tokenizer is not None)


def push_model(
    local_dir: str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str = "Upload Cluster-Former checkpoint",
    create_pr: bool = False,
    endpoint: str | None = None,
):
    """Upload a checkpoint directory (from `save_for_hub` / `convert_roberta_checkpoint`) to a Hub model repo.

    The directory is checked with `check_hub_checkpoint` first; pickle files are never uploaded. The repo (and
    branch ``revision``) is created when missing.

    Returns:
        The `huggingface_hub.CommitInfo` of the upload (``.oid``, ``.commit_url``).

    Raises:
        ValueError: the directory is not a self-contained Cluster-Former checkpoint.
    """
    from huggingface_hub import HfApi

    problems = check_hub_checkpoint(local_dir)
    if problems:
        raise ValueError(f"Refusing to push {local_dir}: " + "; ".join(problems))
    api = HfApi(endpoint=endpoint, token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id
    if revision is not None and not create_pr:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    return api.upload_folder(
        folder_path=str(local_dir),
        repo_id=repo_id,
        repo_type="model",
        revision=revision,
        commit_message=commit_message,
        create_pr=create_pr,
        ignore_patterns=[f"*{suffix}" for suffix in PICKLE_SUFFIXES] + [".git/*", "*/.git/*"],
    )
