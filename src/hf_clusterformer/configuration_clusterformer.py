"""Configuration of Cluster-Former models: a RoBERTa configuration plus the window and cluster options."""

import dataclasses
import json
import os
import types
from typing import Any, Literal, Union, get_args, get_origin

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassError
from transformers import RobertaConfig
from transformers.utils import logging

logger = logging.get_logger(__name__)

#: The kind of an encoder layer: ``sliding`` attends within one window (paper eq. 1-3); the global kinds attend across
#: windows (paper §3.2, §4.3): K-Means ``cluster`` layers, ``lsh`` layers and ``sparse`` layers; beyond the paper,
#: ``window_cluster`` keeps the window's attention and adds a cluster layer's, through a projection that starts at zero.
LayerKind = Literal["sliding", "cluster", "lsh", "sparse", "window_cluster"]
#: Every value `ClusterFormerConfig.layer_kinds` may hold: the sliding-window kind, then the global kinds.
LAYER_TYPES = get_args(LayerKind)
SLIDING_LAYER_TYPE, GLOBAL_LAYER_TYPES = LAYER_TYPES[0], LAYER_TYPES[1:]
#: The global kinds whose layer owns a router and sorts states into chunks by its ids.
ROUTED_LAYER_TYPES = ("cluster", "lsh", "window_cluster")
#: Constructor arguments that spell ``layer_kinds`` (read once, never stored).
LAYER_KIND_SHORTCUTS = ("cluster_layers", "global_layer_type", "layer_types")
#: Special tokens around the question in the longest question prefix ``<s> Q </s></s>``; a BERT prefix
#: ``[CLS] Q [SEP]`` has one fewer.
QUESTION_PREFIX_SPECIAL_TOKENS = 3
#: Special tokens of the longest pair encoding ``<s> Q </s></s> C </s>``.
PAIR_SPECIAL_TOKENS = QUESTION_PREFIX_SPECIAL_TOKENS + 1
#: Most context tokens a model may be set to take (``max_context_length``): 16M, far beyond one forward pass.
MAX_CONTEXT_LENGTH = 1 << 24
#: Encoder sizes that must be positive (checked before anything is built from them).
_POSITIVE_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
#: The paper puts Cluster-Former layers at layers 15 and 20 of the 24-layer RoBERTa-large.
_PAPER_DEPTH, _PAPER_CLUSTER_LAYERS = 24, (15, 20)


def default_cluster_layers(num_hidden_layers: int) -> list[int]:
    """0-based encoder layer indices that reproduce the paper's placement, scaled to the model depth.

    The paper's "layers 15 and 20" are read as 0-based indices (the 16th and 21st of 24 layers, the numbering of the
    paper's fairseq code and of Table 4's rule ``l % 5 == 0 and l >= 15``), scaled by ``num_hidden_layers / 24`` and
    rounded; layer 0 is never a cluster layer, because a cluster layer needs a sliding-window layer below it.
    """
    if num_hidden_layers < 2:
        return []
    scaled = {min(num_hidden_layers - 1, max(1, int(index * num_hidden_layers / _PAPER_DEPTH + 0.5)))
              for index in _PAPER_CLUSTER_LAYERS}
    return sorted(scaled)


def layer_kinds_from_shortcuts(num_hidden_layers: int, cluster_layers: list[int] | None = None,
                               global_layer_type: str | list[str] | None = None, stored: list[str] | None = None
                               ) -> list[str]:
    """``layer_kinds`` spelled by the shortcuts: ``global_layer_type`` (one kind, or one per sorted index) at the
    ``cluster_layers`` indices, ``"sliding"`` elsewhere: the one derivation of the layer kinds.

    A shortcut left out (``None``) keeps what the ``stored`` kinds say (their global layers within the depth; their
    kind, or each its own where the indices stay), else takes the default (`default_cluster_layers`, ``"cluster"``).
    Raises `ValueError` naming the shortcut that does not fit.
    """
    kept = [i for i, kind in enumerate(stored or ()) if kind != SLIDING_LAYER_TYPE and i < num_hidden_layers]
    if cluster_layers is None:
        cluster_layers = kept if stored is not None else default_cluster_layers(num_hidden_layers)
    if not isinstance(cluster_layers, (list, tuple)) or any(type(i) is not int for i in cluster_layers):
        raise ValueError(f"cluster_layers must be a list of layer indices, got {cluster_layers!r}.")
    layers = sorted(set(cluster_layers))
    for index in layers:
        if not 0 <= index < num_hidden_layers:
            valid = f"valid: 0..{num_hidden_layers - 1}" if num_hidden_layers > 0 else "the model has no layers"
            raise ValueError(f"cluster_layers holds {index}, outside the {num_hidden_layers} encoder layers ({valid}).")
    if global_layer_type is None:
        own = [stored[i] for i in kept]
        global_layer_type = own[0] if len(set(own)) == 1 else own if own and layers == kept else "cluster"
    kinds = [global_layer_type] * len(layers) if isinstance(global_layer_type, str) else list(global_layer_type)
    for kind in kinds:
        if kind not in GLOBAL_LAYER_TYPES:
            raise ValueError(f"global_layer_type {kind!r} is unknown; choose from {GLOBAL_LAYER_TYPES}.")
    if len(kinds) != len(layers):
        raise ValueError(f"global_layer_type lists {len(kinds)} kinds but cluster_layers has {len(layers)} entries; "
                         "give one kind or one per cluster layer.")
    result = [SLIDING_LAYER_TYPE] * num_hidden_layers
    for index, kind in zip(layers, kinds):
        result[index] = kind
    return result


def suggested_num_clusters(context_tokens: int, window_stride: int, minimum: int = 16) -> int:
    """Clusters per cluster layer for contexts of about ``context_tokens`` tokens.

    States are sorted by (cluster, position) and cut into chunks of ``window_stride``, so a cluster with more members
    than a chunk is split by position. The next power of two of ``context_tokens / window_stride`` (at least
    ``minimum``) keeps the average cluster within one chunk.
    """
    if context_tokens < 1 or window_stride < 1:
        raise ValueError(f"context_tokens and window_stride must be positive, got {context_tokens}, {window_stride}.")
    needed = max(minimum, -(-context_tokens // window_stride))
    return 1 << (needed - 1).bit_length()


def required_position_embeddings(max_question_length: int, window_size: int, pad_token_id: int | None = 1) -> int:
    """Position embeddings a window ``<s> Q </s></s> C[window]`` needs: ``pad + 1 + (q + 3) + l``.

    RoBERTa positions start at ``pad_token_id + 1`` (2 for RoBERTa's padding index 1), so RoBERTa configs need
    ``max_position_embeddings >= q + 3 + l + 2``.
    """
    first_position = (pad_token_id if pad_token_id is not None else 0) + 1
    return first_position + max_question_length + QUESTION_PREFIX_SPECIAL_TOKENS + window_size


def check_context_length(value: int | None, name: str = "max_context_length") -> None:
    """The context bound, checked by the config and by whatever takes a ``max_context_length`` before building one:
    `ValueError` naming ``name`` unless ``value`` (``None``: not given) is an integer from 1 to `MAX_CONTEXT_LENGTH`."""
    if value is not None and (type(value) is not int or not 1 <= value <= MAX_CONTEXT_LENGTH):
        raise ValueError(f"{name} must be an integer from 1 to {MAX_CONTEXT_LENGTH}, got {value!r}.")


class ConfigValueError(ValueError):
    """A config value of the wrong type or out of range, in one line naming the file it came from (``config.json``
    until `at` names the checkpoint) and the fix."""

    def __init__(self, problem: str, where: str = "config.json"):
        super().__init__(f"{where}: {problem}")
        self.problem = problem

    def at(self, source: str | os.PathLike) -> "ConfigValueError":
        """The same error naming the config file of checkpoint ``source`` (a folder, a Hub id or the file itself)."""
        source = os.fspath(source)
        return ConfigValueError(self.problem, source if source.endswith(".json") else f"{source}/config.json")


def _shown(value: Any) -> str:
    """A value as the config file writes it."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _takes(annotation: Any) -> str:
    """What a field of type ``annotation`` takes, in words."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(_shown(arg) for arg in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_takes(arg) for arg in args)
    if origin in (list, tuple):
        return f"a list, each entry {_takes(args[0])}" if args else "a list"
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null",
             dict: "an object"}
    return words.get(annotation, annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "?"))


def _strict_error(cls: type, error: StrictDataclassError, values: dict, given: set[str]) -> ValueError:
    """One line for ``@strict``'s refusal of a field's value: `ConfigValueError` for a value of the file, a plain
    `ValueError` for one given as an override (a name in ``given``)."""
    if isinstance(error, StrictDataclassClassValidationError):  # a check of several fields (`_check_options`)
        problem = " ".join(str(error.__cause__ or error).split())
        return ValueError(problem) if given else ConfigValueError(problem)
    field = str(error).split("'")[1] if "'" in str(error) else "?"
    value = values.get(field)
    annotation = cls.__dataclass_fields__[field].type if field in cls.__dataclass_fields__ else None
    expected = _takes(annotation)
    if isinstance(value, list) and get_origin(annotation) in (Union, types.UnionType, list):
        kinds = [arg for arg in get_args(annotation) if get_origin(arg) is list]
        allowed = get_args(get_args(kinds[0])[0]) if kinds and get_origin(get_args(kinds[0])[0]) is Literal else ()
        unknown = [entry for entry in value if allowed and entry not in allowed]
        if unknown:
            problem = (f"{field} holds {', '.join(_shown(entry) for entry in unknown)}, which "
                       f"{'is' if len(unknown) == 1 else 'are'} not one of {', '.join(_shown(a) for a in allowed)}")
            return ValueError(f"{problem}.") if field in given else ConfigValueError(f"{problem}; correct it there.")
    problem = f"{field} is {_shown(value)}, but it takes {expected}"
    if field in given:
        return ValueError(f"{field}={value!r} was given, but {field} takes {expected}.")
    return ConfigValueError(f"{problem}; correct it there.")


def _option(default: Any, help: str) -> Any:
    """A config field with its help text (``metadata["help"]``)."""
    return dataclasses.field(default=default, metadata={"help": help})


@strict
class ClusterFormerConfig(RobertaConfig):
    r"""RoBERTa configuration with Cluster-Former's window and cluster options.

    Every RoBERTa checkpoint's config loads into it. Each field it adds carries its help text (``metadata["help"]``).
    ``layer_kinds`` is the one stored list of layer kinds (not named ``layer_types``, which transformers checks against
    its own attention kinds).

    Constructor shortcuts for ``layer_kinds``, read once and never stored (configs saved with them still load, and
    ``from_pretrained`` takes them as overrides of the stored kinds): ``cluster_layers`` (0-based indices of the global
    layers, all others sliding; ``[]`` gives a plain sliding-window model; default [`default_cluster_layers`] of the
    depth, ``[15, 20]`` for 24 layers) with ``global_layer_type`` (one kind for all of them or one per index, default
    ``"cluster"``), or ``layer_types`` (the list under its former name).
    """

    model_type = "clusterformer"

    window_size: int = _option(256, "tokens of context per sliding window (the paper's l)")
    window_stride: int = _option(224, "step between windows (m), 0 < m <= l; also the chunk length of the global "
                                      "layers that sort into chunks")
    layer_kinds: list[LayerKind] | None = _option(
        None, "the kind of every encoder layer: sliding (attention within each window), cluster (K-Means centroids), "
              "lsh (random hyperplane buckets), sparse (attention across windows at equal in-window position) or "
              "window_cluster (a window's attention plus a cluster layer's, added through a projection that starts at "
              "zero: at first the sliding layer exactly); default: cluster at the paper's layers scaled to the depth, "
              "sliding elsewhere")
    num_clusters: int = _option(64, "centroids per cluster layer (buckets per LSH layer)")
    max_question_length: int = _option(64, "question tokens allowed, without special tokens")
    max_context_length: int = _option(131072, "context tokens allowed in one forward pass")
    centroid_seed: int = _option(0, "seed of the random initial centroids / hash vectors")
    use_answerability_head: bool = _option(False, "add a has-answer classifier on the pooled window <s> states "
                                                  "(paper 4.2) to the QA head")
    pair_token_types: bool = _option(False, "without token_type_ids, give the context token type 1 and the question "
                                            "prefix type 0, as BERT's pair template does (BERT-family checkpoints)")
    chunk_question_prefix: bool = _option(False, "beyond the paper: prefix every chunk of a cluster/LSH layer with its "
                                                 "example's question prefix and route only context tokens")
    route_by: Literal["states", "keys"] = _option("states", "what a routed layer's router compares with its centroids "
                                                            "(hash vectors): the layer's input states (the paper) or "
                                                            "their key projections")

    def __post_init__(self, **kwargs):
        self._check_sizes()  # before the layer kinds are derived from the depth
        given = {name: kwargs.pop(name) for name in LAYER_KIND_SHORTCUTS if name in kwargs}
        given = {name: value for name, value in given.items() if value is not None}
        if "layer_types" in given:
            former = list(given.pop("layer_types"))
            if self.layer_kinds is not None and list(self.layer_kinds) != former:
                raise ValueError(f"layer_types {former} disagrees with layer_kinds {self.layer_kinds}; "
                                 "give layer_kinds.")
            self.layer_kinds = former
        if self.layer_kinds is None or given:
            kinds = layer_kinds_from_shortcuts(self.num_hidden_layers, stored=self.layer_kinds, **given)
            if self.layer_kinds is not None and kinds != list(self.layer_kinds):
                raise ValueError(f"{' / '.join(f'{k} {v!r}' for k, v in given.items())} disagree with layer_kinds "
                                 f"{self.layer_kinds}; give only one of them.")
            self.layer_kinds = kinds
        self._check_options()
        super().__post_init__(**kwargs)

    def __setattr__(self, key, value):  # a shortcut set after construction would be saved, then clash on loading
        if key in LAYER_KIND_SHORTCUTS[:2]:
            raise AttributeError(f"{key} is a constructor argument, not a stored field; set config.layer_kinds "
                                 "(one kind per layer) instead.")
        super().__setattr__(key, value)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """`PreTrainedConfig.from_dict`, where the layer-kind shortcuts and ``num_hidden_layers`` given as overrides
        (``from_pretrained(path, cluster_layers=[])``) apply over the stored kinds: what they leave out keeps its stored
        value (the global layers within the depth, their kinds)."""
        overrides = set(kwargs) & {*cls.__dataclass_fields__, *LAYER_KIND_SHORTCUTS}
        try:
            return cls._from_dict(dict(config_dict), **kwargs)
        except StrictDataclassError as error:  # a value of the wrong type, or an unknown layer kind
            raise _strict_error(cls, error, {**config_dict, **kwargs}, overrides) from None
        except ConfigValueError:
            raise
        except ValueError as error:  # a value out of range: the file's, when nothing overrides it
            if overrides:
                raise
            raise ConfigValueError(" ".join(str(error).split())) from None

    @classmethod
    def _from_dict(cls, config_dict: dict, **kwargs):
        if "layer_types" in kwargs:
            kwargs["layer_kinds"] = kwargs.pop("layer_types")
        given = {name: kwargs.pop(name) for name in LAYER_KIND_SHORTCUTS[:2] if name in kwargs}
        given = {name: value for name, value in given.items() if value is not None}
        if "layer_kinds" not in kwargs and (given or "num_hidden_layers" in kwargs):
            saved = cls(**config_dict)
            stored = saved.layer_kinds if {"layer_kinds", *LAYER_KIND_SHORTCUTS} & set(config_dict) else None
            depth = kwargs.pop("num_hidden_layers", saved.num_hidden_layers)
            config_dict = {k: v for k, v in config_dict.items() if k not in LAYER_KIND_SHORTCUTS}
            kinds = layer_kinds_from_shortcuts(depth, stored=stored, **given)
            config_dict.update(num_hidden_layers=depth, layer_kinds=kinds)
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args, **kwargs):
        """`PreTrainedConfig.from_pretrained`; a value of the file that the config does not take is refused in one
        line naming the file (`ConfigValueError`)."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except ConfigValueError as error:
            raise error.at(pretrained_model_name_or_path) from None

    @classmethod
    def get_config_dict(cls, *args, **kwargs):
        """A RoBERTa checkpoint's config becomes a Cluster-Former one (said once, instead of transformers' warning
        about a model of another type); any other type is refused in one line instead of loading a random model, a
        BERT-family one naming the functions that map its weights."""
        config_dict, kwargs = super().get_config_dict(*args, **kwargs)
        model_type = config_dict.get("model_type")
        source = args[0] if args else "this checkpoint"
        mapped = "hf_clusterformer.conversion.load_qa_model or convert_checkpoint"
        if model_type == "bert":
            raise ValueError(f"{source} is a BERT-family checkpoint, whose weights need mapping to RoBERTa's layout: "
                             f"load it with {mapped}.")
        if model_type not in (None, "roberta", cls.model_type):
            raise ValueError(f"{source} is a {model_type!r} checkpoint, whose weights Cluster-Former cannot use; "
                             f"give a RoBERTa or Cluster-Former checkpoint (a BERT-family one through {mapped}).")
        if model_type == "roberta":
            logger.info_once("Extending a RoBERTa checkpoint with Cluster-Former's window and cluster options.")
            config_dict = {**config_dict, "model_type": cls.model_type}
        return config_dict, kwargs

    @property
    def global_layers(self) -> list[int]:
        """0-based indices of the global (cluster, LSH or sparse) layers."""
        return [i for i, kind in enumerate(self.layer_kinds) if kind != SLIDING_LAYER_TYPE]

    @property
    def separator_token_id(self) -> int:
        """The token that ends the question: ``sep_token_id``, else ``eos_token_id`` (RoBERTa's ``</s>``)."""
        sep = getattr(self, "sep_token_id", None)
        sep = self.eos_token_id if sep is None else sep
        return sep[0] if isinstance(sep, (list, tuple)) else sep

    @property
    def max_input_length(self) -> int:
        """Longest pair encoding ``<s> Q </s></s> C </s>`` accepted: ``q + c + 4`` tokens."""
        return self.max_question_length + self.max_context_length + PAIR_SPECIAL_TOKENS

    def check_input_lengths(self, question_tokens: int, context_tokens: int, where: str = "the input") -> None:
        """Raise `ValueError` unless ``where`` has a question of at most ``max_question_length`` tokens and a
        non-empty context of at most ``max_context_length`` tokens (both without special tokens)."""
        if question_tokens > self.max_question_length:
            raise ValueError(f"the question of {where} has {question_tokens} tokens, more than max_question_length="
                             f"{self.max_question_length}; shorten the question or use a model with a larger "
                             "max_question_length (max_question_length + 3 + window_size must fit "
                             "max_position_embeddings - 2).")
        if context_tokens <= 0:
            raise ValueError(f"{where} has an empty context; give a non-empty context after the question.")
        if context_tokens > self.max_context_length:
            raise ValueError(f"the context of {where} has {context_tokens} tokens, more than max_context_length="
                             f"{self.max_context_length}; truncate it or raise max_context_length.")

    def check_position_budget(self) -> None:
        """Raise `ValueError` unless a question prefix plus a window fits RoBERTa's position table. Checked when a model
        is built (not in the config, so a RoBERTa config can be loaded first and its window options set after)."""
        needed = required_position_embeddings(self.max_question_length, self.window_size, self.pad_token_id)
        if needed > self.max_position_embeddings:
            raise ValueError(f"max_question_length ({self.max_question_length}) + 3 special tokens + window_size "
                             f"({self.window_size}) needs {needed} position embeddings, more than "
                             f"max_position_embeddings ({self.max_position_embeddings}); lower max_question_length or "
                             "window_size.")

    def validate_architecture(self):
        """Also checks the options set after the config was built (``from_pretrained`` overrides)."""
        super().validate_architecture()
        self._check_options()

    def _check_sizes(self) -> None:
        """Raise `ValueError` naming an encoder size below 1."""
        for name in _POSITIVE_SIZES:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}.")

    def _check_loadable(self) -> None:
        """Raise `ValueError` naming a field that transformers reads only when the model is built or loaded (and would
        fail on there with a traceback): an unknown ``hidden_act`` or ``dtype``, an ``auto_map`` or
        ``custom_pipelines`` that is no mapping."""
        if isinstance(self.hidden_act, str):
            from transformers.activations import ACT2CLS

            if self.hidden_act not in ACT2CLS:
                usual = ", ".join(name for name in ("gelu", "gelu_new", "relu", "silu", "tanh") if name in ACT2CLS)
                raise ValueError(f"hidden_act {self.hidden_act!r} is no activation transformers knows; use one of "
                                 f"{usual}, ... (RoBERTa's is gelu).")
        dtype = getattr(self, "dtype", None)
        if isinstance(dtype, str) and dtype != "auto":
            import torch

            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise ValueError(f"dtype {dtype!r} is no torch dtype; use float32, float16 or bfloat16.")
        for name in ("auto_map", "custom_pipelines"):
            if not isinstance(getattr(self, name, None) or {}, dict):
                raise ValueError(f"{name} must be an object (names to classes), got {getattr(self, name)!r}.")

    def _check_options(self) -> None:
        """Raise `ValueError` naming the field whose value is out of range (`@strict` checks the types)."""
        self._check_sizes()
        for name in ("window_size", "num_clusters", "max_question_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if not 0 < self.window_stride <= self.window_size:
            raise ValueError(f"window_stride must satisfy 0 < window_stride <= window_size ({self.window_size}), "
                             f"got {self.window_stride}.")
        check_context_length(self.max_context_length)
        if len(self.layer_kinds or ()) != self.num_hidden_layers:
            raise ValueError(f"layer_kinds lists {len(self.layer_kinds or ())} kinds for {self.num_hidden_layers} "
                             "encoder layers; give one per layer.")
        if self.chunk_question_prefix and "window_cluster" in self.layer_kinds:
            raise ValueError("chunk_question_prefix applies to cluster and lsh layers, not window_cluster ones (each of "
                             "their states sees its window's question already); set it False.")
        self._check_loadable()
        if "lsh" in self.layer_kinds and self.num_clusters % 2:
            raise ValueError(f"num_clusters must be even for LSH layers (buckets: ±projections), "
                             f"got {self.num_clusters}.")


__all__ = [
    "ClusterFormerConfig",
    "MAX_CONTEXT_LENGTH",
    "required_position_embeddings",
    "suggested_num_clusters",
]
