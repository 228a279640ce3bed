"""The ``window_cluster`` layer kind: a window layer with a cluster layer's attention added through a projection that
starts at zero. At its start a model is the sliding-window model exactly (random weights, padded batches and a
converted RoBERTa checkpoint); once the projection moves, the routed path changes the outputs and trains, and
activation checkpointing (reentrant too) gives its plain gradients. tests/test_encoder_reference.py checks it against
the loop reference."""

import json

import pytest
import torch
from helpers import pad_batch, random_example, sentence_tokenizer, tiny_config, tiny_roberta
from transformers import RobertaForQuestionAnswering

from hf_clusterformer import CentroidUpdater, ClusterFormerConfig, ClusterFormerForQuestionAnswering
from hf_clusterformer.centroid_updates import CentroidUpdateSettings
from hf_clusterformer.configuration_clusterformer import PRETRAINED_ENCODER
from hf_clusterformer.conversion import convert_checkpoint, load_qa_model
from hf_clusterformer.modeling_clusterformer import WindowClusterLayer, check_trained, untrained_weights

WINDOW_CLUSTER = dict(num_hidden_layers=4, cluster_layers=[1, 3], global_layer_type="window_cluster", num_clusters=4)


def _batch(seed: int = 0):
    """Three examples of different lengths (padding in the batch), contexts of several windows."""
    generator = torch.Generator().manual_seed(seed)
    return pad_batch(
        [random_example(generator, 5, 70), random_example(generator, 3, 31), random_example(generator, 8, 9)]
    )


def _pair(route_by: str = "states"):
    """(sliding model, window_cluster model with the sliding model's weights), both in eval mode."""
    torch.manual_seed(0)
    sliding = ClusterFormerForQuestionAnswering(tiny_config(num_hidden_layers=4, cluster_layers=[])).eval()
    torch.manual_seed(1)
    model = ClusterFormerForQuestionAnswering(tiny_config(**WINDOW_CLUSTER, route_by=route_by)).eval()
    incompatible = model.load_state_dict(sliding.state_dict(), strict=False)
    assert not incompatible.unexpected_keys
    assert all(".router." in k or ".routed_output." in k for k in incompatible.missing_keys)
    return sliding, model


@pytest.mark.parametrize("route_by", ["states", "keys"])
def test_the_start_is_the_sliding_model_exactly(route_by):
    sliding, model = _pair(route_by)
    assert [type(layer) for layer in model.roberta.encoder.layer].count(WindowClusterLayer) == 2
    ids, mask = _batch()
    with torch.no_grad():
        expected = sliding(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        got = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_cluster_assignments=True)
    torch.testing.assert_close(got.start_logits, expected.start_logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.end_logits, expected.end_logits, rtol=0, atol=1e-6)
    for a, b in zip(got.hidden_states, expected.hidden_states):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert len(got.cluster_assignments) == 2  # the routed path ran (and routed every real slot)
    assert all((ids >= 0).any() for ids in got.cluster_assignments)


def test_an_open_routed_path_changes_outputs_and_trains():
    sliding, model = _pair()
    ids, mask = _batch(1)
    model.train()
    out = model(input_ids=ids, attention_mask=mask, start_positions=torch.tensor([9, 9, 9]),
                end_positions=torch.tensor([10, 10, 10]))
    out.loss.backward()
    routed = model.roberta.encoder.layer[1].routed_output
    assert routed.weight.grad.abs().sum() > 0  # the projection learns from the first step
    with torch.no_grad():
        routed.weight.normal_(std=0.5)
        model.eval()
        opened = model(input_ids=ids, attention_mask=mask)
        closed = sliding(input_ids=ids, attention_mask=mask)
    assert (opened.start_logits - closed.start_logits).abs().max() > 1e-3


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_activation_checkpointing_gives_the_plain_gradients(reentrant):
    """Recomputing the layers in backward gives the gradients of a plain backward, the routed path's included; also
    under reentrant checkpointing, which takes only a layer's positional tensors as its inputs (the routed context
    passed by keyword reached the graph twice: "Trying to backward through the graph a second time")."""
    ids, mask = _batch(4)
    labels = dict(start_positions=torch.tensor([9, 12, 7]), end_positions=torch.tensor([11, 12, 8]))
    grads = []
    for checkpointing in (False, True):
        _, model = _pair("keys")
        with torch.no_grad():
            for index in (1, 3):
                model.roberta.encoder.layer[index].routed_output.weight.normal_(std=0.5)
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model(input_ids=ids, attention_mask=mask, **labels).loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert grads[0]["roberta.encoder.layer.1.routed_output.weight"].abs().sum() > 0
    for name, grad in grads[0].items():
        assert (grad is None) == (grads[1][name] is None), name
        if grad is not None:
            # msg is called (if at all) within this iteration, so name is the current one.
            torch.testing.assert_close(
                grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=lambda m: f"{name}: {m}"  # noqa: B023
            )


def test_an_example_alone_equals_it_in_a_padded_batch():
    _, model = _pair()
    with torch.no_grad():
        model.roberta.encoder.layer[1].routed_output.weight.normal_(std=0.5)
        model.roberta.encoder.layer[3].routed_output.weight.normal_(std=0.5)
        ids, mask = _batch(2)
        batched = model(input_ids=ids, attention_mask=mask)
        for row in range(ids.shape[0]):
            n = int(mask[row].sum())
            alone = model(input_ids=ids[row: row + 1, :n], attention_mask=mask[row: row + 1, :n])
            torch.testing.assert_close(batched.start_logits[row, :n], alone.start_logits[0], rtol=1e-5, atol=1e-5)


def test_centroid_updates_fit_the_routed_layers_on_what_they_route_by():
    for route_by in ("states", "keys"):
        _, model = _pair(route_by)
        model.train()
        settings = CentroidUpdateSettings.build(update_every_steps=1, memory_size=512, min_states=8, backend="torch")
        updater = CentroidUpdater(model, settings)
        assert sorted(updater.routers) == [1, 3]
        ids, mask = _batch(3)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
        stats = updater.update()
        assert stats is not None and set(stats) == {1, 3}
        layer = model.roberta.encoder.layer[1]
        assert bool(layer.router.fitted)
        updater.close()


def test_a_converted_checkpoint_starts_as_its_sliding_reader(tmp_path):
    tokenizer = sentence_tokenizer()
    source = tiny_roberta(tmp_path / "roberta", tokenizer, head=RobertaForQuestionAnswering)
    options = dict(window_size=32, window_stride=24, max_question_length=16, num_clusters=4, seed=0)
    convert_checkpoint(source, tmp_path / "sliding", cluster_layers=[], **options)
    convert_checkpoint(source, tmp_path / "window", cluster_layers=[1], global_layer_type="window_cluster", **options)
    sliding = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path / "sliding").eval()
    model = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path / "window").eval()
    assert model.config.layer_kinds == ["sliding", "window_cluster"]
    assert untrained_weights(model) == []  # the zero projection is the model's start, not a weight to refuse
    check_trained(model)
    text = tokenizer("Where does Melka live?", " ".join(["Melka lives in Tarsk, a town known for its bridge."] * 9),
                     return_tensors="pt")
    with torch.no_grad():
        expected = sliding(**text)
        got = model(**text)
    torch.testing.assert_close(got.start_logits, expected.start_logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.end_logits, expected.end_logits, rtol=0, atol=1e-6)


def test_a_pretrained_encoder_gets_window_cluster_layers_unless_kinds_are_named(tmp_path):
    """A model built from a config keeps the paper's replacing layer; a RoBERTa checkpoint loaded (any override of
    the depth or the placement too) or converted gets window_cluster layers, and never stores how it got them."""
    assert ClusterFormerConfig(num_hidden_layers=6).layer_kinds == ["sliding"] * 4 + ["cluster"] * 2
    tokenizer = sentence_tokenizer()
    source = tiny_roberta(tmp_path / "roberta", tokenizer, head=RobertaForQuestionAnswering, num_hidden_layers=6)
    loaded = {
        "default": ClusterFormerConfig.from_pretrained(source),
        "depth": ClusterFormerConfig.from_pretrained(source, num_hidden_layers=4),
        "placement": ClusterFormerConfig.from_pretrained(source, cluster_layers=[1]),
        "named": ClusterFormerConfig.from_pretrained(source, global_layer_type="cluster"),
        "kinds": ClusterFormerConfig.from_pretrained(source, layer_kinds=["sliding"] * 5 + ["lsh"]),
    }
    assert {name: config.layer_kinds for name, config in loaded.items()} == {
        "default": ["sliding"] * 4 + ["window_cluster"] * 2,
        "depth": ["sliding"] * 3 + ["window_cluster"],
        "placement": ["sliding", "window_cluster"] + ["sliding"] * 4,
        "named": ["sliding"] * 4 + ["cluster"] * 2,
        "kinds": ["sliding"] * 5 + ["lsh"],
    }
    options = dict(window_size=32, window_stride=24, max_question_length=16, num_clusters=4)
    model = load_qa_model(source, **options)
    assert model.config.layer_kinds == ["sliding"] * 4 + ["window_cluster"] * 2
    # Row: load_qa_model (train, evaluate) recorded the zero-started routed projections as an untrained QA head
    assert untrained_weights(model) == []
    check_trained(model)
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text(encoding="utf-8"))
    assert PRETRAINED_ENCODER not in saved and saved["layer_kinds"] == model.config.layer_kinds
    # a Cluster-Former checkpoint keeps its own kinds; a new placement over it takes its kind
    again = ClusterFormerConfig.from_pretrained(tmp_path / "saved", cluster_layers=[2])
    assert again.layer_kinds == ["sliding", "sliding", "window_cluster"] + ["sliding"] * 3
    converted = convert_checkpoint(source, tmp_path / "converted", cluster_layers=[3], **options)
    assert converted.config.layer_kinds == ["sliding"] * 3 + ["window_cluster"] + ["sliding"] * 2
    paper = convert_checkpoint(source, tmp_path / "paper", cluster_layers=[3], global_layer_type="cluster", **options)
    assert paper.config.layer_kinds == ["sliding"] * 3 + ["cluster"] + ["sliding"] * 2


def test_chunk_question_prefix_is_refused_for_window_cluster_layers():
    with pytest.raises(ValueError, match="chunk_question_prefix applies to cluster and lsh layers"):
        tiny_config(**WINDOW_CLUSTER, chunk_question_prefix=True)


def test_unfitted_centroids_are_said_only_once_the_routed_path_is_open(caplog, tmp_path):
    """Row: ``predict`` on a converted RoBERTa checkpoint warned that its centroids were never fitted, although its
    window_cluster layers' routed path is still closed, so the routing changes nothing."""
    import logging

    from hf_clusterformer.export import centroids_fitted

    _, model = _pair()
    ids, mask = _batch()
    with caplog.at_level(logging.WARNING):
        model(input_ids=ids, attention_mask=mask)
    assert "never fitted" not in caplog.text and centroids_fitted(model) == {}
    router = model.roberta.encoder.layer[3].router
    assert router._seen_closed  # the closed path is remembered: later forwards read nothing back from the device
    state = model.state_dict()
    key = "roberta.encoder.layer.3.routed_output.bias"
    state[key] = torch.full_like(state[key], 0.1)
    model.load_state_dict(state)  # weights that open the path: checked again
    assert not router._seen_closed
    with caplog.at_level(logging.WARNING):
        model(input_ids=ids, attention_mask=mask)
        model(input_ids=ids, attention_mask=mask)
    assert [r.message for r in caplog.records if "never fitted" in r.message] == [
        "Cluster layer 3 runs with centroids that were never fitted by K-Means; train with "
        "hf_clusterformer.CentroidUpdateCallback (or CentroidUpdater) first."]
    assert centroids_fitted(model) == {"3": False}
    model.train()
    assert not router._seen_closed  # training may open the path too
