"""The table of heads (`hf_clusterformer_heads.HEADS`) is the one place a head is described: a row added to it reaches
the Auto registrations, the Hub's ``auto_map``, conversion's ``task``, export, the model card and the command's
``--task``."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
import transformers
from helpers import pad_batch, random_example, tiny_config

import hf_clusterformer
import hf_clusterformer_heads
from hf_clusterformer import conversion, export, modelcard, modeling_clusterformer
from hf_clusterformer.hub import hub_auto_map
from hf_clusterformer.modeling_clusterformer import (
    ClusterFormerForMultipleChoice,
    ClusterFormerForSequenceClassification,
)
from hf_clusterformer_cli import build_parser


class ClusterFormerForRanking(ClusterFormerForSequenceClassification):
    """A trivial new head: a sequence classifier under another name."""


class AutoModelForRanking:
    """Stands in for a transformers Auto class: records what is registered with it."""

    registered: list[tuple[type, type]] = []

    @classmethod
    def register(cls, config_class: type, model_class: type, exist_ok: bool = False) -> None:
        cls.registered.append((config_class, model_class))


RANKING = hf_clusterformer_heads.Head(
    "text-ranking", "rank", ClusterFormerForRanking.__name__, AutoModelForRanking.__name__, ("ForRanking",),
    "ranking", outputs=("scores",), pipeline_class="TextClassificationPipeline",
    card={"model": "A ranker", "input": "A text", "output": "a score", "prefix": "the text's `<s>`",
          "returns": "A score per text ({mask} unused)."},
)


class ClusterFormerForChoiceRanking(ClusterFormerForMultipleChoice):
    """A new head that reads a row per choice: multiple choice under another name."""


CHOICE_RANKING = hf_clusterformer_heads.Head(
    "choice-ranking", "choice-rank", ClusterFormerForChoiceRanking.__name__, "AutoModelForMultipleChoice",
    ("ForChoiceRanking",), "choice-ranking", inputs=("batch", "choices", "length"),
)


@pytest.fixture
def ranking(monkeypatch):
    """The table with the new row, its model class where the library looks classes up and its Auto class in
    transformers."""
    monkeypatch.setattr(hf_clusterformer_heads, "HEADS", (*hf_clusterformer_heads.HEADS, RANKING))
    monkeypatch.setattr(
        modeling_clusterformer, ClusterFormerForRanking.__name__, ClusterFormerForRanking, raising=False
    )
    # on the module registration reads (sys.modules' now: an import of transformers.processing_utils replaces it)
    for module in {id(m): m for m in (transformers, sys.modules["transformers"])}.values():
        monkeypatch.setattr(module, AutoModelForRanking.__name__, AutoModelForRanking, raising=False)
    monkeypatch.setattr(AutoModelForRanking, "registered", [])
    return RANKING


def test_the_table_rows_are_distinct():
    heads = hf_clusterformer_heads.HEADS
    for column in ("task", "key", "class_name", "auto_class"):
        values = [getattr(head, column) for head in heads]
        assert len(set(values)) == len(values), column
    assert heads[0].task == "question-answering"
    for head in heads:
        assert hasattr(modeling_clusterformer, head.class_name) and hasattr(transformers, head.auto_class)
        find_head = hf_clusterformer_heads.find_head
        assert find_head(head.key) is head and find_head(head.task) is head


def test_a_new_row_is_registered_with_its_auto_class(ranking):
    hf_clusterformer.register_auto_classes()
    assert AutoModelForRanking.registered == [(hf_clusterformer.ClusterFormerConfig, ClusterFormerForRanking)]


def test_a_new_row_is_in_the_hub_auto_map(ranking):
    assert hub_auto_map()[ranking.auto_class] == f"modeling_clusterformer.{ranking.class_name}"
    assert ranking.auto_class not in hub_auto_map(False)


def test_conversion_takes_a_new_rows_task_and_key(ranking):
    assert conversion._asked_head("text-ranking") is conversion._asked_head("rank") is ranking
    assert conversion._asked_head("qa").task == "question-answering" and conversion._asked_head(None) is None
    with pytest.raises(ValueError, match="rank.*text-ranking"):
        conversion._asked_head("ranking-of-texts")


def test_conversion_decides_its_heads_once(ranking):
    """One decision, which every later step reads: the head built (the one asked for, else a Cluster-Former source's
    own, else question answering) and the source's own head; a bare ClusterFormerModel needs a head named."""
    from transformers import RobertaConfig

    def heads(asked, model_type, architectures):
        source = (RobertaConfig if model_type == "roberta" else tiny_config)(architectures=architectures)
        decided = conversion._conversion_heads(asked and conversion._asked_head(asked), source, "src")
        return decided.built.key, decided.own and decided.own.key, decided.other and decided.other.key

    assert heads(None, "roberta", ["RobertaForMaskedLM"]) == ("qa", "mlm", "mlm")  # RoBERTa: question answering
    assert heads(None, "roberta", None) == ("qa", None, None)
    assert heads(None, "clusterformer", ["ClusterFormerForMaskedLM"]) == ("mlm", "mlm", None)  # its own head
    assert heads("rank", "clusterformer", ["ClusterFormerForMaskedLM"]) == ("rank", "mlm", "mlm")  # a new row's
    assert heads("rank", "roberta", ["RobertaForRanking"]) == ("rank", "rank", None)
    with pytest.raises(conversion.ConversionTaskError, match="holds a ClusterFormerModel, which has no head to keep"):
        heads(None, "clusterformer", ["ClusterFormerModel"])


def test_a_new_row_exports(ranking):
    assert export.EXPORT_CLASSES[ranking.class_name] is ClusterFormerForRanking
    assert list(export.EXPORT_CLASSES)[-2:] == [ranking.class_name, "ClusterFormerModel"]
    assert export.output_names(ClusterFormerForRanking(tiny_config())) == ["scores"]


def test_a_new_rows_card_words(ranking):
    text = modelcard._task_text("text-ranking", "me/ranker", '"text"', "<mask>", "main")
    assert text["head"] == {**ranking.card, "returns": "A score per text (<mask> unused)."}
    assert 'pipeline("text-ranking", model="me/ranker")' in text["plugin_snippet"]
    assert modelcard._card_task(tiny_config(), "text-ranking", None) == "text-ranking"


def test_a_new_row_gets_a_whole_card(ranking):
    """Its settings rows, widget and snippets come from the row (a pair head's defaults where it names none)."""
    config = tiny_config()
    config.untrained_weights = {"names": ["classifier.out_proj.weight"]}
    card = str(modelcard.make_model_card(config, task="text-ranking", model_id="me/ranker"))
    assert "pipeline_tag: text-ranking" in card
    assert "| Longest first text of a pair |" in card and "| Longest text |" in card
    assert "| Ranking head | newly initialised, never trained: fine-tune before use |" in card
    assert 'run = pipeline("text-ranking", model="me/ranker")' in card
    assert modelcard.default_widget("text-ranking")[0].keys() == {"text", "example_title"}


def test_the_command_offers_a_new_rows_task(ranking):
    convert = build_parser(model_options=True)._subparsers._group_actions[0].choices["convert"]
    (task,) = [action for action in convert._actions if action.dest == "task"]
    assert task.choices[len(hf_clusterformer_heads.HEADS) - 1] == "text-ranking"  # the tasks, then the keys
    assert task.choices[-1] == RANKING.key != RANKING.task
    assert hf_clusterformer_heads.architectures_task(["RobertaForRanking"]) == "text-ranking"


def test_rows_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RANKING.task = "other"  # type: ignore[misc]


def test_a_new_row_reaches_the_pipeline_function(ranking):
    from hf_clusterformer import loading

    assert "text-ranking" in loading._whole_text_tasks()
    assert loading._whole_text_tasks()[:3] == ["fill-mask", "text-classification", "token-classification"]
    with pytest.raises(ValueError, match="task must be one of"):
        loading.pipeline(model=None, task="summarization")


def test_a_new_rows_inputs_reach_export(monkeypatch, tmp_path):
    """Export reads a head's input dimensions from its row, not its class: a new head with a row per choice exports
    with a choices dimension, and the runner of its file takes (batch, choices, length) batches of any size and
    refuses (batch, length) ones, naming the dimensions."""
    monkeypatch.setattr(hf_clusterformer_heads, "HEADS", (*hf_clusterformer_heads.HEADS, CHOICE_RANKING))
    monkeypatch.setattr(modeling_clusterformer, ClusterFormerForChoiceRanking.__name__, ClusterFormerForChoiceRanking,
                        raising=False)
    assert export.input_dims(ClusterFormerForChoiceRanking) == ("batch", "choices", "length")
    assert export.input_dims("ClusterFormerForMultipleChoice") == ("batch", "choices", "length")
    assert export.input_dims("ClusterFormerForSequenceClassification") == export.input_dims("ClusterFormerModel") == \
        ("batch", "length")
    model = ClusterFormerForChoiceRanking(tiny_config()).eval()
    program = export.export_program(model)
    runner = export.load_exported(export.write_program(program, tmp_path / "rank.pt2", "torch",
                                                       export.program_metadata(model)))
    assert runner.input_dims == ("batch", "choices", "length")
    examples = [random_example(torch.Generator().manual_seed(row), 2 + row, 9 + 7 * row) for row in range(3)]
    ids, mask = pad_batch(examples)
    ids, mask = ids.view(1, 3, -1), mask.view(1, 3, -1)  # one example of three choices (traced with two)
    with torch.no_grad():
        torch.testing.assert_close(runner(ids, mask)["logits"], model(input_ids=ids, attention_mask=mask).logits,
                                   atol=1e-4, rtol=0)
    with pytest.raises(export.ExportError, match=r"input_ids must be \(batch, choices, length\) for this "
                                                 "ClusterFormerForChoiceRanking"):
        runner(ids[0], mask[0])
