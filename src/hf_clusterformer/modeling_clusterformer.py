"""Cluster-Former (Wang et al., 2021): RoBERTa layers over sliding windows plus clustering-based global layers.

Reading guide, top to bottom:

1. Windowing: a pair encoding ``<s> Q </s></s> C </s>`` becomes K windows ``[<s> Q </s></s>; C[m*k : m*k + l]]``
   (`build_window_layout`); window states go back to token order by averaging every copy of a token
   (`windows_to_tokens`) and forth again by gathering (`tokens_to_windows`).
2. Sorting: states with cluster ids are stably sorted by (id, position), cut into chunks of ``m``, and put
   back by scattering with the same permutation (`sort_into_chunks`, `unsort_from_chunks`).
3. Routers map states to ids: `ClusterRouter` (cosine argmax against K-Means centroids, paper eq. 4) and
   `LSHRouter` (random hyperplanes, Reformer). `order_centroids_greedy` is the paper's GetCentroids ordering.
4. `ClusterFormerModel` runs RoBERTa's embeddings per window and then every encoder layer as a sliding-window
   layer (eq. 1-3), a cluster/LSH layer (eq. 4-8) or a sparse cross-window layer, each as ONE batched call.

Shapes: B batch, T input length, K windows per example, S slots per window (longest question prefix + l),
L = K * S flat slots, d hidden size, m window stride (= chunk length), p number of clusters.

This file is self-contained for the Hub: it imports only torch, transformers and the configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import CrossEntropyLoss
from transformers import initialization as init
from transformers.modeling_outputs import ModelOutput
from transformers.models.roberta.modeling_roberta import (
    RobertaEmbeddings,
    RobertaLayer,
    RobertaPooler,
    RobertaPreTrainedModel,
)
from transformers.utils import logging

try:  # package import
    from .configuration_clusterformer import ClusterFormerConfig
except ImportError:  # Hub copy loaded with trust_remote_code
    from configuration_clusterformer import ClusterFormerConfig

logger = logging.get_logger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# 1. Windowing
# ----------------------------------------------------------------------------------------------------------------


def count_windows(context_length, window_size: int, window_stride: int):
    """Windows needed to cover a context: ``1 + ceil(max(0, c - l) / m)`` (one window when ``c <= l``).

    Works on ints and on tensors of lengths.
    """
    if isinstance(context_length, torch.Tensor):
        beyond = (context_length - window_size).clamp(min=0)
        return 1 + torch.div(beyond + window_stride - 1, window_stride, rounding_mode="floor")
    return 1 + max(0, math.ceil((context_length - window_size) / window_stride))


@dataclass
class WindowLayout:
    """Where every window slot's token comes from.

    token_index: (B, K, S) long, position in the input sequence of each slot (0 for empty slots).
    valid: (B, K, S) bool, the slot holds a real token.
    is_context: (B, K, S) bool, the slot holds a context token (not the question prefix); implies ``valid``.
    owner: (B, K, S) bool, the slot is the copy of a context token that the cluster layer uses (the paper's
        ``H_k[0 : q + m]``: the first ``m`` context slots of window k, and the whole last window, so that every
        context token has exactly one owner copy, in window ``j // m`` or the last one).
    position_ids: (B, K, S) long, RoBERTa positions of a standalone ``<s> Q </s></s> window`` input.
    """

    token_index: torch.Tensor
    valid: torch.Tensor
    is_context: torch.Tensor
    owner: torch.Tensor
    position_ids: torch.Tensor

    @property
    def num_windows(self) -> int:
        return self.token_index.shape[1]

    @property
    def window_slots(self) -> int:
        return self.token_index.shape[2]


def build_window_layout(
    prefix_lengths: torch.Tensor,
    lengths: torch.Tensor,
    window_size: int,
    window_stride: int,
    num_windows: int,
    prefix_width: int,
    padding_idx: int = 1,
) -> WindowLayout:
    """Lay out sliding windows ``[prefix; context[m*k : m*k + l]]`` for a batch.

    Args:
        prefix_lengths: (B,) tokens of the question prefix ``<s> Q </s></s>`` of each example.
        lengths: (B,) real tokens of each example (prefix + context).
        window_size: l, context tokens per window.
        window_stride: m, step between windows.
        num_windows: K, windows per example (at least `count_windows` of the longest context).
        prefix_width: longest prefix in the batch; S = prefix_width + l.
        padding_idx: RoBERTa's padding index; positions start at ``padding_idx + 1``.

    Returns:
        `WindowLayout` with (B, K, S) tensors. Example b has ``count_windows(c_b, l, m)`` windows, the last one
        ending at or after its last token; the rest are empty.
    """
    device = lengths.device
    slots = torch.arange(prefix_width + window_size, device=device)  # (S,)
    windows = torch.arange(num_windows, device=device)  # (K,)
    prefix = prefix_lengths.view(-1, 1, 1)  # (B, 1, 1)
    context_length = (lengths - prefix_lengths).view(-1, 1, 1)
    windows_per_example = count_windows(context_length, window_size, window_stride)

    offset = slots.view(1, 1, -1) - prefix  # (B, 1, S) index into the window's context slice
    context_position = windows.view(1, -1, 1) * window_stride + offset  # (B, K, S)
    window_exists = windows.view(1, -1, 1) < windows_per_example  # (B, K, 1)
    in_prefix = offset < 0
    is_context = (offset >= 0) & (offset < window_size) & (context_position < context_length) & window_exists
    valid = (in_prefix & window_exists) | is_context
    token_index = torch.where(in_prefix, slots.view(1, 1, -1), prefix + context_position)
    token_index = torch.where(valid, token_index, torch.zeros_like(token_index))
    last_window = windows.view(1, -1, 1) == windows_per_example - 1
    owner = is_context & ((offset < window_stride) | last_window)
    position_ids = torch.where(valid, slots.view(1, 1, -1) + padding_idx + 1, torch.full_like(token_index, padding_idx))
    return WindowLayout(token_index, valid, is_context, owner, position_ids)


def windows_to_tokens(window_states: torch.Tensor, layout: WindowLayout, weight: torch.Tensor, length: int) -> torch.Tensor:
    """Average the window copies of every token: (B, K, S, d) -> (B, T, d).

    Args:
        window_states: (B, K, S, d) states in window layout.
        layout: the `WindowLayout` of those windows.
        weight: (B, K, S) bool, which copies take part (e.g. ``layout.valid``); tokens with none get zeros.
        length: T, the input length.
    """
    batch, _, _, hidden = window_states.shape
    weight = weight.to(window_states.dtype).unsqueeze(-1)  # (B, K, S, 1)
    index = layout.token_index.reshape(batch, -1, 1)
    sums = window_states.new_zeros(batch, length, hidden).scatter_add(
        1, index.expand(-1, -1, hidden), (window_states * weight).reshape(batch, -1, hidden)
    )
    counts = window_states.new_zeros(batch, length, 1).scatter_add(1, index, weight.reshape(batch, -1, 1))
    return sums / counts.clamp(min=1)


def tokens_to_windows(token_states: torch.Tensor, layout: WindowLayout) -> torch.Tensor:
    """Gather token states into window layout: (B, T, d) -> (B, K, S, d)."""
    batch, _, hidden = token_states.shape
    index = layout.token_index.reshape(batch, -1, 1).expand(-1, -1, hidden)
    return torch.gather(token_states, 1, index).view(*layout.token_index.shape, hidden)


def share_context_states(window_states: torch.Tensor, layout: WindowLayout, sources: torch.Tensor, length: int) -> torch.Tensor:
    """Give every copy of a context token the mean of its ``sources`` copies; question copies stay per window.

    Args:
        window_states: (B, K, S, d).
        layout: their `WindowLayout`.
        sources: (B, K, S) bool, the copies to average (all valid context copies after a sliding-window layer,
            the owner copies after a cluster layer).
        length: T.

    Returns:
        (B, K, S, d).
    """
    merged = tokens_to_windows(windows_to_tokens(window_states, layout, sources, length), layout)
    return torch.where(layout.is_context.unsqueeze(-1), merged, window_states)


# ----------------------------------------------------------------------------------------------------------------
# 2. Sorting into chunks
# ----------------------------------------------------------------------------------------------------------------


def sort_into_chunks(
    states: torch.Tensor, ids: torch.Tensor, chunk_size: int, sentinel: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stably sort states by (id, position) and cut them into uniform chunks (paper eq. 6-7).

    Args:
        states: (B, L, d).
        ids: (B, L) long cluster ids; slots with ``sentinel`` (the largest id) sort last and are marked invalid.
        chunk_size: m.
        sentinel: id of slots that take no part.

    Returns:
        chunks: (B * C, m, d) with C = ceil(L / m);
        chunk_valid: (B * C, m) bool;
        order: (B, C * m) long, the flat slot each chunk position came from (the sorting permutation,
        padded with indices >= L that point at appended empty slots).
    """
    batch, length, hidden = states.shape
    num_chunks = max(1, math.ceil(length / chunk_size))
    padded = num_chunks * chunk_size
    if padded > length:
        ids = F.pad(ids, (0, padded - length), value=sentinel)
        states = F.pad(states, (0, 0, 0, padded - length))
    order = torch.sort(ids, dim=1, stable=True).indices  # (B, C*m)
    sorted_states = torch.gather(states, 1, order.unsqueeze(-1).expand(-1, -1, hidden))
    chunk_valid = torch.gather(ids, 1, order) != sentinel
    return (
        sorted_states.view(batch * num_chunks, chunk_size, hidden),
        chunk_valid.view(batch * num_chunks, chunk_size),
        order,
    )


def unsort_from_chunks(chunks: torch.Tensor, order: torch.Tensor, length: int) -> torch.Tensor:
    """Invert `sort_into_chunks` by scattering (eq. 8): (B * C, m, d) -> (B, L, d)."""
    batch, padded = order.shape
    hidden = chunks.shape[-1]
    flat = chunks.reshape(batch, padded, hidden)
    restored = torch.empty_like(flat).scatter_(1, order.unsqueeze(-1).expand(-1, -1, hidden), flat)
    return restored[:, :length]


def bidirectional_mask(valid: torch.Tensor, dtype: torch.dtype, implementation: str | None) -> torch.Tensor:
    """Attention mask over one sequence axis: real queries see real keys, empty slots see only themselves.

    The self-key for empty slots means no row is fully masked (no NaN, no uniform attention over pads) while
    a pad never reaches a real token.

    Args:
        valid: (N, S) bool.
        dtype: dtype of the attention scores, for the additive form.
        implementation: ``config._attn_implementation``; "eager" gets an additive float mask, others bool.

    Returns:
        (N, 1, S, S) bool (True = attend) or float (0 / dtype min).
    """
    size = valid.shape[-1]
    eye = torch.eye(size, dtype=torch.bool, device=valid.device)
    allowed = (valid[:, None, None, :] & valid[:, None, :, None]) | eye
    if implementation in (None, "eager"):
        return torch.zeros(allowed.shape, dtype=dtype, device=valid.device).masked_fill(~allowed, torch.finfo(dtype).min)
    return allowed


# ----------------------------------------------------------------------------------------------------------------
# 3. Routers
# ----------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def order_centroids_greedy(centroids: torch.Tensor) -> torch.Tensor:
    """The paper's GetCentroids ordering: start at row 0, then repeatedly the nearest unused row by cosine.

    Neighbouring ids then hold similar states, so uniform chunks of the id-sorted sequence join related clusters.

    Args:
        centroids: (p, d).

    Returns:
        (p, d), the same rows reordered.
    """
    unit = F.normalize(centroids.float(), dim=-1)
    similarity = unit @ unit.T  # (p, p)
    count = centroids.shape[0]
    used = torch.zeros(count, dtype=torch.bool, device=centroids.device)
    order = [0]
    used[0] = True
    for _ in range(count - 1):
        scores = similarity[order[-1]].masked_fill(used, -math.inf)
        nxt = int(scores.argmax())
        order.append(nxt)
        used[nxt] = True
    return centroids[torch.tensor(order, device=centroids.device)]


class Float32BuffersModule(nn.Module):
    """Keeps floating buffers in fp32 through ``model.to(dtype)`` / ``.half()``; devices still follow."""

    def _apply(self, fn, recurse=True):
        kept = {name: b for name, b in self._buffers.items() if b is not None and b.is_floating_point()}
        result = super()._apply(fn, recurse)
        for name, original in kept.items():
            self._buffers[name] = original.to(device=self._buffers[name].device, dtype=torch.float32)
        return result


class ClusterRouter(Float32BuffersModule):
    """Assigns states to the nearest centroid by cosine similarity (paper eq. 4), in fp32 with autocast off.

    Buffers (saved with the weights): ``centroids`` (p, d) float32 unit rows in GetCentroids order, and
    ``fitted`` (0-dim bool), False until K-Means has written centroids.
    """

    def __init__(self, config: ClusterFormerConfig, layer_index: int):
        super().__init__()
        self.num_clusters = config.num_clusters
        self.layer_index = layer_index
        self.seed = config.centroid_seed + layer_index
        self.register_buffer("centroids", torch.zeros(config.num_clusters, config.hidden_size, dtype=torch.float32))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        self._warned = False

    def initial_centroids(self) -> torch.Tensor:
        """Seeded random unit vectors in GetCentroids order (Algorithm 1, ``GetCentroids(RandomVector)``): (p, d)."""
        generator = torch.Generator().manual_seed(self.seed)
        vectors = torch.randn(self.centroids.shape, generator=generator)
        return order_centroids_greedy(F.normalize(vectors, dim=-1))

    def forward(self, states: torch.Tensor, representative: torch.Tensor) -> torch.Tensor:
        """Cluster ids of the representative slots: (B, L, d), (B, L) bool -> (B, L) long, p for the rest."""
        if not self.training and not self._warned and not bool(self.fitted):
            logger.warning(
                f"Cluster layer {self.layer_index} runs with centroids that were never fitted by K-Means; "
                "train with hf_clusterformer.CentroidUpdateCallback (or CentroidUpdater) first."
            )
            self._warned = True
        with torch.autocast(device_type=states.device.type, enabled=False):
            unit_states = F.normalize(states.float(), dim=-1)
            unit_centroids = F.normalize(self.centroids.float(), dim=-1)
            ids = (unit_states @ unit_centroids.T).argmax(dim=-1)
        return ids.masked_fill(~representative, self.num_clusters)


class LSHRouter(Float32BuffersModule):
    """Reformer-style hashing: bucket = argmax over ``[x R; -x R]`` with fixed random ``hash_vectors`` (d, p / 2)."""

    def __init__(self, config: ClusterFormerConfig, layer_index: int):
        super().__init__()
        self.num_clusters = config.num_clusters
        self.seed = config.centroid_seed + layer_index
        self.register_buffer("hash_vectors", torch.zeros(config.hidden_size, config.num_clusters // 2, dtype=torch.float32))

    def initial_hash_vectors(self) -> torch.Tensor:
        """Seeded Gaussian projections: (d, p / 2)."""
        return torch.randn(self.hash_vectors.shape, generator=torch.Generator().manual_seed(self.seed))

    def forward(self, states: torch.Tensor, representative: torch.Tensor) -> torch.Tensor:
        """Bucket ids: (B, L, d), (B, L) bool -> (B, L) long, p for non-representative slots."""
        with torch.autocast(device_type=states.device.type, enabled=False):
            rotated = states.float() @ self.hash_vectors.float()
            ids = torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)
        return ids.masked_fill(~representative, self.num_clusters)


# ----------------------------------------------------------------------------------------------------------------
# 4. Model
# ----------------------------------------------------------------------------------------------------------------


class ClusterFormerLayer(RobertaLayer):
    """`RobertaLayer` (same parameter names) that also returns its attention weights."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        """(N, S, d), mask (N, 1, S, S) -> ((N, S, d), attention weights (N, h, S, S) or None)."""
        attention_output, attention_weights = self.attention(hidden_states, attention_mask, **kwargs)
        return self.feed_forward_chunk(attention_output), attention_weights


class ClusterFormerEncoder(nn.Module):
    """RoBERTa's layer stack (``layer.{i}``) plus one router per cluster/LSH layer (``routers.{i}``)."""

    def __init__(self, config: ClusterFormerConfig):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList([ClusterFormerLayer(config, layer_idx=i) for i in range(config.num_hidden_layers)])
        self.layer_kinds = config.encoder_layer_kinds
        routers = {}
        for index, kind in enumerate(self.layer_kinds):
            if kind == "cluster":
                routers[str(index)] = ClusterRouter(config, index)
            elif kind == "lsh":
                routers[str(index)] = LSHRouter(config, index)
        self.routers = nn.ModuleDict(routers)


@dataclass
class ClusterFormerModelOutput(ModelOutput):
    """Outputs of `ClusterFormerModel`.

    last_hidden_state: (B, T, d) aligned with ``input_ids``; context tokens merged over windows, question tokens the
        mean of their per-window copies, padding zeros.
    pooler_output: (B, d) the mean of the windows' ``<s>`` states (through RoBERTa's pooler when present).
    hidden_states: optional tuple of (B, T, d), embeddings and every layer, aligned like ``last_hidden_state``.
    attentions: optional tuple per layer of (N, h, S, S) in that layer's own layout (windows, chunks or positions).
    cluster_assignments: optional tuple per cluster/LSH layer of (B, L) ids over flat window slots, -1 where the slot
        took no part (padding or a repeated context copy).
    window_token_index: optional (B, K, S) input position of every window slot, -1 for empty slots; flattened to
        (B, L) it maps ``cluster_assignments`` to tokens.
    """

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cluster_assignments: tuple[torch.Tensor, ...] | None = None
    window_token_index: torch.Tensor | None = None


class ClusterFormerPreTrainedModel(RobertaPreTrainedModel):
    """Weight initialisation and loading shared by the Cluster-Former models."""

    config_class = ClusterFormerConfig
    config: ClusterFormerConfig
    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = False
    _keep_in_fp32_modules = ["routers"]
    _can_record_outputs = None

    def _init_weights(self, module):
        if isinstance(module, ClusterRouter):
            init.copy_(module.centroids, module.initial_centroids())
            init.copy_(module.fitted, torch.zeros((), dtype=torch.bool))
        elif isinstance(module, LSHRouter):
            init.copy_(module.hash_vectors, module.initial_hash_vectors())
        else:
            super()._init_weights(module)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, with a clear error when saved centroids do not fit the config."""
        try:
            return super().from_pretrained(*args, **kwargs)
        except RuntimeError as error:
            if "ignore_mismatched_sizes" not in str(error):
                raise
            raise ValueError(
                "The checkpoint's tensors (centroids or weights) have other shapes than this config asks for: "
                "num_clusters or hidden_size differ from the checkpoint's. Load without overriding them, or pass "
                "ignore_mismatched_sizes=True to re-initialise the mismatched centroids (then fit them again)."
            ) from error

    def cluster_routers(self) -> dict[int, ClusterRouter]:
        """The K-Means routers of this model by encoder layer index (what centroid updates write to)."""
        return {
            int(index): router
            for index, router in self.base_model.encoder.routers.items()
            if isinstance(router, ClusterRouter)
        }


class ClusterFormerModel(ClusterFormerPreTrainedModel):
    """Cluster-Former encoder over ``<s> question </s></s> context </s>`` inputs of any context length.

    Parameter names match `RobertaModel`, so RoBERTa checkpoints load 1:1 (centroids come from initialisation).
    """

    _no_split_modules = ["RobertaEmbeddings", "ClusterFormerLayer"]

    def __init__(self, config: ClusterFormerConfig, add_pooling_layer: bool = True):
        config.check_position_budget()
        super().__init__(config)
        self.config = config
        self.gradient_checkpointing = False
        self.embeddings = RobertaEmbeddings(config)
        self.encoder = ClusterFormerEncoder(config)
        self.pooler = RobertaPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    # -- input checks -------------------------------------------------------------------------------------------

    def _sequence_lengths(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        question_lengths: torch.Tensor | list[int] | None,
    ) -> tuple[list[int], list[int]]:
        """Validate the batch and return per-example (prefix lengths, real lengths) as Python ints."""
        config = self.config
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}.")
        if attention_mask is None:
            attention_mask = input_ids.ne(config.pad_token_id) if config.pad_token_id is not None else torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has {tuple(input_ids.shape)}; "
                "pass the attention_mask the tokenizer returned with these input_ids."
            )
        mask = attention_mask.bool()
        lengths = mask.sum(dim=1)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        right_padded = (mask == (positions < lengths.unsqueeze(1))).all(dim=1)
        if question_lengths is None:
            sep = config.sep_token_id if getattr(config, "sep_token_id", None) is not None else config.eos_token_id
            if isinstance(sep, (list, tuple)):
                sep = sep[0]
            is_sep = (input_ids == sep) & mask
            has_sep = is_sep.any(dim=1)
            first = torch.where(is_sep, positions, input_ids.shape[1]).min(dim=1).values
            next_is_sep = torch.gather(is_sep, 1, (first + 1).clamp(max=input_ids.shape[1] - 1).unsqueeze(1)).squeeze(1)
            prefix = first + 1 + next_is_sep.long()
        else:
            prefix = torch.as_tensor(question_lengths, device=input_ids.device).view(-1)
            has_sep = torch.ones_like(right_padded)
            if prefix.shape[0] != input_ids.shape[0]:
                raise ValueError(f"question_lengths has {prefix.shape[0]} entries for a batch of {input_ids.shape[0]}.")
        last_token = torch.gather(input_ids, 1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        ends_with_sep = last_token == (config.eos_token_id if not isinstance(config.eos_token_id, list) else config.eos_token_id[0])
        stats = torch.stack([prefix, lengths, right_padded.long(), has_sep.long(), ends_with_sep.long()]).tolist()
        prefixes, totals, padded_ok, sep_ok, sep_end = stats
        for row in range(input_ids.shape[0]):
            if not padded_ok[row]:
                raise ValueError(
                    f"attention_mask row {row} is not right-padded (ones then zeros); pad on the right "
                    "(tokenizer padding_side='right')."
                )
            if not sep_ok[row]:
                raise ValueError(
                    f"input_ids row {row} has no separator token, so the question cannot be found; encode inputs as "
                    "tokenizer(question, context) or pass question_lengths."
                )
            question = prefixes[row] - 3
            if question > config.max_question_length or prefixes[row] > config.question_prefix_limit:
                raise ValueError(
                    f"the question of row {row} has {question} tokens, more than config.max_question_length="
                    f"{config.max_question_length}; shorten the question or load the model with a larger "
                    "max_question_length (max_question_length + 3 + window_size must fit max_position_embeddings - 2)."
                )
            context = totals[row] - prefixes[row]
            if context - sep_end[row] <= 0:
                raise ValueError(f"row {row} has an empty context; give a non-empty context after the question.")
            if context > config.max_context_length:
                raise ValueError(
                    f"the context of row {row} has {context} tokens, more than config.max_context_length="
                    f"{config.max_context_length}; truncate it or raise max_context_length."
                )
        return prefixes, totals

    # -- forward ------------------------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        question_lengths: torch.Tensor | list[int] | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        output_cluster_assignments: bool = False,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ClusterFormerModelOutput | tuple:
        r"""
        Args:
            input_ids: (B, T) pair encodings ``<s> Q </s></s> C </s>``, right-padded.
            attention_mask: (B, T) 1 for real tokens, 0 for padding.
            token_type_ids: optional (B, T); by default 0, or with ``config.pair_token_types`` 0 for the question
                prefix and 1 for the context (BERT's pair template).
            question_lengths: optional (B,) length of the question prefix ``<s> Q </s></s>`` in tokens. By default it
                ends at the first separator and the separator right after it.
            output_hidden_states / output_attentions / output_cluster_assignments: extra outputs.

        Returns:
            `ClusterFormerModelOutput`.
        """
        config = self.config
        if input_ids is None:
            raise ValueError("ClusterFormerModel needs input_ids (the question is located through its separator tokens).")
        unsupported = set(kwargs) - {"position_ids", "inputs_embeds", "cache", "use_cache", "past_key_values"}
        if unsupported:
            raise TypeError(f"ClusterFormerModel.forward got unexpected arguments {sorted(unsupported)}.")
        if kwargs.get("inputs_embeds") is not None or kwargs.get("position_ids") is not None:
            raise ValueError("inputs_embeds and position_ids are not supported: positions restart in every window.")
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        return_dict = config.return_dict if return_dict is None else return_dict
        if output_attentions and config._attn_implementation != "eager":
            raise ValueError(
                "output_attentions=True needs the eager attention implementation; load the model with "
                "attn_implementation='eager' or call model.set_attn_implementation('eager')."
            )

        prefixes, totals = self._sequence_lengths(input_ids, attention_mask, question_lengths)
        batch, length = input_ids.shape
        stride, size = config.window_stride, config.window_size
        num_windows = max(count_windows(t - p, size, stride) for p, t in zip(prefixes, totals))
        device = input_ids.device
        layout = build_window_layout(
            torch.tensor(prefixes, device=device),
            torch.tensor(totals, device=device),
            size,
            stride,
            num_windows,
            max(prefixes),
            padding_idx=config.pad_token_id,
        )
        _, windows, slots = layout.token_index.shape

        window_ids = torch.gather(input_ids, 1, layout.token_index.view(batch, -1)).view(batch, windows, slots)
        window_ids = window_ids.masked_fill(~layout.valid, config.pad_token_id)
        if token_type_ids is not None:
            window_types = torch.gather(token_type_ids, 1, layout.token_index.view(batch, -1)).view(-1, slots)
        elif config.pair_token_types:  # BERT's pair types: 0 for the question prefix, 1 for the context
            window_types = layout.is_context.long().view(-1, slots)
        else:
            window_types = None
        states = self.embeddings(
            input_ids=window_ids.view(-1, slots), position_ids=layout.position_ids.view(-1, slots), token_type_ids=window_types
        ).view(batch, windows, slots, -1)

        hidden = states.shape[-1]
        implementation = config._attn_implementation
        window_mask = bidirectional_mask(layout.valid.view(-1, slots), states.dtype, implementation)
        all_hidden = (windows_to_tokens(states, layout, layout.valid, length),) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        assignments = () if output_cluster_assignments else None
        sparse_mask = chunk_mask = None
        # the states a cluster/LSH layer sorts: every window's question copy and each context token once
        representative = (layout.valid & (~layout.is_context | layout.owner)).view(batch, -1)

        for index, layer in enumerate(self.encoder.layer):
            kind = self.encoder.layer_kinds[index]
            if kind == "sliding":
                out, weights = layer(states.view(-1, slots, hidden), window_mask)
                states = share_context_states(out.view_as(states), layout, layout.is_context, length)
            elif kind == "sparse":
                # Attention across windows over the states at the same in-window slot (paper's Sparse Attention).
                across = states.transpose(1, 2).reshape(-1, windows, hidden)  # (B*S, K, d)
                if sparse_mask is None:
                    sparse_mask = bidirectional_mask(layout.valid.transpose(1, 2).reshape(-1, windows), states.dtype, implementation)
                out, weights = layer(across, sparse_mask)
                out = out.view(batch, slots, windows, hidden).transpose(1, 2)
                states = share_context_states(out, layout, layout.is_context, length)
            else:
                flat = states.reshape(batch, -1, hidden)
                router = self.encoder.routers[str(index)]
                ids = router(flat, representative)
                chunks, chunk_valid, order = sort_into_chunks(flat, ids, stride, router.num_clusters)
                if chunk_mask is None:  # the same for every cluster/LSH layer: each row's representatives sort first
                    chunk_mask = bidirectional_mask(chunk_valid, chunks.dtype, implementation)
                out, weights = layer(chunks, chunk_mask)
                flat_out = unsort_from_chunks(out, order, flat.shape[1]).view_as(states)
                states = share_context_states(flat_out, layout, layout.owner, length)
                if output_cluster_assignments:
                    assignments = assignments + (ids.masked_fill(~representative, -1),)
            if output_hidden_states:
                all_hidden = all_hidden + (windows_to_tokens(states, layout, layout.valid, length),)
            if output_attentions:
                all_attentions = all_attentions + (weights,)

        sequence_output = windows_to_tokens(states, layout, layout.valid, length)
        window_exists = layout.valid[:, :, 0].unsqueeze(-1).to(states.dtype)  # (B, K, 1)
        window_starts = (states[:, :, 0] * window_exists).sum(1) / window_exists.sum(1)  # (B, d)
        pooled = self.pooler(window_starts.unsqueeze(1)) if self.pooler is not None else window_starts
        token_index = layout.token_index.masked_fill(~layout.valid, -1) if output_cluster_assignments else None
        result = ClusterFormerModelOutput(
            last_hidden_state=sequence_output,
            pooler_output=pooled,
            hidden_states=all_hidden,
            attentions=all_attentions,
            cluster_assignments=assignments,
            window_token_index=token_index,
        )
        return result if return_dict else result.to_tuple()


@dataclass
class ClusterFormerQuestionAnsweringOutput(ModelOutput):
    """Outputs of `ClusterFormerForQuestionAnswering`.

    loss: span loss (+ answerability loss when that head exists and labels are given).
    start_logits, end_logits: (B, T), like `RobertaForQuestionAnswering`.
    answerable_logits: optional (B, 2) [no answer, has answer] from the pooled window ``<s>`` states.
    hidden_states, attentions, cluster_assignments, window_token_index: see `ClusterFormerModelOutput`.
    """

    loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None
    answerable_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cluster_assignments: tuple[torch.Tensor, ...] | None = None
    window_token_index: torch.Tensor | None = None


class ClusterFormerForQuestionAnswering(ClusterFormerPreTrainedModel):
    """Extractive QA head (start/end logits over every input token) on `ClusterFormerModel`.

    Loads `RobertaForQuestionAnswering` checkpoints 1:1 (``roberta.*`` and ``qa_outputs.*``).
    """

    def __init__(self, config: ClusterFormerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.roberta = ClusterFormerModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.answerability = nn.Linear(config.hidden_size, 2) if config.use_answerability_head else None
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        question_lengths: torch.Tensor | list[int] | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        answerable_labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        output_cluster_assignments: bool = False,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ClusterFormerQuestionAnsweringOutput | tuple:
        r"""
        Args:
            input_ids, attention_mask, token_type_ids, question_lengths: see `ClusterFormerModel.forward`.
            start_positions, end_positions: (B,) token indices of the answer span; out-of-range values are ignored.
            answerable_labels: (B,) 1 if the context holds an answer, 0 if not (needs ``use_answerability_head``).

        Returns:
            `ClusterFormerQuestionAnsweringOutput` with (B, T) start/end logits.
        """
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.roberta(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            question_lengths=question_lengths,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            output_cluster_assignments=output_cluster_assignments,
            return_dict=True,
            **kwargs,
        )
        logits = self.qa_outputs(outputs.last_hidden_state)
        start_logits, end_logits = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        answerable_logits = self.answerability(outputs.pooler_output) if self.answerability is not None else None

        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.size(1)
            loss_fct = CrossEntropyLoss(ignore_index=ignored)
            start_loss = loss_fct(start_logits, start_positions.view(-1).clamp(0, ignored))
            end_loss = loss_fct(end_logits, end_positions.view(-1).clamp(0, ignored))
            loss = (start_loss + end_loss) / 2
        if answerable_labels is not None:
            if answerable_logits is None:
                raise ValueError("answerable_labels need config.use_answerability_head=True.")
            answer_loss = CrossEntropyLoss()(answerable_logits, answerable_labels.view(-1).long())
            loss = answer_loss if loss is None else loss + answer_loss

        result = ClusterFormerQuestionAnsweringOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            answerable_logits=answerable_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            cluster_assignments=outputs.cluster_assignments,
            window_token_index=outputs.window_token_index,
        )
        return result if return_dict else result.to_tuple()


__all__ = [
    "ClusterFormerForQuestionAnswering",
    "ClusterFormerModel",
    "ClusterFormerPreTrainedModel",
    "ClusterRouter",
    "LSHRouter",
    "WindowLayout",
    "bidirectional_mask",
    "build_window_layout",
    "count_windows",
    "order_centroids_greedy",
    "share_context_states",
    "sort_into_chunks",
    "tokens_to_windows",
    "unsort_from_chunks",
    "windows_to_tokens",
]
