"""Configuration of Cluster-Former models: a RoBERTa configuration plus the window and cluster options."""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, get_args

from huggingface_hub.dataclasses import strict
from transformers import RobertaConfig
from transformers.utils import logging

logger = logging.get_logger(__name__)

#: Type of the layers that attend within one window (paper eq. 1-3).
SLIDING_LAYER_TYPE = "sliding"
#: Types of the global layers, which attend across windows (paper §3.2, §4.3): K-Means "cluster" layers, LSH
#: layers and sparse layers.
GLOBAL_LAYER_TYPES = ("cluster", "lsh", "sparse")
#: Every value `ClusterFormerConfig.layer_types` may hold.
LAYER_TYPES = (SLIDING_LAYER_TYPE, *GLOBAL_LAYER_TYPES)
#: Special tokens around the question in the longest question prefix ``<s> Q </s></s>``; a BERT prefix
#: ``[CLS] Q [SEP]`` has one fewer.
QUESTION_PREFIX_SPECIAL_TOKENS = 3
#: Special tokens of the longest pair encoding ``<s> Q </s></s> C </s>``.
PAIR_SPECIAL_TOKENS = QUESTION_PREFIX_SPECIAL_TOKENS + 1

#: The paper puts Cluster-Former layers at layers 15 and 20 of the 24-layer RoBERTa-large.
_PAPER_DEPTH = 24
_PAPER_CLUSTER_LAYERS = (15, 20)


def default_cluster_layers(num_hidden_layers: int) -> list[int]:
    """0-based encoder layer indices that reproduce the paper's placement, scaled to the model depth.

    The paper's "layers 15 and 20" are read as 0-based indices (the 16th and 21st of 24 layers, the
    numbering of the paper's fairseq code and of Table 4's rule ``l % 5 == 0 and l >= 15``). For other
    depths each index is scaled by ``num_hidden_layers / 24`` and rounded; layer 0 is never a cluster
    layer, because a cluster layer needs a sliding-window layer below it.
    """
    if num_hidden_layers < 2:
        return []
    scaled = {
        min(num_hidden_layers - 1, max(1, int(index * num_hidden_layers / _PAPER_DEPTH + 0.5)))
        for index in _PAPER_CLUSTER_LAYERS
    }
    return sorted(scaled)


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


@strict
class ClusterFormerConfig(RobertaConfig):
    r"""RoBERTa configuration with Cluster-Former's window and cluster options.

    Every RoBERTa checkpoint's config loads into it; the new fields are:

    window_size (`int`, defaults to 256): tokens of context per sliding window (the paper's ``l``).
    window_stride (`int`, defaults to 224): step between windows (``m``), ``0 < m <= l``; also the
        chunk length of the global layers that sort into chunks.
    layer_types (`list[str]`, *optional*): the type of every encoder layer: ``"sliding"`` (attention
        within each window) or a global layer type: ``"cluster"`` (K-Means centroids), ``"lsh"``
        (random hyperplane buckets, Reformer-style) or ``"sparse"`` (attention across windows at equal
        in-window position). Defaults to ``"cluster"`` at [`default_cluster_layers`] of the depth (``[15, 20]``
        for 24 layers), ``"sliding"`` elsewhere.
    cluster_layers (`list[int]`, *optional*): constructor shortcut for ``layer_types``: 0-based indices of the
        global layers; all others are sliding; ``[]`` gives a plain sliding-window model. Kept in sync with
        ``layer_types`` and saved in its place (see `to_dict`).
    global_layer_type (`str` or `list[str]`, defaults to ``"cluster"``): constructor shortcut for
        ``layer_types``: the type of each of ``cluster_layers``, one for all or one per entry. Kept in sync
        with ``layer_types`` and saved in its place.
    num_clusters (`int`, defaults to 64): centroids per cluster layer (buckets per LSH layer).
    max_question_length (`int`, defaults to 64): question tokens allowed, without special tokens.
    max_context_length (`int`, defaults to 131072): context tokens allowed in one forward pass.
    centroid_seed (`int`, defaults to 0): seed of the random initial centroids / hash vectors.
    use_answerability_head (`bool`, defaults to `False`): add a has-answer classifier on the pooled
        window ``<s>`` states (paper §4.2) to [`ClusterFormerForQuestionAnswering`].
    pair_token_types (`bool`, defaults to `False`): without ``token_type_ids``, give the context token type 1
        and the question prefix type 0, as BERT's pair template does (set for BERT-family checkpoints).
    chunk_question_prefix (`bool`, defaults to `False`): beyond the paper: prefix every chunk of a cluster/LSH
        layer with its example's question prefix ``<s> Q </s></s>`` (the mean of its window copies), as sliding
        windows are, and route only context tokens. ``False`` is the paper's layer (question copies routed like
        context tokens).
    """

    model_type = "clusterformer"

    window_size: int = 256
    window_stride: int = 224
    cluster_layers: list[int] | None = None
    global_layer_type: str | list[str] = "cluster"
    num_clusters: int = 64
    max_question_length: int = 64
    max_context_length: int = 131072
    centroid_seed: int = 0
    use_answerability_head: bool = False
    pair_token_types: bool = False
    chunk_question_prefix: bool = False
    layer_types: list[str] | None = None  # after the shortcuts: assigning it rewrites them (see __setattr__)

    def __post_init__(self, **kwargs):
        if self.layer_types is None:
            if self.cluster_layers is None:
                self.__dict__["cluster_layers"] = default_cluster_layers(self.num_hidden_layers)
            self.__dict__["layer_types"] = self._layer_types_from_shortcuts()
        else:
            given = self.cluster_layers
            self._shortcuts_from_layer_types()
            if given is not None and sorted(set(given)) != self.cluster_layers:
                raise ValueError(
                    f"cluster_layers {given} disagrees with layer_types {self.layer_types}; give only one of them."
                )
        self._validate_cluster_options()
        super().__post_init__(**kwargs)

    @classmethod
    def get_config_dict(cls, *args, **kwargs):
        """A RoBERTa checkpoint's config becomes a Cluster-Former one (said once, instead of transformers' warning
        about a model of another type); a BERT-family one is refused in one line naming the loader that maps it, and
        any other type (GPT-2, T5, ...) in one line instead of loading a random model."""
        config_dict, kwargs = super().get_config_dict(*args, **kwargs)
        if config_dict.get("model_type") == "bert":
            source = args[0] if args else "this checkpoint"
            raise ValueError(
                f"{source} is a BERT-family checkpoint, whose weights need mapping to RoBERTa's layout: load it with "
                f"hf_clusterformer.hub.load_qa_model({str(source)!r}) or convert it once with "
                f"`clusterformer convert {source} OUT_DIR`."
            )
        if config_dict.get("model_type") not in (None, "roberta", cls.model_type):
            source = args[0] if args else "this checkpoint"
            raise ValueError(
                f"{source} is a {config_dict['model_type']!r} checkpoint, whose weights Cluster-Former cannot use; give "
                "a RoBERTa or Cluster-Former checkpoint (BERT-family ones through hf_clusterformer.hub.load_qa_model "
                "or `clusterformer convert`)."
            )
        if config_dict.get("model_type") == "roberta":
            if not getattr(cls, "_extending_said", False):
                logger.info("Extending a RoBERTa checkpoint with Cluster-Former's window and cluster options.")
                cls._extending_said = True
            config_dict = {**config_dict, "model_type": cls.model_type}
        return config_dict, kwargs

    def __setattr__(self, key, value):
        # Assigning layer_types or one of its shortcuts (e.g. from_pretrained(..., cluster_layers=[2])) keeps
        # the other side in sync once the config exists. Shortcuts that do not fit together yet (one type per
        # layer, for another number of layers) leave layer_types as it is until they do; validation names them.
        syncing = key in ("layer_types", "cluster_layers", "global_layer_type") and self.__dict__.get("layer_types") is not None
        super().__setattr__(key, value)
        if not syncing:
            return
        if key == "layer_types":
            self._shortcuts_from_layer_types()
        elif self._shortcuts_fit():
            self.__dict__["layer_types"] = self._layer_types_from_shortcuts()

    def _shortcuts_fit(self) -> bool:
        """``global_layer_type`` gives one type, or one per entry of ``cluster_layers``."""
        return isinstance(self.global_layer_type, str) or len(self.global_layer_type) == len(self.cluster_layers or [])

    def _layer_types_from_shortcuts(self) -> list[str]:
        """``layer_types`` spelled by ``cluster_layers`` and ``global_layer_type``."""
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.cluster_layers):
            raise ValueError(f"cluster_layers must be a list of layer indices, got {self.cluster_layers!r}.")
        self.__dict__["cluster_layers"] = layers = sorted(set(self.cluster_layers))
        types = self.global_layer_type
        types = [types] * len(layers) if isinstance(types, str) else list(types)
        result = [SLIDING_LAYER_TYPE] * self.num_hidden_layers
        for index, layer_type in zip(layers, types):
            if 0 <= index < self.num_hidden_layers:  # out-of-range indices are reported by validation
                result[index] = layer_type
        return result

    def _shortcuts_from_layer_types(self) -> None:
        """Rewrite ``cluster_layers`` and ``global_layer_type`` from ``layer_types``."""
        if not isinstance(self.layer_types, (list, tuple)) or any(t not in LAYER_TYPES for t in self.layer_types):
            raise ValueError(f"layer_types must be a list of {LAYER_TYPES}, got {self.layer_types!r}.")
        self.__dict__["layer_types"] = list(self.layer_types)
        global_layers = [i for i, t in enumerate(self.layer_types) if t != SLIDING_LAYER_TYPE]
        types = [self.layer_types[i] for i in global_layers]
        self.__dict__["cluster_layers"] = global_layers
        if types:
            self.__dict__["global_layer_type"] = types[0] if len(set(types)) == 1 else types

    def to_dict(self) -> dict:
        """The config as a dict; ``layer_types`` is saved as its shortcuts ``cluster_layers`` and
        ``global_layer_type``, which spell every list of types. transformers checks a saved ``layer_types``
        against its own attention types when it reads a config generically (e.g. ``Trainer`` resuming)."""
        output = super().to_dict()
        output.pop("layer_types", None)
        return output

    @property
    def global_layers(self) -> list[int]:
        """0-based indices of the global (cluster, LSH or sparse) layers."""
        return [i for i, layer_type in enumerate(self.layer_types) if layer_type != SLIDING_LAYER_TYPE]

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
            raise ValueError(
                f"the question of {where} has {question_tokens} tokens, more than max_question_length="
                f"{self.max_question_length}; shorten the question or use a model with a larger max_question_length "
                "(max_question_length + 3 + window_size must fit max_position_embeddings - 2)."
            )
        if context_tokens <= 0:
            raise ValueError(f"{where} has an empty context; give a non-empty context after the question.")
        if context_tokens > self.max_context_length:
            raise ValueError(
                f"the context of {where} has {context_tokens} tokens, more than max_context_length="
                f"{self.max_context_length}; truncate it or raise max_context_length."
            )

    def validate_layer_type(self):
        """``layer_types`` holds one of `LAYER_TYPES` per encoder layer (replaces transformers' check of its own
        attention types)."""
        if not isinstance(self.layer_types, list) or any(t not in LAYER_TYPES for t in self.layer_types):
            raise ValueError(f"layer_types must be a list of {LAYER_TYPES}, got {self.layer_types!r}.")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types lists {len(self.layer_types)} types for {self.num_hidden_layers} encoder layers; "
                "give one per layer."
            )

    def validate_architecture(self):
        super().validate_architecture()
        self._validate_cluster_options()

    def _validate_cluster_options(self) -> None:
        """Raise `ValueError` naming the field for any invalid cluster option."""
        for name in ("window_size", "window_stride", "num_clusters", "max_question_length", "max_context_length", "centroid_seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}.")
        if self.window_size <= 0:
            raise ValueError(f"window_size must be positive, got {self.window_size}.")
        if not 0 < self.window_stride <= self.window_size:
            raise ValueError(
                f"window_stride must satisfy 0 < window_stride <= window_size ({self.window_size}), "
                f"got {self.window_stride}."
            )
        for index in self.cluster_layers or []:
            if not 0 <= index < self.num_hidden_layers:
                raise ValueError(
                    f"cluster_layers holds {index}, outside the {self.num_hidden_layers} encoder layers "
                    f"(valid: 0..{self.num_hidden_layers - 1})."
                )
        types = [self.global_layer_type] if isinstance(self.global_layer_type, str) else self.global_layer_type
        for layer_type in types:
            if layer_type not in GLOBAL_LAYER_TYPES:
                raise ValueError(f"global_layer_type {layer_type!r} is unknown; choose from {GLOBAL_LAYER_TYPES}.")
        self.validate_layer_type()
        if not self._shortcuts_fit():
            raise ValueError(
                f"global_layer_type lists {len(types)} types but cluster_layers has "
                f"{len(self.cluster_layers or [])} entries; give one type or one per cluster layer."
            )
        if self.layer_types != self._layer_types_from_shortcuts():
            raise ValueError(
                f"layer_types {self.layer_types} disagrees with cluster_layers {self.cluster_layers} and "
                f"global_layer_type {self.global_layer_type!r}; set layer_types alone."
            )
        if self.num_clusters < 1:
            raise ValueError(f"num_clusters must be at least 1, got {self.num_clusters}.")
        if "lsh" in self.layer_types and self.num_clusters % 2:
            raise ValueError(f"num_clusters must be even for LSH layers (buckets = ±projections), got {self.num_clusters}.")
        if self.max_question_length < 1:
            raise ValueError(f"max_question_length must be at least 1, got {self.max_question_length}.")
        if self.max_context_length < 1:
            raise ValueError(f"max_context_length must be at least 1, got {self.max_context_length}.")

    def check_position_budget(self) -> None:
        """Raise `ValueError` unless a question prefix plus a window fits RoBERTa's position table.

        Checked when a model is built (not in the config, so a RoBERTa config can be loaded first and its
        window options set after).
        """
        needed = required_position_embeddings(self.max_question_length, self.window_size, self.pad_token_id)
        if needed > self.max_position_embeddings:
            raise ValueError(
                f"max_question_length ({self.max_question_length}) + 3 special tokens + window_size "
                f"({self.window_size}) needs {needed} position embeddings, more than max_position_embeddings "
                f"({self.max_position_embeddings}); lower max_question_length or window_size."
            )


@dataclasses.dataclass(frozen=True)
class ModelOption:
    """One of Cluster-Former's own options of `ClusterFormerConfig` (a row of `model_options`)."""

    name: str
    #: The field's annotation, e.g. ``list[int] | None``.
    type: Any
    #: The field's default.
    default: Any
    #: The field's description in the `ClusterFormerConfig` docstring, as plain text.
    help: str
    #: Type of one command-line value (``int``, ``str`` or ``bool``).
    item_type: type
    #: A command-line flag takes a list of values (the option takes only lists).
    many: bool
    #: The values allowed, when they are few.
    choices: tuple[str, ...] | None = None


#: Values allowed for the options that name layer types.
_OPTION_CHOICES = {"layer_types": LAYER_TYPES, "global_layer_type": GLOBAL_LAYER_TYPES}


def _docstring_fields(doc: str) -> dict[str, str]:
    """``name: description`` of every ``name (`type`, ...): description`` entry of a config docstring, as plain text."""
    entries: dict[str, list[str]] = {}
    name = None
    for line in doc.splitlines():
        entry = re.match(r"^    (\w+) \(.*?\): (.*)$", line)
        if entry:
            name = entry.group(1)
            entries[name] = [entry.group(2)]
        elif name is not None and line.startswith("        "):
            entries[name].append(line.strip())
        else:
            name = None
    plain = {}
    for name, lines in entries.items():
        text = re.sub(r"\[`(\w+)`\]", r"\1", " ".join(lines))
        plain[name] = text.replace("``", "").replace("`", "")
    return plain


def model_options() -> dict[str, ModelOption]:
    """Cluster-Former's own options (the fields `ClusterFormerConfig` adds to RoBERTa's) by name, in declaration order:
    type and default from the dataclass fields, help from the class docstring.

    The one table of model options: `hf_clusterformer.hub.convert_checkpoint`, ``clusterformer convert``, run_qa's
    model flags and the benchmarks read their names, types, defaults and help from it.
    """
    helps = _docstring_fields(ClusterFormerConfig.__doc__ or "")
    defaults = {f.name: f.default for f in dataclasses.fields(ClusterFormerConfig)}
    table = {}
    for name, annotation in inspect.get_annotations(ClusterFormerConfig, eval_str=True).items():
        alternatives = [t for t in (get_args(annotation) or (annotation,)) if t is not type(None)]
        scalars = [t for t in alternatives if not get_args(t)]
        lists = [get_args(t)[0] for t in alternatives if get_args(t)]
        table[name] = ModelOption(
            name=name, type=annotation, default=defaults[name], help=helps[name], item_type=(scalars or lists)[0],
            many=not scalars, choices=_OPTION_CHOICES.get(name),
        )
    return table


__all__ = [
    "suggested_num_clusters",
    "ClusterFormerConfig",
    "ModelOption",
    "model_options",
    "GLOBAL_LAYER_TYPES",
    "LAYER_TYPES",
    "PAIR_SPECIAL_TOKENS",
    "QUESTION_PREFIX_SPECIAL_TOKENS",
    "SLIDING_LAYER_TYPE",
    "default_cluster_layers",
    "required_position_embeddings",
]
