"""Converting a RoBERTa, BERT-family or Cluster-Former checkpoint into a self-contained Cluster-Former one, in one
pass: read the source (its config, tokenizer and weights; BERT's mapped into RoBERTa's layout), build the config with
the given options, check it (position budget, centroid memory, tensor shapes), then write it (`hf_clusterformer.hub
.save_for_hub`). `load_qa_model` does the same in memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import torch
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

import hf_clusterformer_heads
from hf_clusterformer_files import TOKENIZER_FILES, check_output_dir
from hf_clusterformer_heads import Head, architectures_task, find_head

from . import modeling_clusterformer
from .configuration_clusterformer import (
    DEFAULT_GLOBAL_LAYER_TYPE,
    GLOBAL_LAYER_TYPES,
    PRETRAINED_ENCODER,
    PRETRAINED_GLOBAL_LAYER_TYPE,
    ClusterFormerConfig,
    ConfigValueError,
    check_context_length,
)
from .hub import save_for_hub
from .loading import check_checkpoint_source, load_tokenizer
from .modeling_clusterformer import (
    DRAWN_HEAD_RECORD,
    ClusterFormerForQuestionAnswering,
    drawn_weights,
    mark_untrained,
    untrained_weights,
)

__all__ = ["convert_checkpoint", "load_qa_model", "suggested_num_clusters"]

logger = logging.getLogger(__name__)


@dataclass
class ConvertedCheckpoint:
    """Result of `convert_checkpoint`."""

    path: Path
    config: ClusterFormerConfig
    #: Parameters the source did not have (e.g. ``qa_outputs.*`` from a plain encoder: train before use).
    newly_initialized: list[str] = field(default_factory=list)
    has_tokenizer: bool = False
    #: ``model_type`` of the source checkpoint (``roberta``, ``bert`` or ``clusterformer``).
    source_type: str = "roberta"
    #: The head built, its key in `hf_clusterformer_heads.HEADS` (``qa``, ``mlm``, ...).
    task: str = "qa"
    #: Cluster layers of the source whose fitted centroids the result does not carry (another layout).
    dropped_centroids: list[int] = field(default_factory=list)


class ConversionTaskError(ValueError):
    """A head that does not fit the source of `convert_checkpoint`: one it lacks (new, untrained weights) without
    ``allow_untrained``, or none named for a source without a head. One line; ``command`` says the same in the terms of
    ``clusterformer convert`` (``--task fill-mask``, ``--allow-untrained``)."""

    def __init__(self, message: str, command: str):
        super().__init__(message)
        self.command = command


@dataclass(frozen=True)
class ModelOption:
    """One of Cluster-Former's own options of `ClusterFormerConfig` (a row of `model_options`)."""

    name: str
    #: The field's annotation, e.g. ``list[int] | None``.
    type: Any
    #: The field's default.
    default: Any
    #: The field's help text (its ``metadata["help"]``).
    help: str
    #: Type of one command-line value (``int``, ``str`` or ``bool``).
    item_type: type
    #: A command-line flag takes a list of values (the option takes only lists).
    many: bool
    #: The values allowed, when they are few.
    choices: tuple[str, ...] | None = None


#: The constructor shortcuts of ``layer_kinds`` as options (flags that spell it by indices and one kind).
_SHORTCUT_OPTIONS = (
    ModelOption("cluster_layers", list[int] | None, None,
                "0-based indices of the global layers, all others sliding (none: a sliding-window model); "
                "shortcut for layer_kinds, default the paper's layers scaled to the depth", int, True),
    ModelOption("global_layer_type", str | list[str] | None, None,
                "the kind of each of cluster_layers, one for all or one per entry; shortcut for layer_kinds, default "
                f"{PRETRAINED_GLOBAL_LAYER_TYPE} for a RoBERTa/BERT source (at first its reader exactly), "
                f"{DEFAULT_GLOBAL_LAYER_TYPE} for a new model", str, True, GLOBAL_LAYER_TYPES),
)


def model_options() -> dict[str, ModelOption]:
    """Cluster-Former's own options by name: the fields `ClusterFormerConfig` adds to RoBERTa's (type, default and help
    from the field; the values of a `Literal` as choices), with the ``layer_kinds`` shortcuts after ``window_stride``.

    The one table of model options: `convert_checkpoint`, ``clusterformer convert``, run_qa's model flags and the
    benchmarks read their names, types, defaults and help from it.
    """
    table: dict[str, ModelOption] = {}
    for option in fields(ClusterFormerConfig):
        if "help" not in option.metadata:
            continue
        literal = get_origin(option.type) is Literal  # one of a few values, e.g. route_by
        alternatives = [option.type] if literal else [t for t in get_args(option.type) or (option.type,)
                                                      if t is not type(None)]
        scalars = [t for t in alternatives if not get_args(t) or get_origin(t) is Literal]
        item = (scalars or [get_args(t)[0] for t in alternatives])[0]
        choices = get_args(item) if get_origin(item) is Literal else None
        table[option.name] = ModelOption(option.name, option.type, option.default, option.metadata["help"],
                                         type(choices[0]) if choices else item, not scalars, choices)
        if option.name == "window_stride":
            table.update((shortcut.name, shortcut) for shortcut in _SHORTCUT_OPTIONS)
    return table


def suggested_num_clusters(context_tokens: int, window_stride: int, minimum: int = 16) -> int:
    """Clusters per layer so that the average cluster fits one chunk: a power of two, at least ``minimum``."""
    if context_tokens < 1 or window_stride < 1:
        raise ValueError(f"context_tokens and window_stride must be positive, got {context_tokens}, {window_stride}.")
    return 1 << (max(minimum, -(-context_tokens // window_stride)) - 1).bit_length()


def checkpoint_model_type(path: str | os.PathLike, **hub_kwargs: Any) -> str | None:
    """The ``model_type`` in the ``config.json`` of a checkpoint directory or Hub id (``None`` when it has none)."""
    config, _ = PretrainedConfig.get_config_dict(path, **hub_kwargs)
    return config.get("model_type")


#: Source model types `convert_checkpoint` takes.
CONVERTIBLE_TYPES = ("roberta", "bert", ClusterFormerConfig.model_type)
#: BERT configuration fields that carry over unchanged.
_BERT_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "type_vocab_size", "initializer_range", "layer_norm_eps",
)


def _bert_as_roberta(
    src, source_config, tokenizer, hub_kwargs, head: Head
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A BERT-family checkpoint in the RoBERTa layout the model subclasses.

    RoBERTa numbers positions from ``pad_token_id + 1``, BERT from 0, so the position table gets ``pad_token_id + 1``
    leading zero rows: slot ``s`` of every window then reads BERT's row ``s``. ``[CLS]``/``[SEP]`` become the
    bos/eos ids, so the ``[CLS] Q [SEP] C [SEP]`` template is found by its one separator. The weights of the ``head``
    (its row of `hf_clusterformer_heads.HEADS`) that the source has are mapped by its ``bert_weights``
    (``cls.predictions`` to ``lm_head`` for ``fill-mask``).

    Returns:
        (config values, state dict with ``roberta.*`` keys and the head's keys the source has).
    """
    import transformers
    from transformers.utils import logging as hf_logging

    if head.task == "fill-mask" and source_config.hidden_act != "gelu":
        raise ValueError(f"{src}'s MLM head uses {source_config.hidden_act!r}; RoBERTa's LM head, which "
                         "Cluster-Former uses, applies gelu, so its logits would differ.")
    auto_class = getattr(transformers, head.auto_class)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the head a plain encoder lacks is reported once, by the caller
    try:
        source, info = auto_class.from_pretrained(src, output_loading_info=True, **hub_kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = {"roberta." + k[len("bert."):] if k.startswith("bert.") else k for k in info["missing_keys"]}
    pad = source_config.pad_token_id if source_config.pad_token_id is not None else 0
    cls_id = getattr(tokenizer, "cls_token_id", None) if tokenizer is not None else None
    sep_id = getattr(tokenizer, "sep_token_id", None) if tokenizer is not None else None
    values = {name: getattr(source_config, name) for name in _BERT_FIELDS}
    values.update(
        max_position_embeddings=source_config.max_position_embeddings + pad + 1,
        pad_token_id=pad,
        bos_token_id=cls_id if cls_id is not None else 101,
        eos_token_id=sep_id if sep_id is not None else 102,
        pair_token_types=source_config.type_vocab_size > 1,
        id2label=source_config.id2label,  # a classification head's labels
        problem_type=source_config.problem_type,
        classifier_dropout=getattr(source_config, "classifier_dropout", None),
    )
    state = {}
    for key, tensor in source.state_dict().items():
        if key.startswith("bert."):
            key = "roberta." + key[len("bert."):]
        if key.endswith("embeddings.position_embeddings.weight"):
            tensor = torch.cat([tensor.new_zeros(pad + 1, tensor.shape[1]), tensor])
        mapped = [(old, new) for old, new in head.bert_weights.items() if key.startswith(old)]
        if mapped and key not in missing:
            state[mapped[0][1] + key[len(mapped[0][0]):]] = tensor
        elif key.startswith("roberta.") and not key.endswith("position_ids") and not key.startswith("roberta.pooler."):
            state[key] = tensor
    return values, state


def convert_checkpoint(
    src: str | os.PathLike, dst: str | os.PathLike, *, num_hidden_layers: int | None = None,
    tokenizer: str | os.PathLike | None = None, card_data: Mapping[str, Any] | None = None,
    revision: str | None = None, token: str | bool | None = None, overwrite: bool = False, seed: int = 0,
    task: str | None = None, allow_untrained: bool = True, **options: Any,
) -> ConvertedCheckpoint:
    """Turn a RoBERTa, BERT-family (BERT, MiniLM, bge, e5) or Cluster-Former checkpoint into a self-contained
    Cluster-Former one.

    Encoder weights (and the head when present) load 1:1, BERT's into the RoBERTa layout (`_bert_as_roberta`); cluster
    layers get seeded, unfitted centroids; a head the source lacks is new. The tokenizer is saved with the result.

    Args:
        src: Hub id or directory of a ``roberta``, ``bert`` or ``clusterformer`` checkpoint.
        dst: output directory, written by `save_for_hub`.
        num_hidden_layers: keep only the first this many encoder layers (a shallower, faster model).
        tokenizer: where to load the tokenizer from (default ``src``; a missing tokenizer there is skipped with a
            warning, one whose files are there or one named here must load).
        card_data: extra `make_model_card` arguments; ``base_model`` defaults to ``src`` when it is a Hub id.
        revision, token: for loading ``src`` from the Hub.
        overwrite: replace a model already in ``dst`` (see `save_for_hub`); without it such a folder is refused
            with `ModelFolderExistsError` before anything is loaded.
        seed: seeds every new weight (a new head): two conversions of one source give the same checkpoint. New
            weights are recorded as untrained (`hf_clusterformer.modeling_clusterformer.mark_untrained`; refused
            until trained).
        task: the head, a pipeline task of `hf_clusterformer_heads.HEADS` (``fill-mask``, ...) or its key (``mlm``,
            ...); a source's own head of that kind loads 1:1 (BERT's mapped by its ``bert_weights``). Default: a
            Cluster-Former source's own head (a bare `ClusterFormerModel` needs a ``task``), else question answering.
        allow_untrained: build a head the source lacks (or holds untrained); without it, `ConversionTaskError`.
        options: the Cluster-Former options (`model_options`: ``layer_kinds``, ``cluster_layers``, ``num_clusters``,
            ``window_size``, ...); one left out or ``None`` keeps a Cluster-Former source's own value, else the config
            default (``cluster_layers``: the paper's placement scaled to the depth).

    Raises: `ValueError`: ``src`` is not convertible, or the options are invalid (`ConversionTaskError`: the head does
    not fit the source). `TypeError`: not a model option.
    """
    src = check_checkpoint_source(src, "src")
    asked = _asked_head(task)
    check_output_dir(dst, overwrite)
    options = _conversion_options(options)
    hub_kwargs = {"revision": revision, "token": token}
    source = _convertible_config(src, hub_kwargs)
    heads = _conversion_heads(asked, source, src)  # decided once, passed on
    _check_qa_outputs(source, src, heads)
    options.update(_kept_depth(num_hidden_layers, source, src))
    loaded_tokenizer = _conversion_tokenizer(src, tokenizer, hub_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # new weights are drawn from the global generator
        model, newly_initialized = _converted_model(src, source, loaded_tokenizer, options, hub_kwargs, heads)
    untrained = sorted(set(newly_initialized) | set(untrained_weights(model)))  # a source's own record too
    if untrained and not allow_untrained:  # before anything is written
        raise _untrained_head_error(src, heads, newly_initialized, untrained)
    if newly_initialized:  # returned, and printed by the command line: logged once, at info level
        logger.info("Newly initialised (not in %s): %s; fine-tune before use.", src, ", ".join(newly_initialized))
    mark_untrained(model, untrained)
    dropped = _dropped_centroids(src, model)
    hub_id = {} if Path(src).exists() else {"base_model": str(src)}
    save_for_hub(model, loaded_tokenizer, dst, card_data={**hub_id, **dict(card_data or {})}, overwrite=overwrite)
    return ConvertedCheckpoint(Path(dst), model.config, newly_initialized, loaded_tokenizer is not None,
                               source.model_type, heads.built.key, dropped)


def _dropped_centroids(src: str | os.PathLike, model: PreTrainedModel) -> list[int]:
    """Cluster layers of a local source whose centroids were fitted and are not fitted in ``model`` (warned)."""
    from .modelcard import checkpoint_centroids_fitted

    before = checkpoint_centroids_fitted(src) if Path(src).is_dir() else None
    after = {index: bool(router.fitted) for index, router in model.cluster_routers().items()}
    dropped = sorted(index for index, fitted in (before or {}).items() if fitted and not after.get(index))
    if dropped:
        logger.warning("%s's fitted centroids of cluster layers %s do not fit the new cluster layout and were "
                       "dropped; fit them again by training.", src, dropped)
    return dropped


def _asked_head(task: str | None) -> Head | None:
    """The head a ``task`` given to `convert_checkpoint` names, by its pipeline task or its key (``qa``, ``mlm``,
    ...); ``None`` when none is given. Checked before anything loads."""
    head = find_head(task) if task is not None else None
    if task is None or (head is not None and task != head.class_name):
        return head
    keys = ", ".join(head.key for head in hf_clusterformer_heads.HEADS)
    tasks = ", ".join(head.task for head in hf_clusterformer_heads.HEADS)
    raise ValueError(f"task must be one of {keys} (or {tasks}), got {task!r}.")


def _spelt(head: Head, command: bool) -> str:
    """A head as the library (``task='mlm'``) or the command (``--task fill-mask``) takes it."""
    return f"--task {head.task}" if command else f"task={head.key!r}"


@dataclass(frozen=True)
class ConversionHeads:
    """The one decision of a conversion about heads, which every step after it reads."""

    #: The head the result has: the one asked for, else a Cluster-Former source's own, else question answering.
    built: Head
    #: The source's own head (by its ``architectures``), ``None`` for an encoder without one.
    own: Head | None

    @property
    def other(self) -> Head | None:
        """The source's own head when it is not the one built (its weights are not the result's)."""
        return self.own if self.own not in (None, self.built) else None


def _conversion_heads(asked: Head | None, source: PretrainedConfig, src: str | os.PathLike) -> ConversionHeads:
    """Which head a conversion of ``source`` builds and which one the source has (`ConversionHeads`): the table of
    heads is asked here, once. `ConversionTaskError` when no head is asked of a bare `ClusterFormerModel`."""
    own = find_head(architectures_task(source.architectures))
    if asked is not None:
        return ConversionHeads(asked, own)
    if source.model_type != ClusterFormerConfig.model_type or not source.architectures:
        return ConversionHeads(find_head("question-answering"), own)
    if own is not None:
        return ConversionHeads(own, own)

    def message(command: bool) -> str:
        choices = ", ".join(_spelt(head, command) for head in hf_clusterformer_heads.HEADS)
        return (f"{src} holds a {source.architectures[0]}, which has no head to keep; name the head to build "
                f"({choices}), and {'--allow-untrained' if command else 'allow_untrained=True'}: it is new.")

    raise ConversionTaskError(message(False), message(True))


def _untrained_head_error(
    src: str | os.PathLike, heads: ConversionHeads, new: list[str], untrained: list[str]
) -> ConversionTaskError:
    """The refusal of a head the source lacks (``new`` weights) or holds untrained: what, and the two ways on."""
    head, own = heads.built.name, heads.other

    def message(command: bool) -> str:
        flag = "--allow-untrained" if command else "allow_untrained=True"
        if not new:
            return (f"the {head} head of {src} ({', '.join(untrained)}) was never trained; train it first, or pass "
                    f"{flag} to convert it as it is.")
        return (f"{src} has no {head} head: {', '.join(untrained)} would be new, untrained weights"
                + (f" (its own head is {own.name}: {_spelt(own, command)} keeps it)" if own else "")
                + f"; pass {flag} to convert it for fine-tuning.")

    return ConversionTaskError(message(False), message(True))


def _check_qa_outputs(source: PretrainedConfig, src: str | os.PathLike, heads: ConversionHeads) -> None:
    """A question-answering source whose head gives other than 2 outputs (start, end) per token cannot become a QA
    model (its ``qa_outputs`` would load as they are and the logits mean something else): `ValueError`, one line."""
    outputs = getattr(source, "num_labels", 2)
    if heads.built.task == "question-answering" and heads.own is heads.built and outputs != 2:
        raise ValueError(f"{src}'s question-answering head gives {outputs} outputs per token (num_labels={outputs}), "
                         "not the 2 (start, end) a QA model reads; convert a question-answering checkpoint whose "
                         "head has 2 outputs, or name another head with --task.")


def _conversion_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The model options given to `convert_checkpoint` that set something (sequences as lists), checked by name."""
    known = model_options()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(
            f"convert_checkpoint got unknown option(s) {unknown}; the model options are {', '.join(known)}."
        )
    check_context_length(options.get("max_context_length"))
    return {name: list(value) if isinstance(value, (list, tuple)) else value
            for name, value in options.items() if value is not None}


def _kept_depth(num_hidden_layers: int | None, source: PretrainedConfig, src: str | os.PathLike) -> dict[str, int]:
    """``{"num_hidden_layers": n}`` when a depth is asked for (at most the source's), else nothing."""
    if num_hidden_layers is None:
        return {}
    if not 0 < num_hidden_layers <= source.num_hidden_layers:
        raise ValueError(f"num_hidden_layers must be in [1, {source.num_hidden_layers}] (the layers of {src}), got "
                         f"{num_hidden_layers}.")
    return {"num_hidden_layers": num_hidden_layers}


def _convertible_config(src: str | os.PathLike, hub_kwargs: dict[str, Any]) -> PretrainedConfig:
    """The config of ``src``; `ValueError` unless its type is one of `CONVERTIBLE_TYPES` (a value its file holds that
    the config does not take: `ConfigValueError`, naming the file)."""
    source = _auto_config(src, hub_kwargs)
    if source.model_type not in CONVERTIBLE_TYPES:
        raise ValueError(
            f"{src} is a {source.model_type!r} checkpoint; convertible types are {', '.join(CONVERTIBLE_TYPES)}."
        )
    return source


def _auto_config(src: str | os.PathLike, hub_kwargs: dict[str, Any]) -> PretrainedConfig:
    """``AutoConfig.from_pretrained(src)``, a value of its file that the config does not take named with the file."""
    try:
        return AutoConfig.from_pretrained(src, **hub_kwargs)
    except ConfigValueError as error:
        raise error.at(src) from None


def _conversion_tokenizer(
    src: str | os.PathLike, tokenizer: str | os.PathLike | None, hub_kwargs: dict[str, Any]
) -> PreTrainedTokenizerBase | None:
    """The tokenizer of ``tokenizer`` (which must load) or else of ``src`` (``None``, with a warning, when it has none;
    one whose files are there must load)."""
    try:
        return load_tokenizer(tokenizer if tokenizer is not None else src, **hub_kwargs)
    except ValueError:
        if tokenizer is not None or any(os.path.isfile(os.path.join(src, name)) for name in TOKENIZER_FILES):
            raise  # one named, or one whose files are there, must load: a model is never written without it
        logger.warning(f"{src} holds no tokenizer files; the checkpoint is written without one (to include one, give "
                       "its folder or Hub id as tokenizer=, or --tokenizer of clusterformer convert).")
        return None


def _plain_values(source: PretrainedConfig) -> dict[str, Any]:
    """A RoBERTa or Cluster-Former config's values without what names its file, class or code."""
    dropped = ("model_type", "architectures", "auto_map", "custom_pipelines", "transformers_version", "_name_or_path")
    return {k: v for k, v in source.to_dict().items() if k not in dropped}


def _merged_config(values: Mapping[str, Any], options: Mapping[str, Any]) -> ClusterFormerConfig:
    """A source's config values with the given model options over them, as `from_pretrained` takes overrides (the
    layer-kind shortcuts over a Cluster-Former source's kinds, a pretrained encoder's global layers
    `PRETRAINED_GLOBAL_LAYER_TYPE` unless named: `ClusterFormerConfig.from_dict`); checked when the model is built."""
    return ClusterFormerConfig.from_dict(dict(values), **options)


@contextlib.contextmanager
def _drawn_head_said_here() -> Iterator[None]:
    """Drop the modeling file's warning of a head drawn at load: conversion and `load_qa_model` record the head and
    say it themselves (refused, returned, or printed by the command line)."""
    modeling_logger = logging.getLogger(modeling_clusterformer.__name__)

    def drop(record: logging.LogRecord) -> bool:
        return not getattr(record, DRAWN_HEAD_RECORD, False)

    modeling_logger.addFilter(drop)
    try:
        yield
    finally:
        modeling_logger.removeFilter(drop)


def _converted_model(
    src, source, tokenizer, options, hub_kwargs, heads: ConversionHeads
) -> tuple[PreTrainedModel, list[str]]:
    """The Cluster-Former model of a source checkpoint with the head ``heads.built``, and the names of its parameters
    the source lacks (`drawn_weights`)."""
    model_class = getattr(modeling_clusterformer, heads.built.class_name)
    state = None
    if source.model_type == "bert":
        values, state = _bert_as_roberta(src, source, tokenizer, hub_kwargs, heads.built)
    else:
        values = _plain_values(source)
    config = _merged_config({**values, PRETRAINED_ENCODER: True}, options)  # trained weights, whatever the source
    if state is None:
        # centroids saved for another cluster layout start afresh (seeded, not fitted)
        with _drawn_head_said_here():
            model, info = model_class.from_pretrained(
                src, config=config, output_loading_info=True, ignore_mismatched_sizes=True, **hub_kwargs
            )
        mismatched = [key for key, *_ in info["mismatched_keys"]]
        other_head = [k for k in mismatched if heads.other is not None and not k.startswith("roberta.")]
        stray = [key for key in mismatched if ".router." not in key and key not in other_head]
        if stray:
            raise ValueError(f"{src} has tensors of other shapes than its config: {', '.join(stray)}.")
        for index, router in model.cluster_routers().items():
            if any(key.startswith(f"roberta.encoder.layer.{index}.router.") for key in mismatched):
                router.centroids.copy_(router.initial_centroids())
                router.fitted.fill_(False)
        missing = [*info["missing_keys"], *other_head]  # another task's head: new weights, as if it were absent
    else:
        model = model_class(config)
        missing = model.load_state_dict(state, strict=False).missing_keys
        tied = {target for target, _ in getattr(model, "all_tied_weights_keys", {}).items()}
        missing = [key for key in missing if key not in tied]  # the MLM decoder: the word embeddings
    return model, sorted(drawn_weights(missing))


def load_qa_model(
    path: str | os.PathLike, *, seed: int = 0, revision: str | None = None, token: str | bool | None = None,
    **options: Any,
) -> ClusterFormerForQuestionAnswering:
    """A Cluster-Former QA model from a Cluster-Former, RoBERTa or BERT-family checkpoint, in memory.

    A BERT-family checkpoint is mapped as `convert_checkpoint` maps it. Weights the checkpoint lacks (a QA head) are
    drawn with ``seed`` and recorded as untrained (`hf_clusterformer.modeling_clusterformer.mark_untrained`), so the
    pipeline refuses them. ``options`` override config values (e.g. ``max_context_length``).
    """
    check_context_length(options.get("max_context_length"))
    path = check_checkpoint_source(path)
    hub_kwargs = {"revision": revision, "token": token}
    source = _auto_config(path, hub_kwargs)
    if source.model_type not in CONVERTIBLE_TYPES:
        raise ValueError(
            f"{path} is a {source.model_type!r} checkpoint; Cluster-Former loads {', '.join(CONVERTIBLE_TYPES)}."
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if source.model_type == "bert":
            try:
                tokenizer = load_tokenizer(path, **hub_kwargs)
            except ValueError:
                tokenizer = None
            heads = _conversion_heads(find_head("question-answering"), source, path)
            model, new = _converted_model(path, source, tokenizer, options, hub_kwargs, heads)
        else:
            try:
                with _drawn_head_said_here():
                    model, info = ClusterFormerForQuestionAnswering.from_pretrained(
                        path, output_loading_info=True, **hub_kwargs, **options)
            except RuntimeError as error:  # transformers' size-mismatch report
                raise _shapes_error(path, {**hub_kwargs, **options}) from error
            new = drawn_weights(info["missing_keys"])  # not the routers' nor the zero-started routed projections
    mark_untrained(model, sorted(set(new) | set(untrained_weights(model))))
    return model


def _shapes_error(path: str | os.PathLike, kwargs: dict[str, Any]) -> ValueError:
    """One line naming the tensors of checkpoint ``path`` whose shapes its ``config.json`` does not give (a weights
    file of another model, or a hand-edited one), instead of transformers' size-mismatch report."""
    _, info = ClusterFormerForQuestionAnswering.from_pretrained(
        path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    shapes = "; ".join(f"{key} is {tuple(saved)}, its config gives {tuple(wanted)}"
                       for key, saved, wanted in info["mismatched_keys"])
    return ValueError(f"{path}'s model.safetensors does not fit its config.json ({shapes}): the weights are of "
                      "another model, or were edited; write the checkpoint again (`clusterformer convert`, or "
                      "save_for_hub).")
