"""Self-contained Hub checkpoints: code files, ``auto_map``, safetensors weights, tokenizer and card.

A checkpoint written by `save_for_hub` (or pushed after `prepare_for_hub`) loads without this package::

    AutoModelForQuestionAnswering.from_pretrained(repo, trust_remote_code=True)
    pipeline("question-answering", model=repo, trust_remote_code=True)

because it holds ``configuration_clusterformer.py``, ``modeling_clusterformer.py`` and ``pipeline.py`` (which import
only torch, transformers, huggingface_hub and each other) and ``config.json`` maps the Auto classes and the
``question-answering`` pipeline to them. Weights (including the K-Means centroids and their ``fitted`` flags) are
stored as safetensors only.

`push_model` uploads a checkpoint directory (`hf_clusterformer.conversion.convert_checkpoint` writes one from a
RoBERTa or BERT-family checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.dynamic_module_utils import get_imports

import hf_clusterformer_heads

# the file rules (which files a model owns) and the one writer of a model folder have one home each
from hf_clusterformer_files import CODE_FILES, ModelFolderExistsError
from hf_clusterformer_heads import find_head
from hf_clusterformer_model_folder import CUSTOM_PIPELINE, apply_auto_map, write_model_folder

from .configuration_clusterformer import ClusterFormerConfig, ConfigValueError
from .loading import check_tokenizer_fits
from .modeling_clusterformer import (
    UNTRAINED_WEIGHTS,
    ClusterFormerModel,
    untrained_weights,
)
from .pipeline import TASK

__all__ = [
    "ModelFolderExistsError",
    "check_hub_checkpoint",
    "prepare_for_hub",
    "push_model",
    "save_for_hub",
]

logger = logging.getLogger(__name__)

#: Weight formats that unpickle on load; never written or uploaded.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
#: Top-level packages the Hub code may import besides the standard library.
_HUB_CODE_PACKAGES = {"torch", "transformers", "huggingface_hub"}
#: Folders the Trainer writes for resuming (optimizer state, RNG state); never uploaded.
_TRAINER_CHECKPOINT_PREFIX = "checkpoint-"
_CUSTOM_PIPELINE = CUSTOM_PIPELINE  # the one writer's entry (`hf_clusterformer_model_folder.write_model_folder`)


def hub_auto_map(head: bool = True) -> dict[str, str]:
    """``auto_map`` entries of a Cluster-Former checkpoint: the config, the base model and, for a head's checkpoint
    (``head``), every head of `hf_clusterformer_heads.HEADS`, each loadable from it as transformers loads a RoBERTa
    checkpoint into another head (weights the checkpoint lacks are initialised)."""
    auto_map = {
        "AutoConfig": "configuration_clusterformer.ClusterFormerConfig",
        "AutoModel": "modeling_clusterformer.ClusterFormerModel",
    }
    if head:
        rows = hf_clusterformer_heads.HEADS
        auto_map.update({row.auto_class: f"modeling_clusterformer.{row.class_name}" for row in rows})
    return auto_map


def _head_class_names() -> list[str]:
    return [head.class_name for head in hf_clusterformer_heads.HEADS]


def _is_head(model: PreTrainedModel) -> bool:
    return find_head(type(model).__name__) is not None


def prepare_for_hub(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
    """Make ``model.save_pretrained`` / ``model.push_to_hub`` write checkpoints that load with remote code.

    Registers the config class for ``AutoConfig`` and the model class for its Auto class (`hf_clusterformer_heads`;
    ``AutoModel`` for a bare `ClusterFormerModel`) — a class-level setting, so later saves of these classes in
    this process also copy the code files — and sets ``model.config.auto_map`` to all of `hub_auto_map` (transformers
    itself lists only the saved class). Raises ``tokenizer.model_max_length`` to the longest input the model takes,
    so long contexts cause no length warning.
    """
    model_type = getattr(type(model.config), "model_type", None)  # what config.json gets (the class attribute)
    if model_type != ClusterFormerConfig.model_type:
        raise ValueError(f"prepare_for_hub needs a Cluster-Former model, got model_type {model_type!r}.")
    head = _is_head(model)
    if not head and type(model).__name__ != ClusterFormerModel.__name__:
        raise ValueError(
            f"Only ClusterFormerModel and its heads ({', '.join(_head_class_names())}) can be shared, got "
            f"{type(model).__name__}."
        )
    type(model.config).register_for_auto_class("AutoConfig")
    type(model).register_for_auto_class(find_head(type(model).__name__).auto_class if head else "AutoModel")
    apply_auto_map(model)  # the one writer's (`hf_clusterformer_model_folder`), equal to `hub_auto_map`
    if tokenizer is not None:
        needed = model.config.max_input_length
        if (tokenizer.model_max_length or 0) < needed:
            tokenizer.model_max_length = needed


@contextlib.contextmanager
def quiet_loading(datasets_bars: bool = False) -> Iterator[None]:
    """transformers' loading/saving reports below errors and its progress bars off (``datasets_bars``: the
    ``datasets`` ones too) for the block, then as before; this package's own warnings still show."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets_logging = None
    if datasets_bars:
        from datasets.utils import logging as datasets_logging

        datasets_enabled = datasets_logging.is_progress_bar_enabled()
        datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if datasets_logging is not None and datasets_enabled:
            datasets_logging.enable_progress_bar()


def save_for_hub(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    save_dir: str | os.PathLike,
    *,
    card: Any = None,
    card_data: Mapping[str, Any] | None = None,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
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
        overwrite: replace a model already in ``save_dir`` (and files of the user's with a model file's name; other
            files are kept, `hf_clusterformer_writing.writing_model_dir`); without it such a folder is refused with
            `ModelFolderExistsError`.

    Returns:
        The directory. Raises `ValueError` if the result fails `check_hub_checkpoint` (``save_dir`` is then left
        as it was). Written by the one writer of a model folder, `hf_clusterformer_model_folder.write_model_folder`.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"save_for_hub takes the model object, got {type(model).__name__} {model!r:.80}; load it "
                        "first (from_pretrained), or write a checkpoint folder again with convert_checkpoint.")
    if tokenizer is not None:  # a folder whose tokenizer does not encode for its model fails only when used
        check_tokenizer_fits(tokenizer, model.config, f"{os.fspath(save_dir)} (given to save_for_hub)")
    card = _hub_card(model, tokenizer, card, card_data)
    return write_model_folder(model, save_dir, tokenizer, card, overwrite=overwrite, verify=_verify,
                              max_shard_size=max_shard_size)


def write_checkpoint(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    save_dir: str | os.PathLike,
    *,
    card: Any = None,
    card_data: Mapping[str, Any] | None = None,
    max_shard_size: int | str = "5GB",
) -> Path:
    """`save_for_hub` into ``save_dir`` in place, over what is there (for a folder being written, such as a
    training run's own output folder)."""
    card = _hub_card(model, tokenizer, card, card_data)
    return write_model_folder(model, save_dir, tokenizer, card, in_place=True, verify=_verify, check=False,
                              max_shard_size=max_shard_size)


def _hub_card(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, card: Any,
              card_data: Mapping[str, Any] | None) -> Any:
    """Ready ``model`` and ``tokenizer`` for a Hub checkpoint (`prepare_for_hub`; the record of untrained weights
    dropped once they have changed) and return its card: ``card``, or a call that makes one with `make_model_card`
    once the weights and config are written (the config then names the model's class)."""
    from .modelcard import make_model_card

    prepare_for_hub(model, tokenizer)
    config = model.config
    if getattr(config, UNTRAINED_WEIGHTS, None) and not untrained_weights(model):
        delattr(config, UNTRAINED_WEIGHTS)  # trained since it was recorded
    if card is not None:
        if card_data:
            raise ValueError("Give either card or card_data, not both.")
        return card
    fitted = {index: bool(router.fitted) for index, router in model.cluster_routers().items()}
    mask = {"mask_token": tokenizer.mask_token} if getattr(tokenizer, "mask_token", None) else {}
    return lambda: make_model_card(config, **{"centroids_fitted": fitted, **mask, **dict(card_data or {})})


def _verify(folder: Path) -> None:
    """Raise `ValueError` when the folder being written is no self-contained checkpoint (`check_hub_checkpoint`)."""
    problems = check_hub_checkpoint(folder, hub_files(folder)[0])
    if problems:
        raise ValueError(f"{folder} is not a self-contained checkpoint: " + "; ".join(problems))


def hub_code_imports(path: str | os.PathLike) -> set[str]:
    """Top-level packages a code file needs, as transformers' remote-code loader sees them (``try`` blocks and
    relative imports excluded)."""
    return set(get_imports(path))


def hub_files(path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The files of a checkpoint directory `push_model` uploads, and those it skips.

    Skipped: pickle files (``training_args.bin``, optimizer and RNG states), Trainer checkpoint folders
    (``checkpoint-*``) and hidden files. Paths are relative, with ``/``.
    """
    path = Path(path)
    uploaded, skipped = [], []
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        name = file.relative_to(path).as_posix()
        parts = name.split("/")
        skip = (
            name.endswith(PICKLE_SUFFIXES)
            or (len(parts) > 1 and parts[0].startswith(_TRAINER_CHECKPOINT_PREFIX))
            or any(part.startswith(".") for part in parts)
        )
        (skipped if skip else uploaded).append(name)
    return uploaded, skipped


def check_hub_checkpoint(path: str | os.PathLike, files: Sequence[str] | None = None) -> list[str]:
    """Problems that would stop a checkpoint directory from loading without this package (empty when fine).

    Checks ``config.json`` (model type, every `hub_auto_map` entry, the custom pipeline), the code files and their
    imports (standard library, torch, transformers, huggingface_hub and each other only), safetensors weights and
    the absence of pickle files among ``files`` (relative paths; default: every file in ``path``).
    """
    path = Path(path)
    problems = []
    config_file = path / "config.json"
    if not config_file.is_file():
        return [f"no config.json in {path}"]
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.get("model_type") != ClusterFormerConfig.model_type:
        problems.append(f"config.json has model_type {config.get('model_type')!r}, not 'clusterformer'")
    else:
        try:  # a value the config does not take
            ClusterFormerConfig.from_dict({k: v for k, v in config.items() if k != "model_type"})
        except ConfigValueError as error:
            problems.append(str(error.at(path)).rstrip("."))
    architectures = config.get("architectures") or []
    question_answering = any(name.endswith("ForQuestionAnswering") for name in architectures)
    auto_map = config.get("auto_map") if isinstance(config.get("auto_map"), dict) else {}
    own = {getattr(find_head(name), "auto_class", None) for name in architectures}
    for key, target in hub_auto_map(bool(own - {None})).items():
        # the config, the base model and the checkpoint's own head are needed; other heads' entries need to be right
        needed = key in ("AutoConfig", "AutoModel") or key in own
        if (needed or key in auto_map) and auto_map.get(key) != target:
            problems.append(f"config.json auto_map[{key!r}] is {auto_map.get(key)!r}, expected {target!r}")
    needed = list(CODE_FILES[:2])
    pipelines = config.get("custom_pipelines") if isinstance(config.get("custom_pipelines"), dict) else {}
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
    if files is None:
        files = [p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()]
    if not any(name.endswith(".safetensors") for name in files):
        problems.append("no .safetensors weights")
    pickled = [name for name in files if name.endswith(PICKLE_SUFFIXES)]
    if pickled:
        problems.append(f"pickle files present: {pickled}")
    return problems


# ----------------------------------------------------------------------------------------------------------------
# Push
# ----------------------------------------------------------------------------------------------------------------


def check_repo_id(repo_id: str) -> None:
    """Raise `ValueError` in one line when ``repo_id`` is no Hub repo id (``NAME`` or ``USER/NAME``), saying so
    before any connection; a local path gets its own line (push takes the checkpoint folder first)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        if os.path.exists(repo_id) or repo_id.startswith(("/", "./", "../", "~")):
            raise ValueError(
                f"{repo_id} is a local path, not a Hub repo id; push uploads the checkpoint folder (first) to a Hub "
                "repo id (second) such as user/my-model."
            ) from error
        raise ValueError(
            f"{repo_id} is not a Hub repo id: give NAME or USER/NAME of letters, digits, '-', '_' and '.' (not "
            f"starting or ending with '-' or '.', no '--' or '..', at most 96 characters), such as user/my-model."
        ) from error


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
    """Upload a checkpoint directory (from `save_for_hub`, ``clusterformer train`` or `convert_checkpoint`)
    to a Hub model repo.

    Uploads the files `hub_files` lists and skips the rest (pickle files, Trainer checkpoint folders); those files
    are checked with `check_hub_checkpoint` first. The repo (and branch ``revision``) is created when missing.

    Returns:
        The `huggingface_hub.CommitInfo` of the upload (``.oid``, ``.commit_url``).

    Raises:
        ValueError: ``repo_id`` is no Hub repo id, the uploaded files do not make a self-contained Cluster-Former
            checkpoint, or its weights hold NaN or inf.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    check_repo_id(repo_id)
    uploaded, _ = hub_files(local_dir)
    problems = check_hub_checkpoint(local_dir, uploaded)
    if problems:
        raise ValueError(f"Refusing to push {local_dir}: " + "; ".join(problems))
    from .loading import check_finite_file

    check_finite_file(local_dir, "a push")
    api = HfApi(endpoint=endpoint, token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id
    if revision is not None and not create_pr:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(Path(local_dir) / name)) for name in uploaded
    ]
    return api.create_commit(
        repo_id,
        operations,
        commit_message=commit_message,
        repo_type="model",
        revision=revision,
        create_pr=create_pr,
    )

