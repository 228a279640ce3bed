"""Configuration of Cluster-Former models: RoBERTa's configuration plus the window and cluster options."""

import dataclasses
import difflib
import json
import os
import types
from collections.abc import Iterable
from typing import Any, Literal, Union, get_args, get_origin

from huggingface_hub.dataclasses import as_validated_field, strict
from huggingface_hub.errors import StrictDataclassError, StrictDataclassFieldValidationError
from transformers import RobertaConfig
from transformers.utils import logging
from transformers.utils.type_validators import activation_fn_key, positive_int_field

logger = logging.get_logger(__name__)

#: An encoder layer's kind (the ``layer_kinds`` help says each): ``sliding`` attends within one window (paper eq. 1-3),
#: the global kinds across windows (paper §3.2, §4.3; ``window_cluster`` beyond the paper).
LayerKind = Literal["sliding", "cluster", "lsh", "sparse", "window_cluster"]
LAYER_TYPES = get_args(LayerKind)
SLIDING_LAYER_TYPE, GLOBAL_LAYER_TYPES = LAYER_TYPES[0], LAYER_TYPES[1:]
#: The kinds whose layer owns a router and sorts states into chunks by its ids.
ROUTED_LAYER_TYPES = ("cluster", "lsh", "window_cluster")
#: Arguments that spell ``layer_kinds``, read once (`read_layer_kinds`) and never stored.
LAYER_KIND_SHORTCUTS = ("cluster_layers", "global_layer_type", "layer_types")
#: The kind of the global layers when none is named: the paper's ``cluster`` for a model built from a config, and
#: ``window_cluster`` for one made of a pretrained RoBERTa or BERT encoder, whose reader it leaves exactly as it was at
#: the start (on real text the replacing layer stays 15-23 F1 behind that reader: docs/studies.md).
DEFAULT_GLOBAL_LAYER_TYPE, PRETRAINED_GLOBAL_LAYER_TYPE = "cluster", "window_cluster"
#: Marks the values of a pretrained RoBERTa/BERT encoder given to `ClusterFormerConfig.from_dict` (which takes it
#: away): its global layers are `PRETRAINED_GLOBAL_LAYER_TYPE` unless kinds are named.
PRETRAINED_ENCODER = "_pretrained_encoder"
#: Special tokens around the question in ``<s> Q </s></s>`` (BERT's ``[CLS] Q [SEP]``: 2); one more ends a pair.
QUESTION_PREFIX_SPECIAL_TOKENS = 3
#: Most context tokens a model may be set to take (``max_context_length``): 16M, far beyond one forward pass.
MAX_CONTEXT_LENGTH = 1 << 24


def default_cluster_layers(num_hidden_layers: int) -> list[int]:
    """The paper's cluster layers (0-based 15 and 20 of 24) scaled to the depth; never layer 0 (a sliding base)."""
    if num_hidden_layers < 2:
        return []
    return sorted({min(num_hidden_layers - 1, max(1, int(i * num_hidden_layers / 24 + 0.5))) for i in (15, 20)})


def read_layer_kinds(depth: int, kinds: list[str] | None, arguments: dict, stored: list[str] | None = None,
                     new_kind: str = DEFAULT_GLOBAL_LAYER_TYPE) -> list[str]:
    """The kinds that ``kinds`` and the shortcuts popped from ``arguments`` spell (`ValueError` if they disagree): the
    ``global_layer_type`` at the ``cluster_layers``; left out, each layer keeps its kind in ``kinds`` or ``stored``
    and a new one takes theirs when they have one, else ``new_kind``."""
    former = arguments.pop("layer_types", None)
    if former is not None:
        if kinds is not None and list(kinds) != list(former):
            raise ValueError(f"layer_types {former} disagrees with layer_kinds {kinds}; give layer_kinds.")
        kinds = list(former)
    given = {name: value for name in LAYER_KIND_SHORTCUTS[:2] if (value := arguments.pop(name, None)) is not None}
    if kinds is not None and not given:
        return list(kinds)
    base = kinds if kinds is not None else stored
    kept = [i for i, kind in enumerate(base or ()) if kind != SLIDING_LAYER_TYPE and i < depth]
    layers = given.get("cluster_layers", kept if base is not None else default_cluster_layers(depth))
    if not isinstance(layers, (list, tuple)) or any(type(i) is not int for i in layers):
        raise ValueError(f"cluster_layers must be a list of layer indices, got {layers!r}.")
    outside, twice = [i for i in layers if not 0 <= i < depth], [i for i in layers if layers.count(i) > 1]
    if outside:
        raise ValueError(f"cluster_layers holds {outside[0]}, outside the {depth} encoder layers (0..{depth - 1}).")
    if twice:
        raise ValueError(f"cluster_layers lists layer {twice[0]} twice; give each layer once.")
    own = {i: base[i] for i in kept}
    fallback = next(iter(own.values())) if len(set(own.values())) == 1 else new_kind
    kind = given.get("global_layer_type", [own.get(i, fallback) for i in layers])
    spelt = [kind] * len(layers) if isinstance(kind, str) else list(kind) * (len(layers) if len(kind) == 1 else 1)
    unknown = [k for k in spelt if k not in GLOBAL_LAYER_TYPES]
    if unknown:
        raise ValueError(f"global_layer_type {unknown[0]!r} is unknown; choose from {GLOBAL_LAYER_TYPES}.")
    if len(spelt) != len(layers):
        raise ValueError(f"global_layer_type lists {len(spelt)} kinds but cluster_layers has {len(layers)} entries; "
                         "give one kind or one per cluster layer.")
    placed = dict(zip(layers, spelt))
    derived = [placed.get(i, SLIDING_LAYER_TYPE) for i in range(depth)]
    if kinds is not None and derived != list(kinds):
        raise ValueError(f"{' / '.join(f'{k} {v!r}' for k, v in given.items())} disagree with layer_kinds {kinds}; "
                         "give only one of them.")
    return derived


def required_position_embeddings(max_question_length: int, window_size: int, pad_token_id: int | None = 1) -> int:
    """Positions a window ``<s> Q </s></s> C[window]`` needs: ``pad + 1 + (q + 3) + l`` (RoBERTa's start at
    pad + 1)."""
    first_position = (pad_token_id if pad_token_id is not None else 0) + 1
    return first_position + max_question_length + QUESTION_PREFIX_SPECIAL_TOKENS + window_size


def check_context_length(value: int | None, name: str = "max_context_length") -> None:
    """`ValueError` naming ``name`` unless ``value`` is None (not given) or an integer in 1..`MAX_CONTEXT_LENGTH`."""
    if value is not None and (type(value) is not int or not 1 <= value <= MAX_CONTEXT_LENGTH):
        raise ValueError(f"{name} must be an integer from 1 to {MAX_CONTEXT_LENGTH}, got {value!r}.")


class ConfigValueError(ValueError):
    """A config file's value of the wrong type or out of range, in one line naming the file and the fix."""

    def __init__(self, problem: str, where: str = "config.json"):
        super().__init__(f"{where}: {problem}")
        self.problem = problem

    def at(self, source: str | os.PathLike) -> "ConfigValueError":
        """The same error naming the config file of checkpoint ``source`` (a folder, a Hub id or the file itself)."""
        source = os.fspath(source)
        return ConfigValueError(self.problem, source if source.endswith(".json") else f"{source}/config.json")


def _takes(annotation: Any, python: bool = False) -> str:
    """What a field of type ``annotation`` takes, in words (of JSON, or of Python with ``python``)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(arg) if python else json.dumps(arg) for arg in args)
    if origin in (Union, types.UnionType):
        return ", or ".join(_takes(arg, python) for arg in args)
    if origin in (list, tuple):
        return f"a list, each entry {_takes(args[0], python)}" if args else "a list"
    words = {int: "an integer", float: "a number", bool: "True or False" if python else "true or false",
             str: "a string", type(None): "None" if python else "null"}
    return "an object" if dict in (annotation, origin) else words.get(annotation, str(annotation))


class OptionTypeError(StrictDataclassFieldValidationError, ValueError):
    """``@strict``'s refusal of a value of the wrong type, in one line naming the field and what it takes."""

    def __init__(self, cls: type, field: str, value: Any):
        takes = _takes(cls.__dataclass_fields__[field].type, python=True)
        Exception.__init__(self, f"{field}={value!r} was given, but {field} takes {takes}.")
        self.field = field


def _type_error(cls: type, error: StrictDataclassError, values: dict, given: set[str]) -> ValueError:
    """``@strict``'s refusal in one line: `ConfigValueError` for the file's value, `ValueError` for one ``given``."""
    field = getattr(error, "field", None) or str(error).split("'")[1]
    if not isinstance(error, StrictDataclassFieldValidationError):
        problem = " ".join(str(error.__cause__ or error).split())
        return ValueError(problem) if given else ConfigValueError(problem)
    if field in given:
        return OptionTypeError(cls, field, values.get(field))
    return ConfigValueError(f"{field} is {json.dumps(values.get(field), default=repr)}, but it takes "
                            f"{_takes(cls.__dataclass_fields__[field].type)}; correct it there.")


def _one_line_ranges(cls: type) -> type:
    """A value out of range (`ValueError`) or of the wrong type (`OptionTypeError`, still ``@strict``'s error class)
    refused in one line naming the field; no shortcut set as an attribute (it would be saved, then clash on
    loading)."""
    strict_setattr = cls.__setattr__

    def __setattr__(self, key: str, value: Any) -> None:
        if key in LAYER_KIND_SHORTCUTS[:2]:
            raise AttributeError(f"{key} is a constructor argument, not a stored field; set config.layer_kinds "
                                 "(one kind per layer) instead.")
        try:
            strict_setattr(self, key, value)
        except StrictDataclassFieldValidationError as error:
            if isinstance(error.__cause__, TypeError) and key in type(self).__dataclass_fields__:
                raise OptionTypeError(type(self), key, value) from None
            if not isinstance(error.__cause__, ValueError):
                raise
            message = " ".join(str(error.__cause__).split()).removeprefix("Value ").rstrip(".") + "."  # "Value must"
            raise ValueError(message if message.startswith(key) else f"{key} {message}") from None

    cls.__setattr__ = __setattr__
    return cls


def _check_arguments(cls: type, arguments: Iterable[str]) -> None:
    """`ValueError` for an argument that is a derived property (setting it would fail deep in transformers, the whole
    config printed) or a misspelt Cluster-Former option (transformers would store it unread)."""
    roberta = getattr(RobertaConfig, "__dataclass_fields__", {})  # (a transformers whose configs are no dataclasses)
    own = [*LAYER_KIND_SHORTCUTS[:2], *(name for name in cls.__dataclass_fields__ if name not in roberta)]
    for name in arguments:
        if isinstance(read_only := getattr(cls, name, None), property) and read_only.fset is None:
            raise ValueError(f"{name} is derived from the other fields, not set; "
                             + ("give cluster_layers (their indices) or layer_kinds (one kind per layer) instead."
                                if name == "global_layers" else "leave it out."))
        near = difflib.get_close_matches(name, own, n=1, cutoff=0.8)
        if near and name not in own and not hasattr(cls, name):
            raise ValueError(f"{name} is no Cluster-Former option; did you mean {near[0]}?")


def _option(default: Any, help: str, field: Any = dataclasses.field) -> Any:
    """A config field with its help text (``metadata["help"]``), made by ``field`` (a validated field's maker)."""
    return field(default=default, metadata={"help": help})


@_one_line_ranges
@strict
class ClusterFormerConfig(RobertaConfig):
    r"""RoBERTa's configuration with Cluster-Former's window and cluster options (each with its ``metadata["help"]``).

    ``layer_kinds`` is the one stored list of layer kinds; a new kind is one more entry of `LayerKind`. Shortcuts spell
    it in the constructor and as `from_pretrained` overrides, read once (`read_layer_kinds`) and never stored:
    ``cluster_layers`` (0-based indices of the global layers; ``[]``: a sliding-window model) with
    ``global_layer_type`` (one kind or one per index; default ``"cluster"``, ``"window_cluster"`` for a RoBERTa
    checkpoint: `PRETRAINED_GLOBAL_LAYER_TYPE`), or ``layer_types`` (its former name)."""

    model_type = "clusterformer"

    hidden_size: int = positive_int_field(default=768)
    num_hidden_layers: int = positive_int_field(default=12)
    num_attention_heads: int = positive_int_field(default=12)
    intermediate_size: int = positive_int_field(default=3072)
    hidden_act: str = activation_fn_key(default="gelu")
    window_size: int = _option(256, "tokens of context per sliding window (the paper's l)", positive_int_field)
    window_stride: int = _option(224, "step between windows (m), 0 < m <= l; also the chunk length of the global "
                                      "layers that sort into chunks")
    layer_kinds: list[LayerKind] | None = _option(
        None, "the kind of every encoder layer: sliding (attention within each window), cluster (K-Means centroids), "
              "lsh (random hyperplane buckets), sparse (attention across windows at equal in-window position) or "
              "window_cluster (a window's attention plus a cluster layer's, added through a projection that starts at "
              "zero: at first the sliding layer exactly); default: the paper's layers scaled to the depth, cluster "
              "for a new model and window_cluster for a pretrained RoBERTa/BERT encoder, sliding elsewhere")
    num_clusters: int = _option(64, "centroids per cluster layer (buckets per LSH layer)", positive_int_field)
    max_question_length: int = _option(64, "question tokens allowed, without special tokens", positive_int_field)
    max_context_length: int = _option(131072, "context tokens allowed in one forward pass",
                                      as_validated_field(check_context_length))
    centroid_seed: int = _option(0, "seed of the random initial centroids / hash vectors")
    use_answerability_head: bool = _option(False, "add a has-answer classifier on the pooled window <s> states "
                                                  "(paper 4.2) to the QA head")
    pair_token_types: bool = _option(False, "without token_type_ids, give the context token type 1 and the question "
                                            "prefix type 0, as BERT's pair template does (BERT-family checkpoints)")
    chunk_question_prefix: bool = _option(False, "beyond the paper: prefix every chunk of a cluster/LSH layer with "
                                                 "its example's question prefix and route only context tokens")
    route_by: Literal["states", "keys"] = _option("states", "what a routed layer's router compares with its centroids "
                                                            "(hash vectors): the layer's input states (the paper) or "
                                                            "their key projections")

    def __post_init__(self, **kwargs):
        self.layer_kinds = read_layer_kinds(self.num_hidden_layers, self.layer_kinds, kwargs)
        _check_arguments(type(self), kwargs)
        try:
            super().__post_init__(**kwargs)  # makes a dtype name torch's dtype
        except AttributeError:  # no torch dtype of that name: refused below
            if not isinstance(self.dtype, str):
                raise
        if self.dtype is not None and type(self.dtype).__name__ != "dtype":
            raise ValueError(f"dtype {self.dtype!r} is no torch dtype; use float32, float16 or bfloat16.")
        self.validate_architecture()  # here too, so that its rules raise their own one-line ValueError

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """Overrides of the kinds or the depth apply over the stored kinds; a value the config does not take is
        refused in one line naming the file (`ConfigValueError`) or the argument."""
        _check_arguments(cls, kwargs)
        given = set(kwargs) & {*cls.__dataclass_fields__, *LAYER_KIND_SHORTCUTS}
        spelling = {"layer_kinds", *LAYER_KIND_SHORTCUTS}
        config_dict = dict(config_dict)
        pretrained = config_dict.pop(PRETRAINED_ENCODER, False)  # trained weights: new global layers add, not replace
        try:
            if pretrained or set(kwargs) & {"num_hidden_layers", *spelling}:
                stored = cls(**config_dict).layer_kinds if spelling & set(config_dict) else None
                depth = kwargs.pop("num_hidden_layers", config_dict.get("num_hidden_layers", cls.num_hidden_layers))
                kinds = read_layer_kinds(depth, kwargs.pop("layer_kinds", None), kwargs, stored,
                                         PRETRAINED_GLOBAL_LAYER_TYPE if pretrained else DEFAULT_GLOBAL_LAYER_TYPE)
                config_dict = {**{k: v for k, v in config_dict.items() if k not in spelling},
                               "num_hidden_layers": depth, "layer_kinds": kinds}
            return super().from_dict(config_dict, **kwargs)
        except StrictDataclassError as error:  # a value of the wrong type, or an unknown layer kind
            raise _type_error(cls, error, {**config_dict, **kwargs}, given) from None
        except ValueError as error:  # a value out of range: the file's, when nothing overrides it
            if given or isinstance(error, ConfigValueError):
                raise
            raise ConfigValueError(" ".join(str(error).split())) from None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args, **kwargs):
        """`PreTrainedConfig.from_pretrained`, a `ConfigValueError` naming the checkpoint's config file."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except ConfigValueError as error:
            raise error.at(pretrained_model_name_or_path) from None

    @classmethod
    def get_config_dict(cls, *args, **kwargs):
        """A RoBERTa checkpoint's config becomes a Cluster-Former one; any other type is refused in one line."""
        config_dict, kwargs = super().get_config_dict(*args, **kwargs)
        model_type, source = config_dict.get("model_type"), args[0] if args else "this checkpoint"
        mapped = "hf_clusterformer.conversion.load_qa_model or convert_checkpoint"
        if model_type == "bert":
            raise ValueError(f"{source} is a BERT-family checkpoint, whose weights need mapping to RoBERTa's layout: "
                             f"load it with {mapped}.")
        if model_type not in (None, "roberta", cls.model_type):
            raise ValueError(f"{source} is a {model_type!r} checkpoint, whose weights Cluster-Former cannot use; "
                             f"give a RoBERTa or Cluster-Former checkpoint (a BERT-family one through {mapped}).")
        if model_type == "roberta":
            logger.info_once("Extending a RoBERTa checkpoint with Cluster-Former's window and cluster options.")
            config_dict = {**config_dict, "model_type": cls.model_type, PRETRAINED_ENCODER: True}
        return config_dict, kwargs

    @property
    def global_layers(self) -> list[int]:
        """0-based indices of the global (cluster, LSH, sparse or window_cluster) layers."""
        return [i for i, kind in enumerate(self.layer_kinds) if kind != SLIDING_LAYER_TYPE]

    @property
    def separator_token_id(self) -> int:
        """The token that ends the question: ``sep_token_id``, else ``eos_token_id`` (RoBERTa's ``</s>``)."""
        sep = self.eos_token_id if getattr(self, "sep_token_id", None) is None else self.sep_token_id
        return sep[0] if isinstance(sep, (list, tuple)) else sep

    @property
    def max_input_length(self) -> int:
        """Longest pair encoding ``<s> Q </s></s> C </s>`` accepted: ``q + c + 4`` tokens."""
        return self.max_question_length + self.max_context_length + QUESTION_PREFIX_SPECIAL_TOKENS + 1

    def check_position_budget(self) -> None:
        """`ValueError` unless a question prefix plus a window fits the position table (checked as a model is
        built)."""
        needed = required_position_embeddings(self.max_question_length, self.window_size, self.pad_token_id)
        if needed > self.max_position_embeddings:
            skipped = needed - self.max_question_length - QUESTION_PREFIX_SPECIAL_TOKENS - self.window_size
            raise ValueError(f"max_question_length ({self.max_question_length}) + 3 special tokens + window_size "
                             f"({self.window_size}) + {skipped} rows before the first position (RoBERTa's "
                             f"positions start after pad_token_id) needs {needed} position embeddings, more than "
                             f"max_position_embeddings ({self.max_position_embeddings}); lower max_question_length or "
                             "window_size.")

    def validate_architecture(self):
        """The rules across fields, each a one-line `ValueError`; run by ``@strict`` and as a model is built."""
        super().validate_architecture()
        kinds = self.layer_kinds or []
        if not 0 < self.window_stride <= self.window_size:
            raise ValueError(f"window_stride must satisfy 0 < window_stride <= window_size ({self.window_size}), "
                             f"got {self.window_stride}.")
        if len(kinds) != self.num_hidden_layers:
            raise ValueError(f"layer_kinds lists {len(kinds)} kinds for {self.num_hidden_layers} encoder layers; give "
                             "one per layer.")
        if self.chunk_question_prefix and "window_cluster" in kinds:
            raise ValueError("chunk_question_prefix applies to cluster and lsh layers, not window_cluster ones (each "
                             "of their states sees its window's question already, and a pretrained encoder gets them "
                             "by default); set it False, or name global_layer_type='cluster'.")
        if "lsh" in kinds and self.num_clusters % 2:
            raise ValueError(f"num_clusters must be even for LSH layers (buckets: ±projections), got "
                             f"{self.num_clusters}.")
        for name in ("auto_map", "custom_pipelines"):  # read only when a model loads, or by the Hub
            if not isinstance(getattr(self, name, None) or {}, dict):
                raise ValueError(f"{name} must be an object (names to classes), got {getattr(self, name)!r}.")


__all__ = ["ClusterFormerConfig", "ConfigValueError", "OptionTypeError", "required_position_embeddings"]
