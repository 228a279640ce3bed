"""A slow reference of the whole Cluster-Former QA model: Python loops over one example's windows and chunks.

Written from the paper's equations 1-8 and the README's input contract (and, for the window_cluster kind beyond the
paper, from its description in the modeling file), for one example at a time and without padding. It shares no code
with ``src/``: it reads the model's parameters and router buffers and calls only transformers' RoBERTa modules
(``RobertaEmbeddings``, ``RobertaAttention``, the feed-forward block of ``RobertaLayer``, a layer's linear maps and
LayerNorm); a window_cluster layer's attention it writes out by its equation.

The contract it follows:

- The question prefix ends at the first separator, plus the next token when it is a separator too
  (``<s> Q </s></s>`` or ``[CLS] Q [SEP]``), unless its length is given. The rest is the context (closing
  separator included).
- Window k is ``[prefix; context[m k : m k + l]]``, numbered by positions ``pad + 1, pad + 2, ...`` as a standalone
  input; windows are added while the last one ends before the context does.
- Sliding layer (eq. 1-3): a RoBERTa layer per window; every context token then takes the mean of its copies.
- Sparse layer: a RoBERTa layer over the copies at one in-window slot, across windows; then the same mean.
- Cluster/LSH layer (eq. 4-8): the sequence ``[H_0[0:p+m]; H_1[0:p+m]; ...]`` (the last window whole, so every
  context token appears once: its copy in window ``min(i // m, K - 1)``) gets ids (cosine argmax against the
  centroids, or argmax over ``[xR; -xR]``), is sorted stably by id, cut into chunks of m, and every chunk goes
  through a RoBERTa layer; every copy of a context token then takes its routed copy's output, every question
  copy its own. With ``chunk_question_prefix`` only the context tokens are routed, each chunk is
  ``[mean question prefix; chunk]``, and every question copy takes the mean over chunks of the prefix outputs.
  With ``route_by="keys"`` the ids come from the layer's key projection of each state instead of the state.
- Window-cluster layer (beyond the paper): the cluster layer's routing, sort and chunks give every routed copy the
  attention context ``softmax(Q K^T / sqrt(d_h)) V`` (heads concatenated, before the output projection) of its chunk;
  every copy of a context token takes its routed copy's context, every question copy its own. Each window then runs
  as a sliding layer whose attention output is ``LayerNorm(dense(window context) + routed_output(routed context) +
  input)``, then the feed-forward block; then the same mean as a sliding layer.
- Outputs: every token the mean of its copies; QA logits from ``qa_outputs``; the answerability head on the mean
  of the windows' first states.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.models.roberta.modeling_roberta import RobertaAttention, RobertaLayer

#: Largest score gap at which the reference accepts the model's id in place of its own argmax (float noise).
TIE_TOLERANCE = 1e-4


@dataclass
class ReferenceOutput:
    """One example's outputs over its n real tokens.

    hidden_states: per layer, embeddings first, (n, d) token-aligned means of the copies.
    start_logits, end_logits: (n,).
    answerable_logits: (2,) or None.
    ties: routed states where the reference took the model's id from a near tie.
    ids: per routed layer, the id of every routed copy by its (window, slot).
    """

    hidden_states: list[torch.Tensor]
    start_logits: torch.Tensor
    end_logits: torch.Tensor
    answerable_logits: torch.Tensor | None
    ties: int = 0
    ids: list[dict[tuple[int, int], int]] = field(default_factory=list)


def _layer(model, index: int, rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """transformers' RoBERTa layer ``index`` over one unpadded sequence: n rows of (d,) -> n rows of (d,).

    ``RobertaLayer.forward`` without its optional feed-forward chunking (a per-token split that does not change the
    result, and that transformers allows only for lengths divisible by ``chunk_size_feed_forward``): self-attention,
    then the feed-forward block.
    """
    layer = model.roberta.encoder.layer[index]
    attended = RobertaAttention.forward(layer.attention, torch.stack(rows).unsqueeze(0))[0]
    return list(RobertaLayer.feed_forward_chunk(layer, attended)[0])


def _contexts(model, index: int, rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """Multi-head self-attention of layer ``index`` over one unpadded sequence, by its equation and before the output
    projection: every row's ``softmax(q k^T / sqrt(d_h)) V`` over all rows, heads concatenated: n rows of (d,) -> n
    rows of (d,)."""
    attention = model.roberta.encoder.layer[index].attention.self
    heads = model.config.num_attention_heads
    x = torch.stack(rows)  # (n, d)
    q, k, v = (projection(x).view(len(rows), heads, -1).transpose(0, 1)  # (h, n, d_h)
               for projection in (attention.query, attention.key, attention.value))
    probabilities = torch.softmax(q @ k.transpose(1, 2) / q.shape[-1] ** 0.5, dim=-1)  # (h, n, n)
    return list((probabilities @ v).transpose(0, 1).reshape(len(rows), -1))


def _window_layer(model, index: int, rows: list[torch.Tensor], routed: list[torch.Tensor]) -> list[torch.Tensor]:
    """A window-cluster layer over one window: n rows of (d,) and their routed contexts n rows of (d,) -> n rows of
    (d,). The window's attention output and the routed one (each through its own projection) join the residual sum
    before the LayerNorm; then the feed-forward block."""
    layer = model.roberta.encoder.layer[index]
    output = layer.attention.output
    x = torch.stack(rows)
    window = F.linear(torch.stack(_contexts(model, index, rows)), output.dense.weight, output.dense.bias)
    extra = F.linear(torch.stack(routed), layer.routed_output.weight, layer.routed_output.bias)
    attended = output.LayerNorm(window + extra + x)
    return list(RobertaLayer.feed_forward_chunk(layer, attended.unsqueeze(0))[0])


def _mean(rows: list[torch.Tensor]) -> torch.Tensor:
    """Mean of rows of (d,): (d,)."""
    return torch.stack(rows).mean(0)


class Example:
    """One example's windows: per window the token index of each slot, its prefix length p and its context."""

    def __init__(self, length: int, prefix: int, window_size: int, window_stride: int):
        self.length, self.prefix = length, prefix
        context = length - prefix
        starts = [0]
        while starts[-1] + window_size < context:
            starts.append(starts[-1] + window_stride)
        self.windows = [list(range(prefix)) + [prefix + i for i in range(s, min(s + window_size, context))]
                        for s in starts]
        self.stride = window_stride
        self.copies: dict[int, list[tuple[int, int]]] = {}  # token -> (window, slot) of every copy
        for k, window in enumerate(self.windows):
            for j, t in enumerate(window):
                self.copies.setdefault(t, []).append((k, j))
        # the routed copy of context position i (token prefix + i): window min(i // m, K - 1)
        self.owner = {prefix + i: min(i // window_stride, len(starts) - 1) for i in range(context)}
        self.owner_slot = {t: (k, self.windows[k].index(t)) for t, k in self.owner.items()}


def separator_id(config) -> int:
    """The token that ends the question: ``sep_token_id`` when the config has one, else ``eos_token_id``."""
    sep = getattr(config, "sep_token_id", None)
    sep = config.eos_token_id if sep is None else sep
    return sep[0] if isinstance(sep, (list, tuple)) else sep


def find_prefix(is_separator: list[bool]) -> int:
    """Question prefix length of one unpadded example: up to the first separator, and the next if it is one too."""
    first = is_separator.index(True)
    return first + 1 + (1 if first + 1 < len(is_separator) and is_separator[first + 1] else 0)


def reference_forward(
    model,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    prefix_length: int | None = None,
    model_ids: list[torch.Tensor] | None = None,
    slots_per_window: int | None = None,
) -> ReferenceOutput:
    """The QA model on one unpadded example, by loops.

    Args:
        model: a ``ClusterFormerForQuestionAnswering`` (only its parameters, buffers, config and transformers'
            RoBERTa modules are used).
        input_ids: (n,) long, or inputs_embeds: (n, d).
        token_type_ids: optional (n,).
        prefix_length: the question prefix length, else found from the separators.
        model_ids: optional, per routed layer, the model's (L,) ids over its flat window slots ``k * S + j``
            (``S = slots_per_window``); where the model's id differs from the reference's argmax by a score gap of
            at most `TIE_TOLERANCE` it is taken (a float near tie), a larger gap fails.
        slots_per_window: S of the model's layout, to read ``model_ids``.
    """
    config = model.config
    embeddings = model.roberta.embeddings
    sep = separator_id(config)
    sep_row = embeddings.word_embeddings.weight[sep]
    if input_ids is not None:
        length = input_ids.shape[0]
        is_sep = [int(t) == sep for t in input_ids]
    else:
        length = inputs_embeds.shape[0]
        is_sep = [bool(torch.equal(row, sep_row)) for row in inputs_embeds]
    prefix = find_prefix(is_sep) if prefix_length is None else prefix_length
    example = Example(length, prefix, config.window_size, config.window_stride)

    # embeddings of every window as a standalone input
    states = []  # per window, a list of (d,) rows
    for window in example.windows:
        index = torch.tensor(window)
        positions = torch.arange(len(window)) + config.pad_token_id + 1
        if token_type_ids is not None:
            types = token_type_ids[index]
        elif config.pair_token_types:
            types = torch.tensor([0 if t < prefix else 1 for t in window])
        else:
            types = torch.zeros(len(window), dtype=torch.long)
        emb = embeddings(
            input_ids=None if input_ids is None else input_ids[index].unsqueeze(0),
            inputs_embeds=None if inputs_embeds is None else inputs_embeds[index].unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            token_type_ids=types.unsqueeze(0),
        )[0]
        states.append(list(emb))

    output = ReferenceOutput([], None, None, None)
    output.hidden_states.append(_token_means(example, states))
    routed = 0
    for index, kind in enumerate(config.layer_kinds):
        if kind == "sliding":
            states = _share_means(example, [_layer(model, index, window) for window in states])
        elif kind == "sparse":
            states = _share_means(example, _sparse(model, index, states))
        else:
            given = None if model_ids is None else model_ids[routed]
            router = model.roberta.encoder.routers[str(index)]
            if kind == "window_cluster":
                states = _share_means(example, _window_cluster(model, index, router, example, states, given,
                                                               slots_per_window, output))
            elif config.chunk_question_prefix:
                states = _prefixed_routed(model, index, router, kind, example, states, given, slots_per_window, output)
            else:
                states = _routed(model, index, router, kind, example, states, given, slots_per_window, output)
            routed += 1
        output.hidden_states.append(_token_means(example, states))

    final = output.hidden_states[-1]
    logits = F.linear(final, model.qa_outputs.weight, model.qa_outputs.bias)  # (n, 2)
    output.start_logits, output.end_logits = logits[:, 0], logits[:, 1]
    if model.answerability is not None:
        pooled = _mean([window[0] for window in states])
        output.answerable_logits = F.linear(pooled, model.answerability.weight, model.answerability.bias)
    return output


def _token_means(example: Example, states: list[list[torch.Tensor]]) -> torch.Tensor:
    """Every token the mean of its copies: windows of rows -> (n, d)."""
    return torch.stack([_mean([states[k][j] for k, j in example.copies[t]]) for t in range(example.length)])


def _share_means(example: Example, states: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Every context copy the mean of the token's copies; question copies stay per window (eq. 3)."""
    means = {t: _mean([states[k][j] for k, j in example.copies[t]]) for t in example.owner}
    return [[row if t < example.prefix else means[t] for t, row in zip(window, rows)]
            for window, rows in zip(example.windows, states)]


def _sparse(model, index: int, states: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """A RoBERTa layer across windows over the copies at each in-window slot."""
    out = [list(rows) for rows in states]
    for j in range(max(len(rows) for rows in states)):
        windows = [k for k, rows in enumerate(states) if j < len(rows)]
        for k, row in zip(windows, _layer(model, index, [states[k][j] for k in windows])):
            out[k][j] = row
    return out


def _route(router, kind: str, row: torch.Tensor, given: int | None, output: ReferenceOutput, key=None) -> int:
    """Cluster id of one state (d,): eq. 4's cosine argmax (cluster and window_cluster layers), or LSH's argmax over
    ``[xR; -xR]``, of the state or, given ``key`` (the layer's key projection, ``route_by="keys"``), of ``key(row)``;
    near ties may take the model's id ``given``."""
    with torch.no_grad():
        x = (row if key is None else key(row)).double()
        if kind != "lsh":
            centroids = router.centroids.double()
            scores = torch.stack([x @ c / (x.norm().clamp(min=1e-12) * c.norm().clamp(min=1e-12)) for c in centroids])
        else:
            rotated = x @ router.hash_vectors.double()
            scores = torch.cat([rotated, -rotated])
    best = int(scores.argmax())
    if given is None or given == best:
        return best
    gap = float(scores[best] - scores[given])
    assert gap <= TIE_TOLERANCE * max(1.0, float(scores[best].abs())), (
        f"the model routed a state to {given}, the reference to {best} (score gap {gap:.3g})"
    )
    output.ties += 1
    return given


def _given_id(given: torch.Tensor | None, slots: int | None, k: int, j: int) -> int | None:
    """The model's id of window k's slot j, if given."""
    return None if given is None else int(given[k * slots + j])


def _route_sequence(model, index, router, kind, states, sequence, given, slots, output) -> list[int]:
    """The ids of the routed copies ``sequence`` ((window, slot) pairs) by the layer's ``route_by``, recorded in
    ``output.ids``."""
    key = model.roberta.encoder.layer[index].attention.self.key if model.config.route_by == "keys" else None
    ids = [_route(router, kind, states[k][j], _given_id(given, slots, k, j), output, key) for k, j in sequence]
    output.ids.append(dict(zip(sequence, ids)))
    return ids


def _routed_sequence(example: Example) -> list[tuple[int, int]]:
    """The copies a routed layer sorts, in position order: every window's question copies and each context token's
    owner copy (eq. 5's ``[H_0[0:p+m]; H_1[0:p+m]; ...]``, the last window whole)."""
    return [(k, j) for k, window in enumerate(example.windows) for j, t in enumerate(window)
            if t < example.prefix or example.owner[t] == k]


def _routed(model, index, router, kind, example, states, given, slots, output) -> list[list[torch.Tensor]]:
    """The paper's Cluster-Former layer (eq. 4-8) on one example."""
    m = example.stride
    sequence = _routed_sequence(example)
    ids = _route_sequence(model, index, router, kind, states, sequence, given, slots, output)
    order = sorted(range(len(sequence)), key=lambda i: ids[i])  # Python's sort is stable: ties keep their position
    result = {}
    for begin in range(0, len(order), m):
        members = [sequence[i] for i in order[begin : begin + m]]
        for slot, row in zip(members, _layer(model, index, [states[k][j] for k, j in members])):
            result[slot] = row
    return [[result[(k, j) if t < example.prefix else example.owner_slot[t]] for j, t in enumerate(window)]
            for k, window in enumerate(example.windows)]


def _prefixed_routed(model, index, router, kind, example, states, given, slots, output) -> list[list[torch.Tensor]]:
    """The routed layer with ``chunk_question_prefix``: context tokens routed, every chunk behind the mean prefix."""
    m, p = example.stride, example.prefix
    prefix = [_mean([rows[j] for rows in states]) for j in range(p)]
    tokens = sorted(example.owner)  # context tokens in order; each routed from its owner copy
    where = example.owner_slot
    ids = _route_sequence(model, index, router, kind, states, [where[t] for t in tokens], given, slots, output)
    order = sorted(range(len(tokens)), key=lambda i: ids[i])
    result, prefix_outs = {}, []
    for begin in range(0, len(order), m):
        members = [tokens[i] for i in order[begin : begin + m]]
        out = _layer(model, index, prefix + [states[where[t][0]][where[t][1]] for t in members])
        prefix_outs.append(out[:p])
        result.update(zip(members, out[p:]))
    question = [_mean([outs[j] for outs in prefix_outs]) for j in range(p)]
    return [[question[t] if t < p else result[t] for t in window] for window in example.windows]


def _window_cluster(model, index, router, example, states, given, slots, output) -> list[list[torch.Tensor]]:
    """A window-cluster layer before the mean of the copies: every routed copy gets its chunk's attention context, the
    other context copies their routed copy's, and every window runs its attention with them added (`_window_layer`)."""
    m = example.stride
    sequence = _routed_sequence(example)
    ids = _route_sequence(model, index, router, "window_cluster", states, sequence, given, slots, output)
    order = sorted(range(len(sequence)), key=lambda i: ids[i])
    context = {}
    for begin in range(0, len(order), m):
        members = [sequence[i] for i in order[begin : begin + m]]
        context.update(zip(members, _contexts(model, index, [states[k][j] for k, j in members])))
    routed = [[context[(k, j) if t < example.prefix else example.owner_slot[t]] for j, t in enumerate(window)]
              for k, window in enumerate(example.windows)]
    return [_window_layer(model, index, rows, extra) for rows, extra in zip(states, routed)]
