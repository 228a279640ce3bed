"""ClusterFormerModel / ClusterFormerForQuestionAnswering against RoBERTa, batch invariance, gradients, bad input."""

import logging
import re

import pytest
import torch
from helpers import open_routed_paths, pad_batch, pair_encoding, random_example, tiny_config
from huggingface_hub.errors import StrictDataclassError
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    RobertaConfig,
    RobertaForQuestionAnswering,
    RobertaModel,
)

import hf_clusterformer  # noqa: F401  (registers the Auto classes)
from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering, ClusterFormerModel
from hf_clusterformer.configuration_clusterformer import default_cluster_layers

ALL_KINDS = dict(num_hidden_layers=5, cluster_layers=[1, 2, 3, 4],
                 global_layer_type=["cluster", "lsh", "sparse", "window_cluster"])


def roberta_twin(config: ClusterFormerConfig) -> RobertaConfig:
    fields = RobertaConfig().to_dict().keys()
    return RobertaConfig(**{k: v for k, v in config.to_dict().items() if k in fields})


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_single_window_equals_roberta(implementation):
    config = tiny_config(cluster_layers=[])
    config._attn_implementation = implementation
    torch.manual_seed(0)
    ours = ClusterFormerModel(config).eval()
    twin = roberta_twin(config)
    twin._attn_implementation = implementation
    roberta = RobertaModel(twin).eval()
    roberta.load_state_dict({k: v for k, v in ours.state_dict().items()}, strict=True)
    generator = torch.Generator().manual_seed(1)
    ids, mask = pad_batch([random_example(generator, 4, 10), random_example(generator, 6, 15)])
    with torch.no_grad():
        a = ours(ids, attention_mask=mask)
        b = roberta(ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)


def test_non_overlapping_windows_equal_roberta_on_each_window_alone():
    """With l = m every context token lies in exactly one window: it equals RoBERTa run on that window alone."""
    config = tiny_config(cluster_layers=[], window_size=12, window_stride=12)
    torch.manual_seed(0)
    ours = ClusterFormerModel(config).eval()
    roberta = RobertaModel(roberta_twin(config)).eval()
    roberta.load_state_dict(ours.state_dict())
    generator = torch.Generator().manual_seed(2)
    question = torch.randint(4, 100, (5,), generator=generator).tolist()
    context = torch.randint(4, 100, (40,), generator=generator).tolist()
    ids = torch.tensor([pair_encoding(question, context)])
    prefix = len(question) + 3
    with torch.no_grad():
        out = ours(ids).last_hidden_state[0]
        for start in range(0, len(context) + 1, 12):
            window = (ids[0, :prefix].tolist() + ids[0, prefix + start : prefix + start + 12].tolist())
            alone = roberta(torch.tensor([window])).last_hidden_state[0, prefix:]
            torch.testing.assert_close(out[prefix + start : prefix + start + alone.shape[0]], alone, atol=1e-5, rtol=0)


def test_one_layer_overlap_takes_the_mean_of_covering_windows():
    config = tiny_config(cluster_layers=[], num_hidden_layers=1)
    torch.manual_seed(0)
    ours = ClusterFormerModel(config).eval()
    roberta = RobertaModel(roberta_twin(config)).eval()
    roberta.load_state_dict(ours.state_dict())
    generator = torch.Generator().manual_seed(3)
    ids = torch.tensor([random_example(generator, 3, 30)])  # context of 31 tokens: windows at 0, 12, 24
    prefix = 6
    with torch.no_grad():
        out = ours(ids).last_hidden_state[0]
        runs = [roberta(torch.cat([ids[:, :prefix], ids[:, prefix + s : prefix + s + 16]], 1)).last_hidden_state[0]
                for s in (0, 12, 24)]
    torch.testing.assert_close(out[prefix + 5], runs[0][prefix + 5], atol=1e-5, rtol=0)  # window 0 only
    torch.testing.assert_close(out[prefix + 13], (runs[0][prefix + 13] + runs[1][prefix + 1]) / 2, atol=1e-5, rtol=0)
    torch.testing.assert_close(out[prefix + 30], runs[2][prefix + 6], atol=1e-5, rtol=0)
    question = torch.stack([r[:prefix] for r in runs]).mean(0)
    torch.testing.assert_close(out[:prefix], question, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kinds", [dict(cluster_layers=[2]), ALL_KINDS], ids=["cluster", "all-kinds"])
def test_batch_invariance_and_pads_never_matter(kinds):
    config = tiny_config(**kinds)
    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(config).eval()
    open_routed_paths(model)
    generator = torch.Generator().manual_seed(4)
    examples = [random_example(generator, q, c) for q, c in [(3, 70), (7, 9), (5, 33), (2, 1)]]
    ids, mask = pad_batch(examples)
    noisy = ids.clone()
    noisy[~mask.bool()] = torch.randint(4, 100, (int((~mask.bool()).sum()),), generator=generator)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask)
        with_noise = model(noisy, attention_mask=mask)
        for row, example in enumerate(examples):
            alone = model(torch.tensor([example]))
            n = len(example)
            torch.testing.assert_close(batched.start_logits[row, :n], alone.start_logits[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(batched.end_logits[row, :n], alone.end_logits[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(with_noise.start_logits, batched.start_logits, atol=0, rtol=0)


def test_cluster_layer_mixes_far_apart_tokens_and_sliding_does_not():
    """Changing one token moves outputs more than a window away only when a cluster layer connects them."""
    generator = torch.Generator().manual_seed(5)
    example = random_example(generator, 3, 200)
    changed = list(example)
    changed[-5] = 4 if changed[-5] != 4 else 5
    far = slice(6, len(example) - 5 - 2 * 16)  # tokens no window shares with the changed one
    moved = {}
    for name, kinds in {"sliding": dict(cluster_layers=[]), "cluster": dict(cluster_layers=[1])}.items():
        torch.manual_seed(0)
        model = ClusterFormerModel(tiny_config(num_hidden_layers=2, **kinds)).eval()
        with torch.no_grad():
            before, after = (model(torch.tensor([e])).last_hidden_state[0, far] for e in (example, changed))
        moved[name] = (before - after).abs().amax(-1)
    assert torch.all(moved["sliding"] == 0)
    assert torch.any(moved["cluster"] > 1e-4)


def test_gradients_reach_every_parameter_and_checkpointing_matches():
    config = tiny_config(**ALL_KINDS, use_answerability_head=True)
    generator = torch.Generator().manual_seed(6)
    ids, mask = pad_batch([random_example(generator, 4, 50), random_example(generator, 3, 20)])
    labels = dict(start_positions=torch.tensor([10, 8]), end_positions=torch.tensor([12, 9]),
                  answerable_labels=torch.tensor([1, 0]))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = ClusterFormerForQuestionAnswering(config).train()
        open_routed_paths(model)
        if checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        model(ids, attention_mask=mask, **labels).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    missing = [n for n, g in grads[0].items() if g is None or not torch.any(g != 0)]
    # RoBERTa's token-type row 0 is used; everything else must learn
    assert missing == [], missing
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5)


def test_answerability_head_and_outputs():
    config = tiny_config(use_answerability_head=True)
    config._attn_implementation = "eager"
    model = ClusterFormerForQuestionAnswering(config).eval()
    generator = torch.Generator().manual_seed(7)
    ids, mask = pad_batch([random_example(generator, 4, 40), random_example(generator, 2, 10)])
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True,
                    output_cluster_assignments=True)
    assert out.start_logits.shape == out.end_logits.shape == ids.shape
    assert out.answerable_logits.shape == (2, 2)
    assert len(out.hidden_states) == config.num_hidden_layers + 1
    assert all(h.shape == (*ids.shape, 32) for h in out.hidden_states)
    assert len(out.attentions) == 3 and out.attentions[0].shape[1] == config.num_attention_heads
    (assignment,) = out.cluster_assignments
    tokens = out.window_token_index.view(2, -1)
    # each context token appears once among the clustered slots; padding never does
    for row, n in enumerate(mask.sum(1).tolist()):
        clustered = tokens[row][assignment[row] >= 0]
        context = clustered[clustered >= 8 if row == 0 else clustered >= 5]
        assert sorted(set(context.tolist())) == sorted(context.tolist())
        assert clustered.max().item() < n
    loss = model(ids, attention_mask=mask, answerable_labels=torch.tensor([1, 0])).loss
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_output_attentions_under_sdpa_warns_and_gives_none(caplog):
    torch.manual_seed(0)
    model = ClusterFormerModel(tiny_config()).eval()
    ids = torch.tensor([pair_encoding([5], list(range(10, 40)))])
    with torch.no_grad(), caplog.at_level("WARNING"):
        out = model(ids, output_attentions=True)
        plain = model(ids)
    assert "attn_implementation='eager'" in caplog.text
    assert out.attentions == (None, None, None)
    assert torch.equal(out.last_hidden_state, plain.last_hidden_state)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(ids, output_attentions=True)
    # 3 windows of 4 + 16 slots; the cluster layer runs 4 chunks of 12 (43 representative slots), not all 5
    assert [tuple(a.shape) for a in eager.attentions] == [(3, 2, 20, 20), (3, 2, 20, 20), (4, 2, 12, 12)]


def test_centroids_initialised_ordered_and_warned_once(caplog):
    model = ClusterFormerModel(tiny_config(cluster_layers=[1, 2])).eval()
    routers = model.cluster_routers()
    assert sorted(routers) == [1, 2]
    for router in routers.values():
        c = router.centroids
        assert c.dtype == torch.float32 and not bool(router.fitted)
        torch.testing.assert_close(c.norm(dim=-1), torch.ones(8))
        sim = c @ c.T
        for i in range(1, 8):  # each next centroid is the nearest unused one
            assert sim[i - 1, i] == sim[i - 1, i:].max()
    assert not torch.equal(routers[1].centroids, routers[2].centroids)
    again = ClusterFormerModel(tiny_config(cluster_layers=[1, 2]))
    assert torch.equal(again.cluster_routers()[1].centroids, routers[1].centroids)
    ids = torch.tensor([pair_encoding([5], [6, 7, 8])])
    with caplog.at_level(logging.WARNING):
        model(ids)
        model(ids)
    assert sum("never fitted" in r.message for r in caplog.records) == 2  # once per cluster layer


def test_fitted_flag_is_read_back_until_settled_and_again_after_loading(caplog):
    """Eval forwards stop reading ``fitted`` from the device once it was found set; loading buffers resets that."""
    model = ClusterFormerModel(tiny_config()).eval()
    router = model.cluster_routers()[2]
    router.fitted.fill_(True)
    ids = torch.tensor([pair_encoding([5], [6, 7, 8])])
    with caplog.at_level(logging.WARNING):
        model(ids)
    assert router._seen_fitted and "never fitted" not in caplog.text
    state = model.state_dict()
    state["encoder.routers.2.fitted"] = torch.tensor(False)
    model.load_state_dict(state)
    assert not router._seen_fitted
    with caplog.at_level(logging.WARNING):
        model(ids)
    assert "never fitted" in caplog.text


def test_cosine_assignment_is_fp32_under_autocast():
    model = ClusterFormerModel(tiny_config()).eval()
    router = model.cluster_routers()[2]
    states = torch.randn(2, 400, 32)
    representative = torch.ones(2, 400, dtype=torch.bool)
    reference = router(states, representative)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(router(states, representative), reference)


def test_bf16_forward_and_backward():
    model = ClusterFormerForQuestionAnswering(tiny_config(**ALL_KINDS)).to(torch.bfloat16).train()
    generator = torch.Generator().manual_seed(8)
    ids, mask = pad_batch([random_example(generator, 3, 60), random_example(generator, 3, 30)])
    out = model(ids, attention_mask=mask, start_positions=torch.tensor([9, 7]), end_positions=torch.tensor([9, 8]))
    out.loss.backward()
    assert out.start_logits.dtype == torch.bfloat16 and torch.isfinite(out.loss.float())
    assert model.cluster_routers()[1].centroids.dtype == torch.float32


def test_roberta_checkpoints_load_one_to_one(tmp_path):
    config = tiny_config()
    roberta_qa = RobertaForQuestionAnswering(roberta_twin(config))
    roberta_qa.save_pretrained(tmp_path / "qa")
    model, info = ClusterFormerForQuestionAnswering.from_pretrained(
        tmp_path / "qa", cluster_layers=[2], num_clusters=8, window_size=16, window_stride=12, max_question_length=8,
        output_loading_info=True,
    )
    assert info["unexpected_keys"] == set() or not info["unexpected_keys"]
    # a RoBERTa checkpoint's global layer is window_cluster by default: its routed projection starts at zero
    added = ("router.centroids", "router.fitted", "routed_output.weight", "routed_output.bias")
    assert set(info["missing_keys"]) == {f"roberta.encoder.layer.2.{name}" for name in added}
    routed = model.roberta.encoder.layer[2].routed_output
    assert not routed.weight.any() and not routed.bias.any()
    assert torch.equal(model.qa_outputs.weight, roberta_qa.qa_outputs.weight)
    assert torch.equal(
        model.roberta.encoder.layer[1].attention.self.query.weight,
        roberta_qa.roberta.encoder.layer[1].attention.self.query.weight,
    )
    # centroids of a RoBERTa checkpoint come from the seeded initialisation, not uninitialised memory
    torch.testing.assert_close(model.cluster_routers()[2].centroids.norm(dim=-1), torch.ones(8))
    assert not bool(model.cluster_routers()[2].fitted)

    RobertaModel(roberta_twin(config)).save_pretrained(tmp_path / "base")
    base, info = ClusterFormerModel.from_pretrained(
        tmp_path / "base", cluster_layers=[2], num_clusters=8, window_size=16, window_stride=12, max_question_length=8,
        output_loading_info=True,
    )
    assert not info["unexpected_keys"]
    assert set(info["missing_keys"]) == {f"encoder.layer.2.{name}" for name in added}


def test_auto_classes_round_trip_with_fitted_centroids(tmp_path):
    model = ClusterFormerForQuestionAnswering(tiny_config(**ALL_KINDS)).eval()
    router = model.cluster_routers()[1]
    router.centroids.copy_(torch.nn.functional.normalize(torch.randn(8, 32), dim=-1))
    router.fitted.fill_(True)
    routed = model.roberta.encoder.layer[4].routed_output  # the window_cluster layer's, away from its zero start
    with torch.no_grad():
        routed.weight.normal_(std=0.5)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    assert AutoConfig.from_pretrained(tmp_path).model_type == "clusterformer"
    loaded = AutoModelForQuestionAnswering.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, ClusterFormerForQuestionAnswering)
    assert loaded.config.layer_kinds == ["sliding", "cluster", "lsh", "sparse", "window_cluster"]
    assert torch.equal(loaded.cluster_routers()[1].centroids, router.centroids)
    assert bool(loaded.cluster_routers()[1].fitted)
    assert torch.equal(
        loaded.roberta.encoder.routers["2"].hash_vectors, model.roberta.encoder.routers["2"].hash_vectors
    )
    assert torch.equal(loaded.roberta.encoder.layer[4].routed_output.weight, routed.weight)
    ids = torch.tensor([random_example(torch.Generator().manual_seed(9), 4, 80)])
    with torch.no_grad():
        assert torch.equal(loaded(ids).start_logits, model(ids).start_logits)
    assert isinstance(AutoModel.from_pretrained(tmp_path), ClusterFormerModel)
    # dtype on load keeps the centroids in fp32
    half = AutoModelForQuestionAnswering.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert half.cluster_routers()[1].centroids.dtype == torch.float32
    assert half.qa_outputs.weight.dtype == torch.bfloat16


def test_centroid_shape_mismatch_on_load_is_a_clear_error(tmp_path):
    ClusterFormerForQuestionAnswering(tiny_config()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_clusters"):
        ClusterFormerForQuestionAnswering.from_pretrained(tmp_path, num_clusters=16)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: dict(input_ids=torch.tensor([[0, 5, 6, 7, 8]])), "no separator.*, or pass question_lengths\\.$"),
        (lambda: dict(input_ids=torch.tensor([pair_encoding(list(range(10, 20)), [5, 6])])), "max_question_length"),
        (lambda: dict(input_ids=torch.tensor([pair_encoding([5], [])])), "empty context"),
        (
            lambda: dict(input_ids=torch.tensor([pair_encoding([5], [6])]), attention_mask=torch.ones(1, 3)),
            "attention_mask has shape",
        ),
        (
            lambda: dict(input_ids=torch.tensor([pair_encoding([5], [6, 7])]),
                         attention_mask=torch.tensor([[1, 1, 1, 0, 1, 1, 1]])),
            "right-padded",
        ),
        (lambda: dict(input_ids=torch.tensor([pair_encoding([5], [6] * 5000)])), "max_context_length"),
    ],
    ids=["no-separator", "long-question", "empty-context", "mask-shape", "left-padding", "long-context"],
)
def test_bad_input_is_a_clear_value_error(build, message):
    model = ClusterFormerForQuestionAnswering(tiny_config()).eval()
    with pytest.raises(ValueError, match=message):
        model(**build())


def test_explicit_question_lengths_match_separator_rule():
    model = ClusterFormerModel(tiny_config()).eval()
    ids, mask = pad_batch([pair_encoding([5, 6], list(range(10, 60))), pair_encoding([7], list(range(10, 30)))])
    with torch.no_grad():
        a = model(ids, attention_mask=mask).last_hidden_state
        b = model(ids, attention_mask=mask, question_lengths=torch.tensor([5, 4])).last_hidden_state
    assert torch.equal(a, b)
    # Row: question_lengths -1 was an IndexError deep in the forward; one past the row said "holds one text"
    for lengths, row, given, real in (([-1, 4], 0, -1, 56), ([5, 30], 1, 30, 25), ([5, 0], 1, 0, 25)):
        with pytest.raises(ValueError, match=rf"^question_lengths\[{row}\] is {given}, but a question prefix \(<s> "
                                             rf"Q </s></s>: the question's tokens \+ 3\) takes at least 1 and fewer "
                                             rf"than the row's {real} tokens;"):
            model(ids, attention_mask=mask, question_lengths=torch.tensor(lengths))


def test_config_defaults_and_validation():
    assert ClusterFormerConfig(num_hidden_layers=24).global_layers == [15, 20]
    assert default_cluster_layers(12) == [8, 10]
    assert default_cluster_layers(1) == []
    assert ClusterFormerConfig(num_hidden_layers=24, cluster_layers=[3]).global_layers == [3]
    config = ClusterFormerConfig()
    assert (config.window_size, config.window_stride, config.num_clusters) == (256, 224, 64)
    for bad, field in [
        (dict(window_stride=0), "window_stride"),
        (dict(window_stride=300), "window_stride"),
        (dict(cluster_layers=[12]), "cluster_layers"),
        (dict(global_layer_type="dense"), "global_layer_type"),
        (dict(num_clusters=0), "num_clusters"),
        (dict(max_context_length=0), "max_context_length"),
    ]:
        with pytest.raises(ValueError, match=field):
            ClusterFormerConfig(**bad)
    with pytest.raises(StrictDataclassError, match="num_clusters"):  # types are @strict's
        ClusterFormerConfig(num_clusters="many")
    with pytest.raises(ValueError, match="max_question_length") as raised:
        ClusterFormerModel(ClusterFormerConfig(max_question_length=400))
    # Row: the message's terms (400 + 3 + 256) did not add up to the positions it named (661): RoBERTa's 2 skipped rows
    terms = re.match(r"max_question_length \((\d+)\) \+ (\d+) special tokens \+ window_size \((\d+)\) \+ (\d+) rows "
                     r"before the first position .* needs (\d+) position embeddings", str(raised.value))
    assert terms and sum(map(int, terms.groups()[:4])) == int(terms[5]) == 661


def test_windows_without_overlap_after_a_cluster_layer_run_a_batch_of_two():
    """Regression: with l == m the unsorted states of a padded batch were a non-contiguous slice (view error)."""
    import random

    config = ClusterFormerConfig(
        vocab_size=300, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
        window_size=64, window_stride=64, cluster_layers=[2], num_clusters=16, max_position_embeddings=89,
        max_question_length=20, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    )
    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(config).eval()
    rng = random.Random(0)
    seqs = [
        [0] + [rng.randrange(3, 300) for _ in range(5)] + [2, 2]
        + [rng.randrange(3, 300) for _ in range(300 - 10 * i)] + [2]
        for i in range(2)
    ]
    ids = torch.full((2, 309), 1)
    mask = torch.zeros(2, 309, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.no_grad():
        batched = model(ids, attention_mask=mask)
        for row, seq in enumerate(seqs):
            alone = model(torch.tensor([seq]))
            torch.testing.assert_close(batched.start_logits[row, : len(seq)], alone.start_logits[0], atol=1e-5, rtol=0)
