"""The whole QA model against the slow loop reference (tests/reference_encoder.py) over drawn configurations and
inputs.

Drawn: window size and stride (no overlap, two-way and three-way overlaps), 1-4 layers of any types (window_cluster
ones with their routed projection drawn away from its zero start), 1 to more clusters than tokens, ``route_by``
(states or keys), ``chunk_question_prefix`` (without window_cluster layers, which refuse it), the answerability head,
eager or sdpa attention, 1-4 heads, chunked feed-forward, eval or training mode (dropout off) with or without
activation checkpointing, batches of 1-4 examples of different lengths padded left or right, question lengths
1..``max_question_length``, contexts shorter than a window, one window long or longer, RoBERTa
(``<s> Q </s></s> C </s>``) or BERT (``[CLS] Q [SEP] C [SEP]``, a converted checkpoint's ids) templates with default,
pair or given token types, ids or ``inputs_embeds``, question prefixes found from the separators or given
(``question_lengths``, also one token off the separators).

Checked: hidden states, QA and answerability logits equal the reference (1e-5, fp32); every example equals itself
run alone; more padding with other values changes no real output, and padding outputs zeros; no NaN/inf; the
gradients of every trainable parameter (and of ``inputs_embeds``) on the QA loss are finite and equal the reference's
(1e-5 of the gradient's largest entry where that exceeds 1: fp32 sums over every token grow with it).

The default profile is deterministic and short (`make test`); `make fuzz` runs the long one:
``CLUSTERFORMER_FUZZ_EXAMPLES`` examples from the seed ``CLUSTERFORMER_FUZZ_SEED``.
"""

from __future__ import annotations

import copy
import os
import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, event, example, given, seed, settings
from hypothesis import strategies as st
from reference_encoder import Example, reference_forward
from transformers import RobertaConfig, RobertaForQuestionAnswering

from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering

#: Special ids (bos, pad, separator) and separators after the question: RoBERTa's, and BERT's as converted checkpoints
#: hold them (padding 0, so positions start at 1).
TEMPLATES = {"roberta": (0, 1, 2, 2), "bert": (3, 0, 4, 1)}
VOCAB = 40
HIDDEN = 16
#: The model's fp32 outputs and gradients against the reference's (absolute and relative).
TOLERANCE = 1e-5
#: Where they differ by more: fp32 rounding (against the fp32 reference) and float64 (against the float64 reference).
ROUNDING, EXACT = 1e-3, 1e-9
TYPES = ("sliding", "cluster", "lsh", "sparse", "window_cluster")

FUZZ_EXAMPLES = int(os.environ.get("CLUSTERFORMER_FUZZ_EXAMPLES", "0"))
FUZZ_SEED = os.environ.get("CLUSTERFORMER_FUZZ_SEED")
PROFILE = settings(
    max_examples=FUZZ_EXAMPLES or 200,
    derandomize=not FUZZ_EXAMPLES,  # the default profile draws the same examples on every run
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class Case:
    """A drawn model configuration and batch.

    config: `ClusterFormerConfig` fields; attention: its attention implementation; weight_seed: of the weights, the
    centroids and the targets. Per example: examples (its real token ids), token_types (given ones, or None),
    sides (its padding side), prefixes (its question prefix length, passed when give_prefix). extra_padding: columns
    added in the padding check; embeds: pass inputs_embeds; training / checkpointing: the model's mode.
    """

    config: dict
    attention: str
    weight_seed: int
    examples: list[list[int]]
    token_types: list[list[int]] | None
    sides: list[str]
    extra_padding: int
    embeds: bool
    give_prefix: bool
    prefixes: list[int]
    training: bool
    checkpointing: bool


@st.composite
def cases(draw) -> Case:
    """A configuration and a batch within its limits (see the module docstring)."""
    overlap = draw(st.sampled_from(["none", "two", "three"]))
    size = draw(st.integers({"none": 1, "two": 2, "three": 3}[overlap], 9))
    if overlap == "two":
        stride = draw(st.integers((size + 1) // 2, size - 1))  # m < l <= 2m
    elif overlap == "three":
        stride = draw(st.integers(1, (size - 1) // 2))  # l > 2m
    else:
        stride = size
    depth = draw(st.integers(1, 4))
    layer_types = draw(st.lists(st.sampled_from(TYPES), min_size=depth, max_size=depth))
    max_question = draw(st.integers(1, 4))
    template = draw(st.sampled_from(sorted(TEMPLATES)))
    bos, pad, sep, separators = TEMPLATES[template]
    words = [t for t in range(VOCAB) if t != sep]
    types_from = draw(st.sampled_from(["none", "pair", "given"] if template == "bert" else ["none", "given"]))
    give_prefix = draw(st.booleans())

    examples, prefixes, types = [], [], []
    for _ in range(draw(st.integers(1, 4))):
        question = draw(st.lists(st.sampled_from(words), min_size=1, max_size=max_question))
        kind = draw(st.sampled_from(["short", "one", "long"]))
        window_context = {  # context tokens in the windows, closing separator included
            "short": lambda: draw(st.integers(2, max(2, size - 1))),
            "one": lambda: max(2, size),
            "long": lambda: draw(st.integers(size + 1, size + 4 * stride + 1)),
        }[kind]()
        first = draw(st.sampled_from(words))
        rest = draw(st.lists(st.integers(0, VOCAB - 1), min_size=window_context - 2, max_size=window_context - 2))
        tokens = [bos, *question, *[sep] * separators, first, *rest, sep]
        prefix = len(question) + 1 + separators
        if give_prefix:  # question_lengths passed: the drawn one, or one token more or fewer
            prefix = draw(st.integers(max(1, prefix - 1), min(prefix + 1, max_question + 3, len(tokens) - 2)))
        prefixes.append(prefix)
        examples.append(tokens)
        if types_from == "given":
            types.append(draw(st.lists(st.integers(0, 1), min_size=len(tokens), max_size=len(tokens))))

    longest = max(len(tokens) for tokens in examples)
    clusters = draw(st.one_of(st.just(1), st.integers(2, 8), st.integers(longest + 1, longest + 8)))
    if "lsh" in layer_types:
        clusters += clusters % 2
    config = dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=depth, intermediate_size=32,
        num_attention_heads=draw(st.sampled_from([1, 2, 4])),
        chunk_size_feed_forward=draw(st.sampled_from([0, 0, 1, 3])),
        layer_types=layer_types, num_clusters=clusters, window_size=size, window_stride=stride,
        max_question_length=max_question, max_context_length=4096,
        max_position_embeddings=pad + 1 + max_question + 3 + size + draw(st.integers(0, 2)),
        chunk_question_prefix="window_cluster" not in layer_types and draw(st.booleans()),
        route_by=draw(st.sampled_from(["states", "keys"])), use_answerability_head=draw(st.booleans()),
        pair_token_types=types_from == "pair",
        type_vocab_size=draw(st.sampled_from([1, 2])) if types_from == "none" else 2,
        initializer_range=draw(st.sampled_from([0.02, 0.3])),
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        pad_token_id=pad, bos_token_id=bos, eos_token_id=sep,
    )
    return Case(
        config=config, attention=draw(st.sampled_from(["eager", "sdpa"])), weight_seed=draw(st.integers(0, 2**16)),
        examples=examples, token_types=types if types_from == "given" else None,
        sides=draw(st.lists(st.sampled_from(["left", "right"]), min_size=len(examples), max_size=len(examples))),
        extra_padding=draw(st.integers(1, 3)), embeds=draw(st.booleans()), give_prefix=give_prefix,
        prefixes=prefixes, training=draw(st.booleans()), checkpointing=draw(st.booleans()),
    )


def issue_22_case() -> Case:
    """Issue 22's crash: windows without overlap (l == m), a cluster layer then a sliding one, a padded batch of
    two."""
    rng = random.Random(0)
    examples = [[0] + [rng.randrange(3, 300) for _ in range(5)] + [2, 2]
                + [rng.randrange(3, 300) for _ in range(300 - 10 * i)] + [2] for i in range(2)]
    config = dict(
        vocab_size=300, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
        window_size=64, window_stride=64, cluster_layers=[2], num_clusters=16, max_position_embeddings=89,
        max_question_length=20, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    )
    return Case(config=config, attention="sdpa", weight_seed=0, examples=examples, token_types=None,
                sides=["right", "right"], extra_padding=1, embeds=False, give_prefix=False, prefixes=[8, 8],
                training=False, checkpointing=False)


def build_model(case: Case) -> ClusterFormerForQuestionAnswering:
    """The drawn model, its cluster routers holding fitted random unit centroids and its window_cluster layers' routed
    projections random (at their zero start the routed path would change nothing)."""
    config = ClusterFormerConfig(**case.config)
    config._attn_implementation = case.attention
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.weight_seed)
        model = ClusterFormerForQuestionAnswering(config).train(case.training)  # dropout is off: the same function
        for router in model.cluster_routers().values():
            router.centroids.copy_(F.normalize(torch.randn_like(router.centroids), dim=-1))
            router.fitted.fill_(True)
        with torch.no_grad():
            for layer in model.roberta.encoder.layer:
                if hasattr(layer, "routed_output"):
                    layer.routed_output.weight.normal_(std=0.3)
                    layer.routed_output.bias.normal_(std=0.3)
    if case.checkpointing:  # recomputes the layers in backward when training
        model.activation_checkpointing_enable()
    return model


def word_inputs(model, case: Case) -> list[torch.Tensor]:
    """Per example, (n,) ids or, with ``case.embeds``, (n, d) embeddings: the separators' rows exact, the others
    their word embedding plus noise."""
    if not case.embeds:
        return [torch.tensor(tokens) for tokens in case.examples]
    generator = torch.Generator().manual_seed(case.weight_seed)
    table = model.roberta.embeddings.word_embeddings.weight.detach()
    rows = []
    for tokens in case.examples:
        ids = torch.tensor(tokens)
        noise = 0.1 * torch.randn(len(tokens), HIDDEN, generator=generator)
        noise = noise * (ids != case.config["eos_token_id"]).unsqueeze(-1)
        rows.append((table[ids] + noise).requires_grad_())
    return rows


def pad(case: Case, inputs: list[torch.Tensor], extra: int = 0, garbage: int | None = None):
    """Pad the examples on their sides to the longest plus ``extra``, with pad ids / zeros, or random values from the
    seed ``garbage``.

    Returns (B, T) ids or (B, T, d) embeddings, (B, T) mask, (B, T) token types or None, and every row's first
    real index.
    """
    width = max(len(x) for x in inputs) + extra
    generator = torch.Generator().manual_seed(garbage) if garbage is not None else None
    rows, masks, types, starts = [], [], [], []
    for row, (x, side) in enumerate(zip(inputs, case.sides)):
        missing = width - len(x)
        if generator is None:
            pad_id = case.config["pad_token_id"]
            filler = torch.zeros(missing, HIDDEN) if case.embeds else torch.full((missing,), pad_id)
        elif case.embeds:
            filler = torch.randn(missing, HIDDEN, generator=generator)
        else:
            filler = torch.randint(0, VOCAB, (missing,), generator=generator)
        start = missing if side == "left" else 0
        rows.append(torch.cat([filler, x] if side == "left" else [x, filler]))
        masks.append((torch.arange(width) >= start) & (torch.arange(width) < start + len(x)))
        if case.token_types is not None:
            kinds = torch.tensor(case.token_types[row])
            zeros = torch.zeros(missing, dtype=torch.long)
            types.append(torch.cat([zeros, kinds] if side == "left" else [kinds, zeros]))
        starts.append(start)
    return torch.stack(rows), torch.stack(masks).long(), torch.stack(types) if types else None, starts


def run(model, case: Case, rows: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None, prefixes: list[int]):
    """The model on a padded batch, with every hidden state and cluster assignment."""
    return model(
        input_ids=None if case.embeds else rows, inputs_embeds=rows if case.embeds else None, attention_mask=mask,
        token_type_ids=types, question_lengths=prefixes if case.give_prefix else None,
        output_hidden_states=True, output_cluster_assignments=True,
    )


def assignments(output, row: int) -> list[dict[tuple[int, int], int]]:
    """Per routed layer, the ids of one row's routed window slots: {(window, slot): id}."""
    windows, slots = output.window_token_index.shape[1:]
    found = []
    for ids in output.cluster_assignments:
        grid = ids[row].view(windows, slots)
        found.append({(k, j): int(grid[k, j]) for k, j in (grid >= 0).nonzero().tolist()})
    return found


def example_outputs(output, row: int, start: int, length: int) -> dict[str, torch.Tensor]:
    """One row's real outputs: hidden states (layers, n, d) and logits."""
    real = slice(start, start + length)
    found = {
        "hidden": torch.stack([h[row, real] for h in output.hidden_states]),
        "start": output.start_logits[row, real],
        "end": output.end_logits[row, real],
    }
    if output.answerable_logits is not None:
        found["answerable"] = output.answerable_logits[row]
    return found


def reference_outputs(reference) -> dict[str, torch.Tensor]:
    """The reference's outputs in the form of `example_outputs`."""
    found = {"hidden": torch.stack(reference.hidden_states), "start": reference.start_logits,
             "end": reference.end_logits}
    if reference.answerable_logits is not None:
        found["answerable"] = reference.answerable_logits
    return found


class NotClose(AssertionError):
    """Outputs or gradients differ from the reference's by more than the tolerance (fp32 rounding, or a difference)."""


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float, what: str) -> None:
    """`torch.testing.assert_close` at ``tolerance`` (absolute and relative), failing with `NotClose`."""
    try:
        torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance, msg=lambda m: f"{what}: {m}")
    except AssertionError as error:
        raise NotClose(str(error)) from None


def reference(model, case: Case, inputs: list[torch.Tensor], row: int, output, batch_row: int):
    """The reference on example ``row``, taking near-tie ids from ``output``'s row ``batch_row``."""
    types = None if case.token_types is None else torch.tensor(case.token_types[row])
    return reference_forward(
        model, input_ids=None if case.embeds else inputs[row], inputs_embeds=inputs[row] if case.embeds else None,
        token_type_ids=types, prefix_length=case.prefixes[row] if case.give_prefix else None,
        model_ids=[ids[batch_row] for ids in output.cluster_assignments],
        slots_per_window=output.window_token_index.shape[2],
    )


def loss_of(outputs: list[dict[str, torch.Tensor]], targets: list[dict[str, int]]) -> torch.Tensor:
    """The QA training loss of every example's real outputs: the mean over examples of the start and end
    cross-entropies (and the answerability one), at drawn targets."""
    total = 0
    for found, target in zip(outputs, targets):
        for name in found:
            if name != "hidden":
                total = total + F.cross_entropy(found[name].unsqueeze(0), torch.tensor([target[name]]))
    return total / len(outputs)


@PROFILE
@given(case=cases())
@example(case=issue_22_case())
def test_model_equals_the_loop_reference(case):
    model = build_model(case)
    inputs = word_inputs(model, case)
    try:
        output, batched, references = check_reference(model, case, inputs, TOLERANCE)
    except NotClose:  # fp32 rounding of an ill-conditioned case, or a real difference: float64 tells them apart
        event("fp32 differs by more than 1e-5: checked in float64")
        output, batched, references = check_reference(model, case, inputs, ROUNDING)
        model64 = copy.deepcopy(model).double()
        inputs64 = [x.detach().double().requires_grad_() for x in inputs] if case.embeds else inputs
        check_reference(model64, case, inputs64, EXACT)
    describe(case, model.config, output, references)

    with torch.no_grad():
        more_rows, more_mask, more_types, more_starts = pad(case, inputs, case.extra_padding, garbage=case.weight_seed)
        more = run(model, case, more_rows, more_mask, more_types, case.prefixes)
        for row, tokens in enumerate(case.examples):
            check_variant(model, case, inputs, row, output, batched[row], more, row, more_starts[row], "more padded")
            alone_types = None if case.token_types is None else torch.tensor([case.token_types[row]])
            alone_mask = torch.ones(1, len(tokens), dtype=torch.long)
            alone = run(model, case, inputs[row].unsqueeze(0), alone_mask, alone_types, case.prefixes[row : row + 1])
            check_variant(model, case, inputs, row, output, batched[row], alone, 0, 0, "run alone")


def check_reference(model, case: Case, inputs: list[torch.Tensor], tolerance: float):
    """The batch's outputs and the gradients of the QA loss at drawn targets equal the reference's.

    Checked first (an AssertionError): finite outputs and gradients, the same routed slots and ids, zeros at padding,
    a gradient for every trainable parameter (and ``inputs_embeds``) but the word table when ``inputs_embeds`` replace
    it. Then (`NotClose`): outputs within ``tolerance``, gradients within ``tolerance`` of their largest entry where
    that exceeds 1 (a gradient sums over every token and window copy, and so does its rounding).

    Returns:
        the model's output, per example its detached real outputs (`example_outputs`), and the references.
    """
    rows, mask, types, starts = pad(case, inputs)
    output = run(model, case, rows, mask, types, case.prefixes)
    batched, references = [], []
    for row, tokens in enumerate(case.examples):
        batched.append(example_outputs(output, row, starts[row], len(tokens)))
        references.append(reference(model, case, inputs, row, output, row))
        assert all(torch.isfinite(value).all() for value in batched[row].values()), f"example {row}: NaN or inf"
        assert assignments(output, row) == references[row].ids, f"example {row}: other routed slots or ids"
    assert all(bool((h[~mask.bool()] == 0).all()) for h in output.hidden_states), "padding states are not zeros"

    expected = [reference_outputs(r) for r in references]
    generator = torch.Generator().manual_seed(case.weight_seed + 1)
    targets = [{name: int(torch.randint(0, len(value), (), generator=generator))
                for name, value in found.items() if name != "hidden"} for found in batched]
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if case.embeds:
        named += [(f"inputs_embeds[{row}]", x) for row, x in enumerate(inputs)]
    leaves = [p for _, p in named]
    ours = torch.autograd.grad(loss_of(batched, targets), leaves, allow_unused=True)
    theirs = torch.autograd.grad(loss_of(expected, targets), leaves, allow_unused=True)
    for (name, _), a, b in zip(named, ours, theirs):
        unused = case.embeds and name.endswith("word_embeddings.weight")
        assert (a is None) == unused and (b is None) == unused, f"{name}: gradient presence differs"
        assert a is None or torch.isfinite(a).all(), f"{name}: non-finite gradient"

    for row, found in enumerate(batched):
        for name, value in expected[row].items():
            assert_close(found[name], value, tolerance, f"example {row}, {name}, against the reference")
    for (name, _), a, b in zip(named, ours, theirs):
        if a is not None:
            scale = max(1.0, float(b.abs().max()))
            assert_close(a / scale, b / scale, tolerance, f"gradient of {name} (divided by {scale:.3g})")
    return output, [{name: value.detach() for name, value in found.items()} for found in batched], references


def check_variant(model, case: Case, inputs, row: int, batched, expected: dict, variant, variant_row: int, start: int,
                  what: str) -> None:
    """Example ``row`` in another batch (``variant``'s row ``variant_row``, real tokens from ``start``) gives the
    ``expected`` outputs it gave in ``batched``; where a near tie routed a state otherwise, the reference's with the
    variant's ids. Its padding states are zeros."""
    length = len(case.examples[row])
    found = example_outputs(variant, variant_row, start, length)
    assert all(torch.isfinite(value).all() for value in found.values()), f"example {row} {what}: NaN or inf"
    if assignments(variant, variant_row) != assignments(batched, row):
        expected = reference_outputs(reference(model, case, inputs, row, variant, variant_row))
    for name, value in expected.items():
        assert_close(found[name], value, TOLERANCE, f"example {row} {what}, {name}")
    padding = torch.ones(variant.start_logits.shape[1], dtype=torch.bool)
    padding[start : start + length] = False
    assert all(bool((h[variant_row, padding] == 0).all()) for h in variant.hidden_states), f"{what}: padding not zeros"


def describe(case: Case, config: ClusterFormerConfig, output, references) -> None:
    """Hypothesis events (``--hypothesis-show-statistics``) that show what the drawn cases cover."""
    size, stride = config.window_size, config.window_stride
    event("overlap: " + ("none" if size == stride else "two-way" if size <= 2 * stride else "three-way or more"))
    windows = output.window_token_index.shape[1]
    event("windows: " + ("1" if windows == 1 else "2-3" if windows <= 3 else "4+"))
    for kind in sorted(set(config.layer_kinds)):
        event(f"has a {kind} layer")
    if config.route_by == "keys" and set(config.layer_kinds) - {"sliding", "sparse"}:
        event("a routed layer routed by keys")
    if any(len(ids) > stride for r in references for ids in r.ids):
        event("a routed layer ran several chunks")
    if any(len(set(ids.values())) > 1 for r in references for ids in r.ids):
        event("a routed layer used several ids")
    if sum(r.ties for r in references):
        event("a near tie took the model's id")
    event(f"batch of {len(case.examples)}")


if FUZZ_SEED is not None:
    test_model_equals_the_loop_reference = seed(int(FUZZ_SEED))(test_model_equals_the_loop_reference)


@pytest.mark.parametrize("kinds", [["sliding", "sliding"], ["window_cluster", "sliding"]],
                         ids=["sliding", "window_cluster"])
def test_the_reference_is_roberta_within_one_window(kinds):
    """The reference's own anchor: with sliding layers only, or a window_cluster layer at its start (its routed
    projection zero, so its own attention equations give the window's RoBERTa attention), and a context within one
    window, it is transformers' RobertaForQuestionAnswering on the whole input; and its windows number
    ``1 + ceil(max(0, c - l) / m)``."""
    config = ClusterFormerConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        layer_kinds=kinds, window_size=12, window_stride=5, max_question_length=4, max_position_embeddings=24,
        num_clusters=4, route_by="keys", initializer_range=0.3, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(config).eval()
    fields = RobertaConfig().to_dict().keys()
    roberta = RobertaForQuestionAnswering(RobertaConfig(**{k: v for k, v in config.to_dict().items() if k in fields}))
    missing = roberta.load_state_dict(model.state_dict(), strict=False)
    assert not missing.missing_keys and all(".router." in k or ".routed_output." in k for k in missing.unexpected_keys)
    ids = torch.tensor([0, 7, 8, 2, 2, *range(10, 21), 2])  # a question of 2, a context of 11 + </s>
    with torch.no_grad():
        ours = reference_forward(model, input_ids=ids)
        theirs = roberta.eval()(ids.unsqueeze(0), output_hidden_states=True)
    for mine, expected in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        torch.testing.assert_close(mine, expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.start_logits, theirs.start_logits[0], atol=1e-5, rtol=1e-5)
    for size, stride in [(1, 1), (4, 4), (4, 3), (6, 2), (7, 3)]:
        for context in range(1, 30):
            expected = 1 + -(-max(0, context - size) // stride)
            assert len(Example(3 + context, 3, size, stride).windows) == expected
