"""Configuration of Cluster-Former models: a RoBERTa configuration plus the window and cluster options."""

from __future__ import annotations

import dataclasses
import inspect
import os
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
#: Every value `ClusterFormerConfig.layer_kinds` may hold.
LAYER_TYPES = (SLIDING_LAYER_TYPE, *GLOBAL_LAYER_TYPES)
#: The global kinds whose layer owns a router and sorts states into chunks by its ids.
ROUTED_LAYER_TYPES = ("cluster", "lsh")
#: Constructor arguments that spell ``layer_kinds`` (read once, never stored).
LAYER_KIND_SHORTCUTS = ("cluster_layers", "global_layer_type", "layer_types")
#: Special tokens around the question in the longest question prefix ``<s> Q </s></s>``; a BERT prefix
#: ``[CLS] Q [SEP]`` has one fewer.
QUESTION_PREFIX_SPECIAL_TOKENS = 3
#: Special tokens of the longest pair encoding ``<s> Q </s></s> C </s>``.
PAIR_SPECIAL_TOKENS = QUESTION_PREFIX_SPECIAL_TOKENS + 1

#: Encoder sizes that must be positive integers (checked before anything is built from them).
POSITIVE_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def _memory_bytes() -> int:
    """This machine's physical memory (16 GiB where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 16 << 30


def _size(count: float) -> str:
    """``count`` bytes in decimal units (``512 bytes``, ``1.2 GB``)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} PB"


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


def layer_kinds_from_shortcuts(num_hidden_layers: int, cluster_layers: list[int], global_layer_type: str | list[str]
                               ) -> list[str]:
    """``layer_kinds`` spelled by the shortcuts: ``global_layer_type`` (one kind, or one per sorted index) at the
    ``cluster_layers`` indices, ``"sliding"`` elsewhere. Raises `ValueError` naming the shortcut that does not fit."""
    if not isinstance(cluster_layers, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in cluster_layers):
        raise ValueError(f"cluster_layers must be a list of layer indices, got {cluster_layers!r}.")
    layers = sorted(set(cluster_layers))
    for index in layers:
        if not 0 <= index < num_hidden_layers:
            valid = f"valid: 0..{num_hidden_layers - 1}" if num_hidden_layers > 0 else "the model has no layers"
            raise ValueError(f"cluster_layers holds {index}, outside the {num_hidden_layers} encoder layers ({valid}).")
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


def override_layer_kinds(stored: list[str], overrides: dict[str, Any], num_hidden_layers: int | None = None) -> list[str]:
    """``stored`` layer kinds with ``overrides`` over them: ``layer_kinds`` / ``layer_types`` replace them; the
    shortcuts ``cluster_layers`` / ``global_layer_type`` replace what they name and keep the rest (the stored global
    indices, their kind); ``num_hidden_layers`` (default ``len(stored)``) keeps the stored global layers that fit."""
    kinds = overrides.get("layer_kinds", overrides.get("layer_types"))
    if kinds is not None:
        return list(kinds)
    depth = len(stored) if num_hidden_layers is None else num_hidden_layers
    indices = [i for i, kind in enumerate(stored) if kind != SLIDING_LAYER_TYPE and i < depth]
    layers = overrides.get("cluster_layers", indices)
    if layers is None:
        layers = default_cluster_layers(depth)
    stored_kinds = sorted({stored[i] for i in indices})
    if "global_layer_type" in overrides and overrides["global_layer_type"] is not None:
        kind = overrides["global_layer_type"]
    elif len(stored_kinds) == 1:
        kind = stored_kinds[0]
    elif stored_kinds and list(layers) == indices:
        kind = [stored[i] for i in indices]
    else:
        kind = "cluster"
    return layer_kinds_from_shortcuts(depth, list(layers), kind)


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


def _option(default: Any, help: str) -> Any:
    """A config field with its help text (the row `model_options` reads)."""
    return dataclasses.field(default=default, metadata={"help": help})


@strict
class ClusterFormerConfig(RobertaConfig):
    r"""RoBERTa configuration with Cluster-Former's window and cluster options.

    Every RoBERTa checkpoint's config loads into it. The fields it adds are below, each with its help text (read by
    `model_options`, the one table of model options behind ``clusterformer convert``, run_qa's flags and
    `hf_clusterformer.conversion.convert_checkpoint`). ``layer_kinds`` is the one stored list of layer kinds (not named
    ``layer_types``, which transformers checks against its own attention kinds).

    Constructor shortcuts for ``layer_kinds`` (read once, never stored; configs saved with them still load, and
    ``from_pretrained`` takes them as overrides): ``cluster_layers`` (0-based indices of the global layers, all others
    sliding; ``[]`` gives a plain sliding-window model; default [`default_cluster_layers`] of the depth, ``[15, 20]``
    for 24 layers) with ``global_layer_type`` (one kind for all of them or one per index, default ``"cluster"``), or
    ``layer_types`` (the list under its former name).
    """

    model_type = "clusterformer"

    window_size: int = _option(256, "tokens of context per sliding window (the paper's l)")
    window_stride: int = _option(224, "step between windows (m), 0 < m <= l; also the chunk length of the global "
                                      "layers that sort into chunks")
    layer_kinds: list[str] | None = _option(
        None, "the kind of every encoder layer: sliding (attention within each window), cluster (K-Means centroids), "
              "lsh (random hyperplane buckets) or sparse (attention across windows at equal in-window position); "
              "default: cluster at the paper's layers scaled to the depth, sliding elsewhere")
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

    def __post_init__(self, **kwargs):
        self._validate_sizes()
        shortcuts = {name: kwargs.pop(name) for name in LAYER_KIND_SHORTCUTS if name in kwargs}
        if shortcuts.get("layer_types") is not None:
            if self.layer_kinds is not None and list(self.layer_kinds) != list(shortcuts["layer_types"]):
                raise ValueError(f"layer_types {shortcuts['layer_types']} disagrees with layer_kinds {self.layer_kinds}; "
                                 "give only layer_kinds.")
            self.layer_kinds = list(shortcuts["layer_types"])
        cluster_layers = shortcuts.get("cluster_layers")
        kind = shortcuts.get("global_layer_type")
        if self.layer_kinds is None:
            if cluster_layers is None:
                cluster_layers = default_cluster_layers(self.num_hidden_layers)
            self.layer_kinds = layer_kinds_from_shortcuts(self.num_hidden_layers, cluster_layers, kind or "cluster")
        elif cluster_layers is not None or kind is not None:
            indices = self.global_layers if cluster_layers is None else cluster_layers
            given = layer_kinds_from_shortcuts(len(self.layer_kinds), indices,
                                               kind or [self.layer_kinds[i] for i in self.global_layers])
            if given != list(self.layer_kinds):
                raise ValueError(f"cluster_layers {cluster_layers} / global_layer_type {kind!r} disagree with "
                                 f"layer_kinds {self.layer_kinds}; give only one of them.")
        self._validate_cluster_options()
        super().__post_init__(**kwargs)

    def __setattr__(self, key, value):
        if key in LAYER_KIND_SHORTCUTS and key != "layer_types":
            raise AttributeError(f"{key} is a constructor shortcut, not a stored field; set config.layer_kinds "
                                 "(one kind per layer) instead.")
        super().__setattr__(key, value)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """`PreTrainedConfig.from_dict`; ``from_pretrained(..., cluster_layers=..., global_layer_type=...)`` overrides
        the stored kinds through the constructor shortcuts (what an override leaves out keeps its stored value)."""
        overrides = {name: kwargs.pop(name) for name in (*LAYER_KIND_SHORTCUTS, "layer_kinds") if name in kwargs}
        if overrides:
            stored = cls(**config_dict).layer_kinds
            config_dict = {k: v for k, v in config_dict.items() if k not in LAYER_KIND_SHORTCUTS}
            config_dict["layer_kinds"] = override_layer_kinds(stored, overrides)
        return super().from_dict(config_dict, **kwargs)

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
                f"hf_clusterformer.conversion.load_qa_model({str(source)!r}) or convert it once with "
                f"`clusterformer convert {source} OUT_DIR`."
            )
        if config_dict.get("model_type") not in (None, "roberta", cls.model_type):
            source = args[0] if args else "this checkpoint"
            raise ValueError(
                f"{source} is a {config_dict['model_type']!r} checkpoint, whose weights Cluster-Former cannot use; give "
                "a RoBERTa or Cluster-Former checkpoint (BERT-family ones through hf_clusterformer.conversion.load_qa_model "
                "or `clusterformer convert`)."
            )
        if config_dict.get("model_type") == "roberta":
            if not getattr(cls, "_extending_said", False):
                logger.info("Extending a RoBERTa checkpoint with Cluster-Former's window and cluster options.")
                cls._extending_said = True
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
        """``layer_kinds`` holds one of `LAYER_TYPES` per encoder layer (transformers' own ``layer_types`` check has
        nothing to check here)."""
        if not isinstance(self.layer_kinds, list) or any(t not in LAYER_TYPES for t in self.layer_kinds):
            raise ValueError(f"layer_kinds must be a list of {LAYER_TYPES}, got {self.layer_kinds!r}.")
        if len(self.layer_kinds) != self.num_hidden_layers:
            raise ValueError(
                f"layer_kinds lists {len(self.layer_kinds)} kinds for {self.num_hidden_layers} encoder layers; "
                "give one per layer."
            )

    def validate_architecture(self):
        super().validate_architecture()
        self._validate_cluster_options()

    def _validate_sizes(self) -> None:
        """Raise `ValueError` naming the field when an encoder size (`POSITIVE_SIZES`) is not a positive integer."""
        for name in POSITIVE_SIZES:
            value = getattr(self, name, None)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")

    def check_centroid_memory(self, option: str = "num_clusters") -> None:
        """Raise `ValueError` when the centroids (or LSH projections) would take more than a quarter of this
        machine's memory, naming ``option`` and the largest value that fits (instead of an allocator error)."""
        routed = sum(kind in ROUTED_LAYER_TYPES for kind in self.layer_kinds)
        if not routed:
            return
        per_cluster = self.hidden_size * 4 * routed  # float32 rows, one table per cluster/LSH layer
        memory = _memory_bytes()
        bound = max(1, memory // 4 // per_cluster)
        if self.num_clusters > bound:
            raise ValueError(
                f"{option} {self.num_clusters} needs {_size(self.num_clusters * per_cluster)} of centroids "
                f"({self.num_clusters} x hidden size {self.hidden_size} x 4 bytes x {routed} layers), more than a "
                f"quarter of this machine's memory ({_size(memory)}); give at most {bound} (the paper uses 64 to 512)."
            )

    def _validate_cluster_options(self) -> None:
        """Raise `ValueError` naming the field for any invalid cluster option (and encoder size)."""
        self._validate_sizes()
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
        self.validate_layer_type()
        if self.num_clusters < 1:
            raise ValueError(f"num_clusters must be at least 1, got {self.num_clusters}.")
        if "lsh" in self.layer_kinds and self.num_clusters % 2:
            raise ValueError(f"num_clusters must be even for LSH layers (buckets = ±projections), got {self.num_clusters}.")
        if self.max_question_length < 1:
            raise ValueError(f"max_question_length must be at least 1, got {self.max_question_length}.")
        if self.max_context_length < 1:
            raise ValueError(f"max_context_length must be at least 1, got {self.max_context_length}.")
        self.check_centroid_memory()

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


#: The constructor shortcuts of ``layer_kinds`` as options (flags that spell it by indices and one kind).
_SHORTCUT_OPTIONS = (
    ("cluster_layers", list[int] | None, None, int, True, None,
     "0-based indices of the global layers, all others sliding (none: a sliding-window model); shortcut for "
     "layer_kinds, default the paper's layers scaled to the depth"),
    ("global_layer_type", str | list[str], "cluster", str, False, GLOBAL_LAYER_TYPES,
     "the kind of each of cluster_layers, one for all or one per entry; shortcut for layer_kinds"),
)


def model_options() -> dict[str, ModelOption]:
    """Cluster-Former's own options by name: the fields `ClusterFormerConfig` adds to RoBERTa's (type, default and help
    from the field), with the ``layer_kinds`` shortcuts after ``window_stride``.

    The one table of model options: `hf_clusterformer.conversion.convert_checkpoint`, ``clusterformer convert``, run_qa's
    model flags and the benchmarks read their names, types, defaults and help from it.
    """
    annotations = inspect.get_annotations(ClusterFormerConfig, eval_str=True)
    table: dict[str, ModelOption] = {}
    for field in dataclasses.fields(ClusterFormerConfig):
        if field.name not in annotations or "help" not in field.metadata:
            continue
        alternatives = [t for t in (get_args(annotations[field.name]) or (annotations[field.name],)) if t is not type(None)]
        scalars = [t for t in alternatives if not get_args(t)]
        lists = [get_args(t)[0] for t in alternatives if get_args(t)]
        table[field.name] = ModelOption(
            name=field.name, type=annotations[field.name], default=field.default, help=field.metadata["help"],
            item_type=(scalars or lists)[0], many=not scalars,
            choices=LAYER_TYPES if field.name == "layer_kinds" else None,
        )
        if field.name == "window_stride":
            for name, annotation, default, item_type, many, choices, help in _SHORTCUT_OPTIONS:
                table[name] = ModelOption(name, annotation, default, help, item_type, many, choices)
    return table


__all__ = [
    "suggested_num_clusters",
    "ClusterFormerConfig",
    "ModelOption",
    "POSITIVE_SIZES",
    "model_options",
    "GLOBAL_LAYER_TYPES",
    "LAYER_TYPES",
    "LAYER_KIND_SHORTCUTS",
    "ROUTED_LAYER_TYPES",
    "layer_kinds_from_shortcuts",
    "override_layer_kinds",
    "PAIR_SPECIAL_TOKENS",
    "QUESTION_PREFIX_SPECIAL_TOKENS",
    "SLIDING_LAYER_TYPE",
    "default_cluster_layers",
    "required_position_embeddings",
]
