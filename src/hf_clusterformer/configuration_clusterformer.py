"""Configuration of Cluster-Former models: a RoBERTa configuration plus the window and cluster options."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import RobertaConfig

#: Layer kinds that can replace a sliding-window layer (paper §3.2, §4.3).
GLOBAL_LAYER_TYPES = ("cluster", "lsh", "sparse")

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


@strict
class ClusterFormerConfig(RobertaConfig):
    r"""RoBERTa configuration with Cluster-Former's window and cluster options.

    Every RoBERTa checkpoint's config loads into it; the new fields are:

    window_size (`int`, defaults to 256): tokens of context per sliding window (the paper's ``l``).
    window_stride (`int`, defaults to 224): step between windows (``m``), ``0 < m <= l``; also the
        chunk length of the cluster layers.
    cluster_layers (`list[int]`, *optional*): 0-based encoder layer indices that are global
        (cluster/LSH/sparse) layers; all others are sliding-window layers. Defaults to
        [`default_cluster_layers`] of the depth (``[15, 20]`` for 24 layers). ``[]`` gives a plain
        sliding-window model.
    global_layer_type (`str` or `list[str]`, defaults to ``"cluster"``): what each of
        ``cluster_layers`` is: ``"cluster"`` (K-Means centroids), ``"lsh"`` (random hyperplane
        buckets, Reformer-style) or ``"sparse"`` (attention across windows at equal in-window
        position). One value for all, or one per entry of ``cluster_layers``.
    num_clusters (`int`, defaults to 64): centroids per cluster layer (buckets per LSH layer).
    max_question_length (`int`, defaults to 64): question tokens allowed, without special tokens.
    max_context_length (`int`, defaults to 131072): context tokens allowed in one forward pass.
    centroid_seed (`int`, defaults to 0): seed of the random initial centroids / hash vectors.
    use_answerability_head (`bool`, defaults to `False`): add a has-answer classifier on the pooled
        window ``<s>`` states (paper §4.2) to [`ClusterFormerForQuestionAnswering`].
    pair_token_types (`bool`, defaults to `False`): without ``token_type_ids``, give the context token type 1
        and the question prefix type 0, as BERT's pair template does (set for BERT-family checkpoints).
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

    def __post_init__(self, **kwargs):
        if self.cluster_layers is None:
            self.cluster_layers = default_cluster_layers(self.num_hidden_layers)
        else:
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.cluster_layers):
                raise ValueError(f"cluster_layers must be a list of layer indices, got {self.cluster_layers!r}.")
            self.cluster_layers = sorted(set(self.cluster_layers))
        self._validate_cluster_options()
        super().__post_init__(**kwargs)

    @property
    def encoder_layer_kinds(self) -> list[str]:
        """Kind of every encoder layer: ``"sliding"`` or one of `GLOBAL_LAYER_TYPES`."""
        kinds = self.global_layer_type
        if isinstance(kinds, str):
            kinds = [kinds] * len(self.cluster_layers)
        types = ["sliding"] * self.num_hidden_layers
        for index, kind in zip(self.cluster_layers, kinds):
            types[index] = kind
        return types

    @property
    def question_prefix_limit(self) -> int:
        """Longest question prefix ``<s> Q </s></s>`` in tokens."""
        return self.max_question_length + 3

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
        kinds = [self.global_layer_type] if isinstance(self.global_layer_type, str) else self.global_layer_type
        for kind in kinds:
            if kind not in GLOBAL_LAYER_TYPES:
                raise ValueError(f"global_layer_type {kind!r} is unknown; choose from {GLOBAL_LAYER_TYPES}.")
        if not isinstance(self.global_layer_type, str) and len(kinds) != len(self.cluster_layers or []):
            raise ValueError(
                f"global_layer_type lists {len(kinds)} types but cluster_layers has "
                f"{len(self.cluster_layers or [])} entries; give one type or one per cluster layer."
            )
        if self.num_clusters < 1:
            raise ValueError(f"num_clusters must be at least 1, got {self.num_clusters}.")
        if "lsh" in kinds and self.num_clusters % 2:
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
        first_position = (self.pad_token_id if self.pad_token_id is not None else 0) + 1
        needed = first_position + self.question_prefix_limit + self.window_size
        if needed > self.max_position_embeddings:
            raise ValueError(
                f"max_question_length ({self.max_question_length}) + 3 special tokens + window_size "
                f"({self.window_size}) needs {needed} position embeddings, more than max_position_embeddings "
                f"({self.max_position_embeddings}); lower max_question_length or window_size."
            )


__all__ = ["ClusterFormerConfig", "GLOBAL_LAYER_TYPES", "default_cluster_layers"]
