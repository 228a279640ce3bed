"""The global layer types (cluster, LSH, sparse, window_cluster): each saves and loads (router buffers and a
window_cluster layer's routed projection included), trains in the QA head under the Trainer with
`CentroidUpdateCallback` (which fits the K-Means routers only: cluster and window_cluster layers'), answers through the
pipeline; LSH buckets are argmax [xR; -xR]; a sparse layer mixes windows only at the same in-window slot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from safetensors.torch import load_file
from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

import hf_clusterformer
from clusterformer_research.longrange import build_longrange_tokenizer, generate_longrange_dataset
from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering
from hf_clusterformer.features import prepare_train_features
from hf_clusterformer.modeling_clusterformer import ClusterRouter, LSHRouter, build_window_layout, count_windows

ROOT = Path(__file__).resolve().parents[1]
TYPES = ("cluster", "lsh", "sparse", "window_cluster")
#: The kinds whose router holds K-Means centroids.
CENTROID_KINDS = ("cluster", "window_cluster")


@pytest.fixture(scope="module")
def tokenizer():
    return build_longrange_tokenizer(vocab_size=1300, num_examples=20)


@pytest.fixture(scope="module")
def examples() -> list[dict]:
    """Generated one-hop ("local") examples with 150-250-token contexts: several 32-token windows each."""
    return generate_longrange_dataset(16, 0, (150, 250), "local", min_gap_tokens=40)


def _config(tokenizer, **overrides) -> ClusterFormerConfig:
    """3 layers, 32 wide, 32-token windows with stride 24, a global layer at index 2, dropout off."""
    values = dict(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
        cluster_layers=[2], num_clusters=8, window_size=32, window_stride=24, max_question_length=16,
        max_context_length=8192, max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        type_vocab_size=1,
    )
    values.update(overrides)
    return ClusterFormerConfig(**values)


def _model(tokenizer, seed: int = 0, **overrides) -> ClusterFormerForQuestionAnswering:
    torch.manual_seed(seed)
    return ClusterFormerForQuestionAnswering(_config(tokenizer, **overrides)).eval()


def _encode(tokenizer, example: dict) -> dict:
    return dict(tokenizer(example["question"], example["context"], return_tensors="pt"))


def _router_buffers(model) -> dict[str, torch.Tensor]:
    return {name: buffer.clone() for name, buffer in model.named_buffers() if ".router." in name}


# -- save / load ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TYPES)
def test_save_and_load_give_identical_logits(kind, tokenizer, examples, tmp_path):
    model = _model(tokenizer, global_layer_type=kind)
    router = model.base_model.encoder.routers[str(2)] if kind != "sparse" else None
    generator = torch.Generator().manual_seed(7)
    if isinstance(router, ClusterRouter):  # as if K-Means had run: other centroids than the seeded ones
        router.centroids.copy_(torch.nn.functional.normalize(torch.randn(8, 32, generator=generator), dim=-1))
        router.fitted.fill_(True)
    elif isinstance(router, LSHRouter):
        router.hash_vectors.copy_(torch.randn(32, 4, generator=generator))
    else:
        assert len(model.base_model.encoder.routers) == 0
    if kind == "window_cluster":  # its routed path opened, as training would: the projection must load as saved
        with torch.no_grad():
            model.base_model.encoder.layer[2].routed_output.weight.normal_(std=0.5, generator=generator)
    model.save_pretrained(tmp_path)

    saved = load_file(tmp_path / "model.safetensors")
    expected_buffers = {"lsh": {"hash_vectors"}, "sparse": set()}.get(kind, {"centroids", "fitted"})
    assert {k.rsplit(".", 1)[1] for k in saved if ".router." in k} == expected_buffers
    assert ({k for k in saved if ".routed_output." in k} == {"roberta.encoder.layer.2.routed_output.weight",
            "roberta.encoder.layer.2.routed_output.bias"}) == (kind == "window_cluster")

    # A different seed would draw other initial centroids / hash vectors: the loaded ones must be the saved ones.
    loaded = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path, centroid_seed=123).eval()
    assert loaded.config.layer_kinds == ["sliding", "sliding", kind]
    for name, buffer in _router_buffers(model).items():
        assert torch.equal(dict(loaded.named_buffers())[name], buffer), name
    for name, weight in model.named_parameters():
        assert torch.equal(dict(loaded.named_parameters())[name], weight), name
    inputs = _encode(tokenizer, examples[0])
    with torch.no_grad():
        before, after = model(**inputs), loaded(**inputs)
    assert inputs["input_ids"].shape[1] > 3 * 32  # several windows, so the global layer matters
    assert torch.equal(before.start_logits, after.start_logits)
    assert torch.equal(before.end_logits, after.end_logits)


# -- Trainer + CentroidUpdateCallback ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_features(tokenizer, examples) -> datasets.Dataset:
    raw = datasets.Dataset.from_list(examples[:12])
    return raw.map(
        prepare_train_features, batched=True, remove_columns=raw.column_names,
        fn_kwargs={"tokenizer": tokenizer, "max_length": 4096},
    ).remove_columns(["answer_truncated"])


@pytest.mark.parametrize(
    "kinds", [["cluster"], ["lsh"], ["sparse"], ["window_cluster"], ["lsh", "cluster", "sparse"]],
    ids=["cluster", "lsh", "sparse", "window_cluster", "mixed"],
)
def test_trainer_with_centroid_callback_fits_cluster_routers_only(kinds, tokenizer, train_features, tmp_path):
    layers = [2] if len(kinds) == 1 else [1, 2, 3]
    kind = kinds if len(kinds) > 1 else kinds[0]
    model = _model(tokenizer, num_hidden_layers=4, cluster_layers=layers, global_layer_type=kind)
    model.train()
    buffers = _router_buffers(model)
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    callback = hf_clusterformer.CentroidUpdateCallback(update_every_steps=1, memory_size=4000, seed=0)
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3, save_strategy="no",
        report_to="none", use_cpu=True, logging_steps=1, seed=0, disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=train_features, data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[callback],
    )
    result = trainer.train()
    assert result.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(p, weights[n]) for n, p in model.named_parameters())  # the QA head trained
    for index, kind in zip(layers, kinds):
        if kind == "window_cluster":  # its routed path opened from its zero start
            assert model.base_model.encoder.layer[index].routed_output.weight.abs().sum() > 0

    routers = dict(model.base_model.encoder.routers.items())
    cluster_layers = [i for i, kind in zip(layers, kinds) if kind in CENTROID_KINDS]
    assert sorted(model.cluster_routers()) == cluster_layers
    assert sorted(int(i) for i in routers) == [i for i, kind in zip(layers, kinds) if kind != "sparse"]
    for index, router in routers.items():
        if isinstance(router, ClusterRouter):
            assert bool(router.fitted) and callback.num_updates >= 1
            assert not torch.equal(router.centroids, buffers[f"roberta.encoder.layer.{index}.router.centroids"])
            assert any(f"clusters/layer{index}/num_states" in entry for entry in trainer.state.log_history)
        else:  # LSH hash vectors are fixed: neither trained nor refitted
            assert torch.equal(router.hash_vectors, buffers[f"roberta.encoder.layer.{index}.router.hash_vectors"])
    if not cluster_layers:
        assert callback.num_updates == 0 and callback.history == []


# -- pipeline ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TYPES)
def test_pipeline_answers(kind, tokenizer, examples, tmp_path):
    model = _model(tokenizer, global_layer_type=kind)
    if kind in CENTROID_KINDS:
        model.cluster_routers()[2].fitted.fill_(True)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    example = examples[1]
    for source in (dict(model=model, tokenizer=tokenizer), dict(model=str(tmp_path))):
        qa = hf_clusterformer.pipeline(**source)
        answers = qa(question=example["question"], context=example["context"], top_k=3)
        assert len(answers) == 3
        for answer in answers:
            assert answer["answer"] == example["context"][answer["start"] : answer["end"]]
            assert 0.0 <= answer["score"] <= 1.0
    assert qa.model.config.layer_kinds[2] == kind


# -- LSH buckets ------------------------------------------------------------------------------------------------------


def test_lsh_router_is_argmax_of_rotations_and_their_negatives(tokenizer):
    router = _model(tokenizer, global_layer_type="lsh").base_model.encoder.routers["2"]
    assert router.hash_vectors.shape == (32, 4)  # d x p/2 for p = 8 buckets
    generator = torch.Generator().manual_seed(3)
    states = torch.randn(2, 50, 32, generator=generator)
    representative = torch.rand(2, 50, generator=generator) > 0.2
    rotated = states @ router.hash_vectors
    manual = torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)
    ids = router(states, representative)
    assert torch.equal(ids[representative], manual[representative])
    assert (ids[~representative] == 8).all()  # non-representative slots get the sentinel p
    assert set(manual.flatten().tolist()) == set(range(8))  # all 2 * 4 buckets are reachable


def test_lsh_layer_buckets_in_the_model(tokenizer, examples):
    model = _model(tokenizer, global_layer_type="lsh")
    inputs = _encode(tokenizer, examples[2])
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, output_cluster_assignments=True)
    states = out.hidden_states[2][0]  # token-aligned states entering layer 2; context copies share one state
    rotated = states @ model.base_model.encoder.routers["2"].hash_vectors
    manual = torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)
    ids, slots = out.cluster_assignments[0][0], out.window_token_index[0].reshape(-1)
    prefix = (inputs["input_ids"][0] == tokenizer.eos_token_id).nonzero()[0].item() + 2
    context = (ids >= 0) & (slots >= prefix)
    assert int(context.sum()) == inputs["input_ids"].shape[1] - prefix  # one owner copy per context token
    assert torch.equal(ids[context], manual[slots[context]])


# -- sparse layer -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stride", [32, 24], ids=["no-overlap", "overlap"])
def test_sparse_layer_mixes_windows_only_at_the_same_slot(stride, tokenizer, examples):
    """Changing one context token changes, after one sparse layer, exactly the tokens that share a window slot with
    one of its copies; after one sliding layer only the tokens sharing a window with it."""
    inputs = _encode(tokenizer, examples[3])
    ids = inputs["input_ids"][0]
    length = ids.shape[0]
    prefix = (ids == tokenizer.eos_token_id).nonzero()[0].item() + 2
    changed_position = prefix + 50  # with stride 24 in windows 1 and 2 (context 24-55 and 48-79)
    edited = ids.clone()
    edited[changed_position] = (int(ids[changed_position]) + 7) % 1000 + 10
    windows = count_windows(length - prefix, 32, stride)
    layout = build_window_layout(torch.tensor([prefix]), torch.tensor([length]), 32, stride, windows, prefix)
    index, valid = layout.token_index[0], layout.valid[0]
    copies = (index == changed_position) & valid  # (K, S)
    slots = copies.any(dim=0)  # in-window slots holding a copy of the changed token
    assert int(slots.sum()) == (2 if stride < 32 else 1)
    same_slot = set(index[:, slots][valid[:, slots]].tolist())
    same_window = set(index[copies.any(dim=1)][valid[copies.any(dim=1)]].tolist())

    for kind, expected in (("sparse", same_slot), ("sliding", same_window)):
        layers = dict(cluster_layers=[0], global_layer_type="sparse") if kind == "sparse" else dict(cluster_layers=[])
        model = _model(tokenizer, num_hidden_layers=1, window_stride=stride, **layers)
        with torch.no_grad():
            before = model.roberta(input_ids=ids[None]).last_hidden_state[0]
            after = model.roberta(input_ids=edited[None]).last_hidden_state[0]
        moved = (before - after).abs().amax(dim=-1)
        changed = set(torch.nonzero(moved > 1e-6).flatten().tolist())
        assert changed == expected, kind
        assert (moved[sorted(set(range(length)) - changed)] == 0).all()
    assert changed_position in same_slot
    assert max(abs(p - changed_position) for p in same_slot) > 3 * 32  # far windows see the change through the slot
    assert all(p >= prefix for p in same_slot)  # question tokens sit at other slots
    assert not same_slot - {changed_position} <= same_window


def test_compare_layers_quick(tmp_path):
    """bench/compare_layers.py --quick runs every variant on both splits and writes its table and chart."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare_layers.py"), "--quick", "--results_dir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "compare_layers.md").read_text()
    for name in ("Sliding window", "Sparse Attention", "Locality-Sensitive Hashing", "Cluster-Former (#C="):
        assert name in table and name in result.stdout
    assert "longrange EM" in table and "local EM" in table
    assert (tmp_path / "compare_layers.png").read_bytes()[:4] == b"\x89PNG"
