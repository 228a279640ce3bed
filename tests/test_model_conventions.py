"""transformers conventions: meta-device init, fp32 routers under low precision, inputs_embeds, feed-forward
chunking, padding on either side, ``layer_types``, the input contract and the routed layers' chunk count."""

from __future__ import annotations

import json
import re

import pytest
import torch
from helpers import BOS, PAD, SEP, pad_batch, random_example, tiny_config
from huggingface_hub.errors import StrictDataclassError
from transformers import PretrainedConfig

from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering, ClusterFormerModel
from hf_clusterformer.configuration_clusterformer import required_position_embeddings
from hf_clusterformer.modeling_clusterformer import (
    ClusterRouter,
    LSHRouter,
    check_input_lengths,
    locate_question_prefix,
    sort_into_chunks,
    unsort_from_chunks,
)

ALL_TYPES = dict(num_hidden_layers=4, cluster_layers=None, layer_types=["sliding", "cluster", "lsh", "sparse"])


def _batch(seed: int = 3):
    generator = torch.Generator().manual_seed(seed)
    return pad_batch([random_example(generator, q, c) for q, c in [(3, 70), (7, 9), (5, 33)]])


def test_meta_device_init_then_init_weights_gives_the_init_buffers():
    config = tiny_config(**ALL_TYPES)
    direct = ClusterFormerForQuestionAnswering(config)
    with torch.device("meta"):
        model = ClusterFormerForQuestionAnswering(config)
    model.to_empty(device="cpu")
    model.init_weights()
    direct_buffers = dict(direct.named_buffers())
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, direct_buffers[name]), name
    # __init__ itself draws the seeded vectors that _init_weights writes
    router = ClusterRouter(config, 1)
    assert torch.equal(router.centroids, router.initial_centroids())
    lsh = LSHRouter(config, 2)
    assert torch.equal(lsh.hash_vectors, lsh.initial_hash_vectors())
    ids, mask = _batch()
    with torch.no_grad():
        assert torch.isfinite(model.eval()(ids, attention_mask=mask).start_logits).all()


def test_router_buffers_stay_fp32_and_exact_in_low_precision(tmp_path):
    model = ClusterFormerForQuestionAnswering(tiny_config(**ALL_TYPES))
    model.save_pretrained(tmp_path)
    for dtype in (torch.bfloat16, torch.float16):
        loaded = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path, dtype=dtype)
        routers = loaded.roberta.encoder.routers
        assert torch.equal(routers["1"].centroids, model.roberta.encoder.routers["1"].centroids)
        assert torch.equal(routers["2"].hash_vectors, model.roberta.encoder.routers["2"].hash_vectors)
        assert loaded.qa_outputs.weight.dtype == dtype
    names = model.state_dict().keys()
    assert all(any(module in name for name in names) for module in model._keep_in_fp32_modules_strict)
    sparse_only = ClusterFormerForQuestionAnswering(tiny_config(global_layer_type="sparse"))
    assert not sparse_only._keep_in_fp32_modules_strict  # no routers to name


def test_inputs_embeds_match_input_ids():
    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(tiny_config(**ALL_TYPES)).eval()
    ids, mask = _batch()
    embeds = model.get_input_embeddings()(ids)
    with torch.no_grad():
        from_ids = model(ids, attention_mask=mask)
        from_embeds = model(inputs_embeds=embeds, attention_mask=mask)
        prefix = torch.tensor([6, 10, 8])
        # without separator rows, the question prefix comes from question_lengths
        shifted = embeds + 1e-3
        with pytest.raises(ValueError, match="question_lengths"):
            model(inputs_embeds=shifted, attention_mask=mask)
        given = model(inputs_embeds=shifted, attention_mask=mask, question_lengths=prefix)
    real = mask.bool()
    torch.testing.assert_close(from_embeds.start_logits[real], from_ids.start_logits[real], atol=1e-6, rtol=0)
    torch.testing.assert_close(from_embeds.end_logits[real], from_ids.end_logits[real], atol=1e-6, rtol=0)
    torch.testing.assert_close(given.start_logits[real], from_ids.start_logits[real], atol=1e-2, rtol=0)
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model(ids, inputs_embeds=embeds)


def test_feed_forward_chunking_changes_memory_not_outputs():
    torch.manual_seed(0)
    plain = ClusterFormerModel(tiny_config(**ALL_TYPES)).eval()
    chunked = ClusterFormerModel(tiny_config(**ALL_TYPES, chunk_size_feed_forward=4)).eval()
    chunked.load_state_dict(plain.state_dict())
    ids, mask = _batch()

    def widest_intermediate(model) -> tuple[torch.Tensor, int]:
        sizes = []
        layers = model.encoder.layer[:2]  # a sliding layer (26 slots per window) and a cluster layer (12 per chunk)
        hooks = [layer.intermediate.register_forward_hook(lambda m, i, o: sizes.append(o.numel())) for layer in layers]
        with torch.no_grad():
            out = model(ids, attention_mask=mask).last_hidden_state
        for hook in hooks:
            hook.remove()
        return out, max(sizes)

    out_plain, widest_plain = widest_intermediate(plain)
    out_chunked, widest_chunked = widest_intermediate(chunked)
    torch.testing.assert_close(out_chunked, out_plain, atol=1e-6, rtol=0)
    assert widest_chunked * 3 <= widest_plain  # 4-slot pieces of the (slots x 4d) feed-forward activations


def test_left_padding_gives_the_right_padded_outputs():
    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(tiny_config(**ALL_TYPES)).eval()
    ids, mask = _batch()
    lengths = mask.sum(1)
    left_ids, left_mask = torch.full_like(ids, PAD), torch.zeros_like(mask)
    for row, n in enumerate(lengths.tolist()):  # building the test batch, not the model
        left_ids[row, ids.shape[1] - n :], left_mask[row, ids.shape[1] - n :] = ids[row, :n], 1
    with torch.no_grad():
        right = model(ids, attention_mask=mask)
        left = model(left_ids, attention_mask=left_mask)
    assert torch.equal(left.start_logits[left_mask.bool()], right.start_logits[mask.bool()])
    assert torch.equal(left.end_logits[left_mask.bool()], right.end_logits[mask.bool()])
    holes = mask.clone()
    holes[0, 2] = 0
    with pytest.raises(ValueError, match="attention_mask row 0 mixes padding"):
        model(ids, attention_mask=holes)


def test_layer_kinds_is_the_one_stored_list_and_the_shortcuts_are_constructor_arguments(tmp_path):
    config = ClusterFormerConfig(num_hidden_layers=4, cluster_layers=[3, 1], global_layer_type=["lsh", "cluster"])
    assert config.layer_kinds == ["sliding", "cluster", "sliding", "lsh"]  # Row: paired with the indices as given
    assert not hasattr(config, "cluster_layers") and not hasattr(config, "global_layer_type")
    config = ClusterFormerConfig(num_hidden_layers=4, layer_types=["sliding", "sparse", "sliding", "sparse"])
    assert (config.layer_kinds, config.global_layers) == (["sliding", "sparse", "sliding", "sparse"], [1, 3])
    with pytest.raises(AttributeError, match="set config.layer_kinds"):
        config.cluster_layers = [2]
    config.layer_kinds = ["sliding", "cluster", "lsh", "sparse"]
    assert config.global_layers == [1, 2, 3]
    with pytest.raises(ValueError, match="disagree with layer_kinds"):
        ClusterFormerConfig(num_hidden_layers=3, cluster_layers=[1], layer_kinds=["sliding", "sliding", "lsh"])
    with pytest.raises(StrictDataclassError, match="layer_kinds"):  # typed by @strict, a kind of `LayerKind`
        ClusterFormerConfig(num_hidden_layers=2, layer_kinds=["sliding", "dense"])
    with pytest.raises(ValueError, match="one per layer"):
        ClusterFormerConfig(num_hidden_layers=3, layer_kinds=["sliding", "cluster"])

    # config.json holds the one list, not the shortcuts; transformers' generic config loading accepts it
    model = ClusterFormerForQuestionAnswering(tiny_config(**ALL_TYPES))
    model.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    assert saved["layer_kinds"] == ["sliding", "cluster", "lsh", "sparse"]
    assert not {"layer_types", "cluster_layers", "global_layer_type"} & set(saved)
    PretrainedConfig.from_json_file(path)
    loaded = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path)
    assert loaded.config.layer_kinds == ["sliding", "cluster", "lsh", "sparse"]
    # from_pretrained overrides go through the shortcuts; what they leave out keeps its stored value
    overridden = ClusterFormerForQuestionAnswering.from_pretrained(
        tmp_path, global_layer_type=["lsh", "lsh"], cluster_layers=[1, 3]
    )
    assert overridden.config.layer_kinds == ["sliding", "lsh", "sliding", "lsh"]
    assert sorted(overridden.roberta.encoder.routers) == ["1", "3"]
    assert ClusterFormerConfig.from_pretrained(tmp_path, cluster_layers=[]).layer_kinds == ["sliding"] * 4


def test_every_override_spelling_of_the_kinds_applies_over_the_stored_ones(tmp_path):
    """``from_pretrained`` takes ``layer_kinds``, its former name ``layer_types`` and the shortcuts as overrides: the
    full list replaces the stored one, the shortcuts keep what they leave out; a depth override keeps the kinds within
    it. The kinds of every model kind come from the one `LayerKind` (each with its layer class)."""
    from typing import get_args

    from hf_clusterformer.configuration_clusterformer import LAYER_TYPES, LayerKind
    from hf_clusterformer.modeling_clusterformer import LAYER_CLASSES

    assert LAYER_TYPES == get_args(LayerKind) and set(LAYER_CLASSES) == set(LAYER_TYPES)
    tiny_config(**ALL_TYPES).save_pretrained(tmp_path)
    load = ClusterFormerConfig.from_pretrained
    assert load(tmp_path, layer_kinds=["sliding"] * 4).layer_kinds == ["sliding"] * 4
    alternating = ["sliding", "lsh", "sliding", "lsh"]
    assert load(tmp_path, layer_types=alternating).layer_kinds == alternating
    # new places; Row: a stored layer named again kept its kind only when the layers were the same ones
    assert load(tmp_path, cluster_layers=[1, 2]).layer_kinds == ["sliding", "cluster", "lsh", "sliding"]
    assert load(tmp_path, num_hidden_layers=2).layer_kinds == ["sliding", "cluster"]
    six = load(tmp_path, num_hidden_layers=6, global_layer_type="sparse")
    assert six.layer_kinds == ["sliding", *["sparse"] * 3, "sliding", "sliding"]
    with pytest.raises(ValueError, match=r"^cluster_layers holds 9, outside the 4 encoder layers \(0\.\.3\)\.$"):
        load(tmp_path, cluster_layers=[9])
    with pytest.raises(ValueError, match="^layer_kinds lists 2 kinds for 4 encoder layers; give one per layer.$"):
        load(tmp_path, layer_kinds=["sliding", "lsh"])


def test_a_value_out_of_range_is_one_line_naming_the_field_when_given_or_set():
    """The fields' validators (transformers' and the context bound) refuse a value as it is set, in the constructor or
    afterwards, in one line naming the field; a value of the wrong type stays @strict's refusal."""
    cases = {"window_size": 0, "num_clusters": -1, "max_question_length": 0, "hidden_size": 0, "num_hidden_layers": 0,
             "max_context_length": 1 << 30, "hidden_act": "bogus"}
    for name, value in cases.items():
        # Both lambdas run within this iteration, so the loop variables they read are the current ones.
        attempts = (lambda: ClusterFormerConfig(**{name: value}), lambda: setattr(tiny_config(), name, value))  # noqa: B023
        for attempt in attempts:
            with pytest.raises(ValueError) as raised:
                attempt()
            message = str(raised.value)
            assert type(raised.value) is ValueError and message.startswith(f"{name} ") and "\n" not in message, message
    assert "gelu" in message  # the activations transformers knows
    with pytest.raises(ValueError, match=r"^num_clusters must be a positive integer, got 0\.$"):
        tiny_config().num_clusters = 0
    with pytest.raises(ValueError, match=r"^dtype 'float99' is no torch dtype; use float32, float16 or bfloat16\.$"):
        ClusterFormerConfig(dtype="float99")
    with pytest.raises(ValueError, match=r"^auto_map must be an object"):
        ClusterFormerConfig(auto_map=["x"])
    with pytest.raises(StrictDataclassError, match="window_size"):
        ClusterFormerConfig(window_size="many")
    # Row: a value of the wrong type was @strict's two-line StrictDataclassFieldValidationError, no ValueError
    for attempt, message in [
        (lambda: ClusterFormerConfig(route_by="key"), "route_by='key' was given, but route_by takes one of 'states', "
                                                      "'keys'."),
        (lambda: ClusterFormerConfig(use_answerability_head="yes"), "use_answerability_head='yes' was given, but "
                                                                    "use_answerability_head takes True or False."),
        (lambda: setattr(tiny_config(), "num_clusters", "8"), "num_clusters='8' was given, but num_clusters takes an "
                                                               "integer."),
    ]:
        with pytest.raises(ValueError) as raised:
            attempt()
        assert isinstance(raised.value, StrictDataclassError) and str(raised.value) == message


@pytest.mark.parametrize("arguments, message", [
    (dict(layer_kinds=["sliding", "lsh"], layer_types=["sliding", "cluster"]),
     r"^layer_types \['sliding', 'cluster'\] disagrees with layer_kinds \['sliding', 'lsh'\]; give layer_kinds\.$"),
    (dict(cluster_layers=[1.5]), r"^cluster_layers must be a list of layer indices, got \[1\.5\]\.$"),
    (dict(cluster_layers=[1], global_layer_type=["lsh", "cluster"]),
     r"^global_layer_type lists 2 kinds but cluster_layers has 1 entries; give one kind or one per cluster layer\.$"),
    (dict(global_layer_type="dense"), r"^global_layer_type 'dense' is unknown; choose from \('cluster', "),
    (dict(cluster_layers=[1, 1], global_layer_type=["lsh", "cluster"]),
     r"^cluster_layers lists layer 1 twice; give each layer once\.$"),
    (dict(custom_pipelines=["x"]), r"^custom_pipelines must be an object \(names to classes\), got \['x'\]\.$"),
], ids=["layer_types", "indices", "kinds-count", "unknown-kind", "twice", "custom_pipelines"])
def test_every_rule_of_the_kinds_and_the_maps_is_one_line_naming_the_argument(arguments, message):
    with pytest.raises(ValueError, match=message):
        ClusterFormerConfig(num_hidden_layers=2, **arguments)


def test_a_file_refused_by_a_class_validator_or_of_another_model_type_is_one_line(tmp_path):
    from hf_clusterformer.configuration_clusterformer import ConfigValueError

    with pytest.raises(ConfigValueError, match=r"^config.json: The `output_attentions` attribute is not supported"):
        ClusterFormerConfig.from_dict({"output_attentions": True, "attn_implementation": "sdpa"})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match=r"is a 'gpt2' checkpoint, whose weights Cluster-Former cannot use; give a"):
        ClusterFormerConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("layout", ["shortcuts", "layer_types", "layer_kinds"])
def test_a_config_json_of_every_layout_loads_the_same_layer_kinds(layout, tmp_path):
    """config.json as each earlier layout stored the kinds (``cluster_layers`` + ``global_layer_type``;
    ``layer_types``; ``layer_kinds``) loads into one ``layer_kinds``, through from_pretrained and AutoConfig, and
    saves in today's."""
    from transformers import AutoConfig

    kinds = ["sliding", "cluster", "lsh", "sparse"]
    stored = {"shortcuts": {"cluster_layers": [1, 2, 3], "global_layer_type": kinds[1:]},
              "layer_types": {"layer_types": kinds}, "layer_kinds": {"layer_kinds": kinds}}[layout]
    saved = {key: value for key, value in tiny_config(num_hidden_layers=4).to_dict().items() if key != "layer_kinds"}
    (tmp_path / "config.json").write_text(json.dumps({**saved, **stored}))
    for config in (ClusterFormerConfig.from_pretrained(tmp_path), AutoConfig.from_pretrained(tmp_path)):
        shortcuts = {"cluster_layers", "global_layer_type", "layer_types"}
        assert config.layer_kinds == kinds and not shortcuts & set(vars(config))
    sparse = ClusterFormerConfig.from_pretrained(tmp_path, global_layer_type="sparse")
    assert sparse.layer_kinds == ["sliding", *["sparse"] * 3]
    assert ClusterFormerConfig.from_pretrained(tmp_path, num_hidden_layers=3).layer_kinds == kinds[:3]
    config.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["layer_kinds"] == kinds


def test_a_config_loads_on_any_machine_and_the_model_build_checks_its_memory(tmp_path, monkeypatch):
    """Centroid memory is this machine's matter: a config with more centroids than a small machine holds still loads
    there; building the model is refused in one line naming num_clusters and the largest value that fits."""
    import os

    tiny_config(num_clusters=1 << 20).save_pretrained(tmp_path)
    small = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1 << 12}  # 16 MiB
    monkeypatch.setattr(os, "sysconf", lambda name, sysconf=os.sysconf: small.get(name) or sysconf(name))
    config = ClusterFormerConfig.from_pretrained(tmp_path)
    assert config.num_clusters == 1 << 20
    with pytest.raises(ValueError, match=r"^num_clusters 1048576 needs .* of centroids .*give at most \d+"):
        ClusterFormerModel(config)


def test_folders_saved_before_layer_kinds_load_with_the_same_outputs(tmp_path):
    """A folder as the code before ``layer_kinds`` wrote it (the shortcuts in config.json, router buffers under
    ``encoder.routers.{i}``), made here from a current one: it loads with the same kinds, buffers and logits."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(tiny_config(**ALL_TYPES)).eval()
    router = model.cluster_routers()[1]
    router.centroids.copy_(torch.nn.functional.normalize(torch.randn_like(router.centroids), dim=-1))
    router.fitted.fill_(True)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    kinds = config.pop("layer_kinds")
    config["cluster_layers"] = [i for i, kind in enumerate(kinds) if kind != "sliding"]
    config["global_layer_type"] = [kind for kind in kinds if kind != "sliding"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = load_file(tmp_path / "model.safetensors")
    old = {re.sub(r"encoder\.layer\.(\d+)\.router\.", r"encoder.routers.\1.", k): v for k, v in weights.items()}
    assert any(".routers." in k for k in old)
    save_file(old, tmp_path / "model.safetensors", metadata={"format": "pt"})

    loaded = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path).eval()
    assert loaded.config.layer_kinds == kinds
    loaded_router = loaded.cluster_routers()[1]
    assert torch.equal(loaded_router.centroids, router.centroids) and bool(loaded_router.fitted)
    assert torch.equal(
        loaded.roberta.encoder.routers["2"].hash_vectors, model.roberta.encoder.routers["2"].hash_vectors
    )
    ids = torch.tensor([random_example(torch.Generator().manual_seed(3), 4, 90)])
    with torch.no_grad():
        assert torch.equal(loaded(ids).start_logits, model(ids).start_logits)
    # saved again, it is written in today's layout; a plain torch state dict of the old layout loads too
    loaded.save_pretrained(tmp_path / "again")
    assert not any(".routers." in k for k in load_file(tmp_path / "again" / "model.safetensors"))
    fresh = ClusterFormerForQuestionAnswering(tiny_config(**ALL_TYPES)).eval()
    fresh.load_state_dict(old)
    assert torch.equal(fresh.cluster_routers()[1].centroids, router.centroids)


def test_question_prefix_from_separators_for_roberta_and_bert_templates():
    roberta = torch.tensor([[BOS, 5, 6, SEP, SEP, 7, 8, SEP]])
    bert = torch.tensor([[BOS, 5, 6, SEP, 7, 8, SEP, PAD]])
    left = torch.tensor([[PAD, PAD, BOS, 5, SEP, SEP, 7, SEP]])
    prefix, question, found = locate_question_prefix(roberta == SEP)
    assert (prefix.tolist(), question.tolist(), found.tolist()) == ([5], [2], [True])
    prefix, question, _ = locate_question_prefix(bert == SEP)
    assert (prefix.tolist(), question.tolist()) == ([4], [2])
    prefix, question, _ = locate_question_prefix(left == SEP, starts=torch.tensor([2]))
    assert (prefix.tolist(), question.tolist()) == ([4], [1])

    model = ClusterFormerModel(tiny_config()).eval()
    ids = torch.tensor([[BOS, 5, 6, SEP, *range(10, 40), SEP]])
    with torch.no_grad():
        found = model(ids).last_hidden_state
        given = model(ids, question_lengths=[4]).last_hidden_state
    assert torch.equal(found, given)


def test_position_budget_and_longest_input_have_one_rule():
    assert required_position_embeddings(64, 256) == 64 + 3 + 256 + 2
    config = tiny_config()
    assert config.max_input_length == config.max_question_length + config.max_context_length + 4
    assert required_position_embeddings(config.max_question_length, config.window_size, config.pad_token_id) <= 64
    with pytest.raises(ValueError, match="the question of row 0 has 9 tokens, more than max_question_length=8"):
        check_input_lengths(config, 9, 10, where="row 0")
    check_input_lengths(config, 8, config.max_context_length)  # the limits themselves are allowed
    model = ClusterFormerModel(tiny_config(max_context_length=40)).eval()
    with torch.no_grad():  # a context of exactly max_context_length tokens (plus its closing separator) runs
        model(torch.tensor([[BOS, 5, SEP, SEP, *range(10, 50), SEP]]))


def test_routed_layers_run_only_chunks_with_representative_slots():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (2, 23), generator=generator)  # 4 is the sentinel
    ids[1, 5:] = 4  # row 1 has 5 routed slots, row 0 at most 23
    ids[0, 11:] = 4  # row 0 has 11: two chunks of 6 hold every routed slot
    states = torch.randn(2, 23, 3, generator=generator)
    chunks, chunk_valid, order = sort_into_chunks(states, ids, 6, sentinel=4, num_chunks=2)
    assert chunks.shape == (4, 6, 3) and chunk_valid.view(2, -1).sum(1).tolist() == [11, 5]
    restored = unsort_from_chunks(chunks * 2, order, 23, fill=states)
    routed = ids != 4
    kept = torch.zeros(2, 24, dtype=torch.bool).scatter(1, order, True)[:, :23]
    assert routed[~kept].sum() == 0 and kept.sum(1).tolist() == [12, 12]
    assert torch.equal(restored[kept], states[kept] * 2) and torch.equal(restored[~kept], states[~kept])
    with pytest.raises(ValueError, match="pass fill"):
        unsort_from_chunks(chunks, order, 23)


def test_a_bert_checkpoint_given_to_from_pretrained_names_the_loader_that_maps_it(tmp_path):
    from transformers import BertConfig, BertModel

    from hf_clusterformer import ClusterFormerForQuestionAnswering
    from hf_clusterformer.conversion import load_qa_model

    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=64)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"BERT-family checkpoint.*load_qa_model or convert_checkpoint"):
        ClusterFormerForQuestionAnswering.from_pretrained(tmp_path)
    loaded = load_qa_model(tmp_path, window_size=16, window_stride=12, max_question_length=8)
    assert loaded.config.model_type == "clusterformer"


def test_input_ids_that_are_not_token_ids_get_one_line_naming_them():
    from helpers import pad_batch, random_example, tiny_config

    from hf_clusterformer import ClusterFormerModel

    model = ClusterFormerModel(tiny_config()).eval()
    ids, mask = pad_batch([random_example(torch.Generator().manual_seed(0), 3, 20)])
    with pytest.raises(TypeError, match="input_ids must hold integer token ids, got dtype torch.float32"):
        model(input_ids=ids.float(), attention_mask=mask)
    with pytest.raises(ValueError, match=r"token id 100, outside the vocabulary \(0..99\)"):
        model(input_ids=ids.masked_fill(ids == ids[0, 5], 100), attention_mask=mask)
    with pytest.raises(ValueError, match="token id -3"):
        model(input_ids=ids.masked_fill(ids == ids[0, 5], -3), attention_mask=mask)


def test_a_num_clusters_override_that_does_not_fit_the_saved_centroids_is_one_line(tmp_path):
    """Checked against the saved config before loading (no transformers size-mismatch error matched by its text)."""
    ClusterFormerForQuestionAnswering(tiny_config(cluster_layers=[2], num_clusters=8)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"saved with num_clusters=8.*ignore_mismatched_sizes=True"):
        ClusterFormerForQuestionAnswering.from_pretrained(tmp_path, num_clusters=4)
    model = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path, num_clusters=4, ignore_mismatched_sizes=True)
    assert model.cluster_routers()[2].centroids.shape[0] == 4 and not bool(model.cluster_routers()[2].fitted)
    unrouted = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path, num_clusters=4, cluster_layers=[])
    assert unrouted.config.num_clusters == 4
    # a checkpoint without routed layers has no router tensors: a cluster layer added on loading takes any size
    plain = ClusterFormerForQuestionAnswering(tiny_config(cluster_layers=[], num_clusters=8))
    plain.save_pretrained(tmp_path / "plain")
    added = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path / "plain", num_clusters=4, cluster_layers=[1])
    assert added.cluster_routers()[1].centroids.shape[0] == 4
