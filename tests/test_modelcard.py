"""Model cards: Hub metadata checked with huggingface_hub's own tools (and the test server's validator), the body,
result parsing, the command line, and the committed example card kept in sync with the generator."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import tiny_config
from huggingface_hub import ModelCard, ModelCardData, constants, metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results

from hf_clusterformer.data import approx_token_count
from hf_clusterformer.modelcard import card_from_spec, default_widget, load_results, main, make_model_card
from hf_clusterformer_files import stamp_card

EXAMPLE = Path(__file__).resolve().parents[1] / "model_cards" / "clusterformer-demo"


def _card(**overrides) -> ModelCard:
    values = dict(
        model_id="user/tiny-cf",
        base_model="FacebookAI/roberta-base",
        datasets=["rajpurkar/squad"],
        results={"eval_exact_match": 71.234, "eval_f1": 80.5, "eval_loss": 1.2},
        centroids_fitted={2: True},
        centroid_fitting="refitted every 200 steps on 20,000 states",
    )
    values.update(overrides)
    return make_model_card(tiny_config(), **values)


def test_metadata_passes_huggingface_hub_parsing(tmp_path):
    path = tmp_path / "README.md"
    path.write_text(str(_card()), encoding="utf-8")
    metadata = metadata_load(path)
    assert metadata["library_name"] == "transformers"
    assert metadata["pipeline_tag"] == "question-answering"
    assert metadata["license"] == "apache-2.0"
    assert metadata["base_model"] == "FacebookAI/roberta-base"
    assert metadata["datasets"] == ["rajpurkar/squad"]
    assert {"clusterformer", "long-context", "custom_code"} <= set(metadata["tags"])

    model_name, results = model_index_to_eval_results(metadata["model-index"])
    assert model_name == "tiny-cf"
    assert {(r.metric_type, r.metric_value) for r in results} == {("exact_match", 71.23), ("f1", 80.5)}
    assert {(r.task_type, r.dataset_type, r.dataset_name) for r in results} == {
        ("question-answering", "rajpurkar/squad", "rajpurkar/squad")
    }

    loaded = ModelCard.load(path)
    assert str(loaded) == path.read_text(encoding="utf-8")
    assert loaded.data.to_dict() == ModelCardData(**metadata).to_dict()
    assert [r.metric_type for r in loaded.data.eval_results] == ["exact_match", "f1"]

    widget = metadata["widget"]
    assert widget == default_widget()
    assert approx_token_count(widget[0]["context"]) > 500 and widget[0]["context"].count("\n\n") >= 5


def test_metadata_validates_against_the_hub_endpoint(hub_server, monkeypatch):
    monkeypatch.setattr(constants, "ENDPOINT", hub_server.url)
    _card().validate()
    make_model_card(tiny_config()).validate()
    assert ("POST", "/api/validate-yaml") in hub_server.requests


def test_card_without_results_says_not_evaluated():
    card = make_model_card(tiny_config(), model_id="user/fresh")
    assert "model-index" not in card.data.to_dict()
    assert card.data.eval_results is None
    assert "Not evaluated: no exact match / F1 has been measured" in card.text
    assert "| Centroids | not recorded |" in card.text


def test_body_explains_the_cluster_configuration_and_loading():
    config = tiny_config(num_hidden_layers=4, cluster_layers=[1, 3], global_layer_type=["cluster", "lsh"],
                         use_answerability_head=True)
    text = make_model_card(config, model_id="user/cf", centroids_fitted={1: True},
                           centroid_fitting="every 100 steps on 5,000 states").text
    assert "| Global layers (0-based) | 1 (cluster), 3 (lsh) |" in text
    assert "| Window size / stride | 16 / 12 context tokens |" in text
    assert "| Clusters per global layer | 8 |" in text
    assert "| Longest context | 4,096 tokens |" in text
    assert "| Answerability head | yes |" in text
    assert "| Centroids | fitted by K-Means on the model's own hidden states |" in text
    assert "Centroid fitting: every 100 steps on 5,000 states" in text
    assert "An LSH layer" in text
    assert 'hf_clusterformer.pipeline(model="user/cf")' in text
    assert 'pipeline("question-answering", model="user/cf", trust_remote_code=True, revision=revision)' in text
    assert (
        'AutoModelForQuestionAnswering.from_pretrained("user/cf", trust_remote_code=True, revision=revision)' in text
    )
    assert 'revision = "main"' in text and "replace\n`\"main\"` with the commit you tested" in text
    pinned = make_model_card(config, model_id="user/cf", revision="0123abc").text
    assert 'revision = "0123abc"' in pinned and "with the commit you tested" not in pinned
    assert "@inproceedings{wang-etal-2021-cluster" in text

    states = {
        None: "not recorded",
        (): "not fitted (seeded random unit vectors)",
        (1,): "fitted by K-Means for layers 1 only",
    }
    two = tiny_config(num_hidden_layers=4, cluster_layers=[1, 3])
    for fitted, phrase in states.items():
        value = None if fitted is None else {1: 1 in fitted, 3: False}
        assert phrase in make_model_card(two, centroids_fitted=value).text
    assert "none (no K-Means cluster layer)" in make_model_card(tiny_config(cluster_layers=[])).text


def test_window_cluster_layers_are_described_and_their_centroids_counted():
    """A window_cluster layer is named as such, said to start as the sliding-window model, and its centroids (a
    `ClusterRouter`'s, as a cluster layer's) make the "Centroids" row; routing by keys is said where it applies."""
    from hf_clusterformer.modelcard import CENTROID_KINDS
    from hf_clusterformer.modeling_clusterformer import ROUTER_CLASSES, ClusterRouter

    assert set(CENTROID_KINDS) == {kind for kind, router in ROUTER_CLASSES.items() if router is ClusterRouter}
    config = tiny_config(num_hidden_layers=4, cluster_layers=[1, 3], global_layer_type=["window_cluster", "lsh"])
    text = make_model_card(config, centroids_fitted={1: True}).text
    assert "| Global layers (0-based) | 1 (window_cluster), 3 (lsh) |" in text
    assert "| Centroids | fitted by K-Means on the model's own hidden states |" in text
    assert "A window-cluster layer attends within each window" in text
    assert "a projection that starts at zero, so until training moves it the model reads exactly as its " \
           "sliding-window model" in text
    assert "key projection" not in text
    assert "not fitted (seeded random unit vectors)" in make_model_card(config, centroids_fitted={1: False}).text
    alone = tiny_config(num_hidden_layers=2, cluster_layers=[1], global_layer_type="window_cluster", route_by="keys")
    keyed = make_model_card(alone, centroids_fitted={1: True}).text
    assert "| Centroids | fitted by K-Means on the model's own key projections |" in keyed
    assert "The routers compare each token's key projection, not its hidden state, with their centroids." in keyed
    plain = make_model_card(tiny_config(route_by="keys", cluster_layers=[])).text  # nothing routed: nothing to say
    assert "window-cluster" not in plain and "key projection" not in plain
    assert "none (no K-Means cluster layer)" in plain


def test_load_results_forms_and_errors(tmp_path):
    dataset = {"name": "SQuAD", "type": "rajpurkar/squad", "split": "validation"}
    flat = load_results({"exact": 50, "f1": 62.346}, dataset)
    assert flat == [{"task": "question-answering", "dataset": dataset, "metrics": {"exact_match": 50.0, "f1": 62.35}}]
    path = tmp_path / "results.json"
    path.write_text(json.dumps([{"dataset": dataset, "metrics": {"test_exact_match": 1.0}}]))
    assert load_results(path) == [{"task": "question-answering", "dataset": dataset, "metrics": {"exact_match": 1.0}}]
    assert load_results(None) == []
    with pytest.raises(ValueError, match="percentage"):
        load_results({"f1": 101}, dataset)
    with pytest.raises(ValueError, match="No exact match or F1"):
        load_results({"eval_loss": 0.3}, dataset)
    with pytest.raises(ValueError, match="dataset"):
        load_results({"f1": 10.0})


def test_committed_example_card_is_in_sync_with_the_generator(tmp_path):
    spec = json.loads((EXAMPLE / "card.json").read_text(encoding="utf-8"))
    committed = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    assert stamp_card(str(card_from_spec(spec))) == committed, (
        "model_cards/clusterformer-demo/README.md is stale: run python -m hf_clusterformer.modelcard "
        "--spec model_cards/clusterformer-demo/card.json --out model_cards/clusterformer-demo/README.md"
    )
    assert main(["--spec", str(EXAMPLE / "card.json"), "--out", str(EXAMPLE / "README.md"), "--check"]) == 0
    assert main(["--spec", str(EXAMPLE / "card.json"), "--out", str(tmp_path / "README.md")]) == 0
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == committed
    (tmp_path / "README.md").write_text(committed + "\nedited\n", encoding="utf-8")
    assert main(["--spec", str(EXAMPLE / "card.json"), "--out", str(tmp_path / "README.md"), "--check"]) == 1

    metadata = metadata_load(EXAMPLE / "README.md")
    ModelCardData(**metadata)  # parses
    assert metadata["pipeline_tag"] == "question-answering" and metadata["library_name"] == "transformers"
    if spec.get("results"):
        assert "model-index" in metadata
    else:
        assert "model-index" not in metadata and "Not evaluated" in committed
    assert approx_token_count(metadata["widget"][0]["context"]) > 500
    for placeholder in ("TODO", "TBD", "XXX", "lorem"):
        assert placeholder not in committed


def test_command_line_records_results_and_config_in_the_spec(tmp_path):
    spec_path = tmp_path / "card.json"
    shutil.copy(EXAMPLE / "card.json", spec_path)
    (tmp_path / "results.json").write_text(json.dumps({"eval_exact_match": 42.0, "eval_f1": 55.5, "epoch": 3.0}))
    tiny_config(window_size=24, window_stride=20).save_pretrained(tmp_path / "model")
    out = tmp_path / "card"
    out.mkdir()
    args = ["--spec", str(spec_path), "--results", str(tmp_path / "results.json"), "--config", str(tmp_path / "model"),
            "--save-spec", "--out", str(out)]
    assert main(args) == 0
    metadata = metadata_load(out / "README.md")
    _, results = model_index_to_eval_results(metadata["model-index"])
    assert {(r.metric_type, r.metric_value, r.dataset_type, r.dataset_split) for r in results} == {
        ("exact_match", 42.0, "twin", "validation"), ("f1", 55.5, "twin", "validation"),
    }
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "| Window size / stride | 24 / 20 context tokens |" in text
    saved = json.loads(spec_path.read_text(encoding="utf-8"))
    assert saved["config"]["window_size"] == 24 and saved["results"]["eval_f1"] == 55.5
    assert main(["--spec", str(spec_path), "--out", str(out), "--check"]) == 0


def test_card_template_ships_as_package_data():
    import configparser

    from hf_clusterformer.modelcard import TEMPLATE

    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    assert TEMPLATE.is_file() and TEMPLATE.name in setup["options.package_data"]["hf_clusterformer"]
    assert "{{ card_data }}" in TEMPLATE.read_text(encoding="utf-8")


def test_generated_datasets_are_described_not_linked():
    card = make_model_card(tiny_config(), datasets=["squad-multipassage"], results={"eval_f1": 40.0})
    assert "huggingface.co/datasets/squad-multipassage" not in card.text and "datasets" not in card.data.to_dict()
    assert "Multi-passage contexts built from the SQuAD v1.1 dev set" in card.text
    assert "| SQuAD v1.1 multi-passage (built from the dev set) | - |" in card.text
