"""The heads beside QA (masked LM, sequence / token classification, multiple choice): in one window they equal
RoBERTa's heads, they load RoBERTa checkpoints 1:1 and BERT ones through `convert_checkpoint`, the Auto classes, the
fill-mask / text-classification / token-classification pipelines over 10k tokens in one pass, and saved folders
loading where the plugin cannot be imported."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import pad_batch, pair_encoding, random_example, roberta_twin, single_text, tiny_config
from remote_code_helpers import HIDE_PACKAGE, OFFLINE, SENTENCES
from support.hub_fixtures import run_with_endpoint
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertTokenizerFast,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaForMultipleChoice,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    pipeline,
)

import hf_clusterformer  # noqa: F401  (registers the Auto classes)
from hf_clusterformer import (
    ClusterFormerForMaskedLM,
    ClusterFormerForMultipleChoice,
    ClusterFormerForSequenceClassification,
    ClusterFormerForTokenClassification,
)
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.data.tokenizer import build_tokenizer

#: (our head, RoBERTa's, the Auto class, BERT's) by `convert_checkpoint` task.
HEADS = {
    "mlm": (ClusterFormerForMaskedLM, RobertaForMaskedLM, AutoModelForMaskedLM, BertForMaskedLM),
    "sequence-classification": (ClusterFormerForSequenceClassification, RobertaForSequenceClassification,
                                AutoModelForSequenceClassification, BertForSequenceClassification),
    "token-classification": (ClusterFormerForTokenClassification, RobertaForTokenClassification,
                             AutoModelForTokenClassification, BertForTokenClassification),
    "multiple-choice": (ClusterFormerForMultipleChoice, RobertaForMultipleChoice, AutoModelForMultipleChoice,
                        BertForMultipleChoice),
}


def head_inputs(task: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A right-padded batch of two single texts (two examples of three choices, question + option as the prefix, for
    multiple choice), each within one window of `tiny_config`."""
    if task != "multiple-choice":
        ids, mask = pad_batch([single_text(generator, 9), single_text(generator, 14)])
        return {"input_ids": ids, "attention_mask": mask}
    choices = [random_example(generator, 2 + i % 3, 8 + i) for i in range(6)]
    ids, mask = pad_batch(choices)
    return {"input_ids": ids.view(2, 3, -1), "attention_mask": mask.view(2, 3, -1)}


def head_labels(task: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    ids = inputs["input_ids"]
    if task in ("mlm", "token-classification"):
        labels = ids.remainder(3 if task == "token-classification" else 100)
        return labels.masked_fill(inputs["attention_mask"] == 0, -100)
    return torch.tensor([2, 1]) if task == "sequence-classification" else torch.tensor([0, 2])


# ----------------------------------------------------------------------------------------------------------------
# Heads
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", list(HEADS))
def test_heads_in_one_window_equal_robertas(task):
    ours_class, roberta_class, _, _ = HEADS[task]
    config = tiny_config(cluster_layers=[], num_labels=3)
    torch.manual_seed(0)
    ours = ours_class(config).eval()
    # its own head class, with RoBERTa's parameter names (loaded strictly below)
    assert not isinstance(ours, roberta_class)
    roberta = roberta_class(roberta_twin(config)).eval()
    roberta.load_state_dict(ours.state_dict())
    inputs = head_inputs(task, torch.Generator().manual_seed(7))
    labels = head_labels(task, inputs)
    with torch.no_grad():
        a, b = ours(**inputs, labels=labels), roberta(**inputs, labels=labels)
    logits_a, logits_b = a.logits, b.logits
    if task in ("mlm", "token-classification"):
        real = inputs["attention_mask"].bool()
        logits_a, logits_b = logits_a[real], logits_b[real]
    torch.testing.assert_close(logits_a, logits_b, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.loss, b.loss, atol=1e-5, rtol=0)


def test_masked_lm_decoder_is_tied_and_logits_cover_every_token():
    model = ClusterFormerForMaskedLM(tiny_config())
    assert model.lm_head.decoder.weight is model.roberta.embeddings.word_embeddings.weight
    assert model.get_output_embeddings() is model.lm_head.decoder
    ids = torch.tensor([single_text(torch.Generator().manual_seed(8), 300)])
    out = model(ids, labels=ids)
    assert out.logits.shape == (1, 302, 100) and torch.isfinite(out.loss)
    out.loss.backward()
    assert model.roberta.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("task", list(HEADS))
def test_heads_load_roberta_checkpoints_one_to_one(task, tmp_path):
    ours_class, roberta_class, _, _ = HEADS[task]
    config = tiny_config(cluster_layers=[], num_labels=3)
    torch.manual_seed(1)
    roberta = roberta_class(roberta_twin(config)).eval()
    roberta.save_pretrained(tmp_path / "roberta")
    options = dict(window_size=16, window_stride=12, max_question_length=8, num_clusters=8)
    model, info = ours_class.from_pretrained(
        tmp_path / "roberta", cluster_layers=[2], output_loading_info=True, **options
    )
    # a pretrained encoder's global layer is window_cluster: its routed projection starts at zero, by design
    assert model.config.layer_kinds[2] == "window_cluster"
    assert set(info["missing_keys"]) == {
        f"roberta.encoder.layer.2.{name}" for name in ("router.centroids", "router.fitted", "routed_output.weight",
                                                       "routed_output.bias")
    }
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    same = ours_class.from_pretrained(tmp_path / "roberta", cluster_layers=[], **options).eval()
    inputs = head_inputs(task, torch.Generator().manual_seed(9))
    with torch.no_grad():
        theirs = roberta(**inputs).logits
        for ours in (same, model.eval()):  # the sliding model, and the default one as loaded: RoBERTa's logits
            a, b = ours(**inputs).logits, theirs
            if task in ("mlm", "token-classification"):
                real = inputs["attention_mask"].bool()
                a, b = a[real], b[real]
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("task", list(HEADS))
def test_auto_classes_and_saved_folders(task, tmp_path):
    ours_class, _, auto_class, _ = HEADS[task]
    model = auto_class.from_config(tiny_config(num_labels=3)).eval()
    assert type(model) is ours_class
    model.save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map[auto_class.__name__] == f"modeling_clusterformer.{ours_class.__name__}"
    assert (tmp_path / "modeling_clusterformer.py").is_file()
    loaded = auto_class.from_pretrained(tmp_path).eval()
    inputs = head_inputs(task, torch.Generator().manual_seed(10))
    with torch.no_grad():
        # equal up to the last bits: weights read from a file may sit differently in memory than freshly initialised
        # ones, which can change the summation order of a kernel (seen for multiple choice's (B * C) rows)
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, atol=1e-7, rtol=0)


def test_multiple_choice_windows_the_context_with_question_and_option_as_prefix():
    """A long context: the choices differ only in their option, so only the prefix of every window tells them apart."""
    torch.manual_seed(0)
    model = ClusterFormerForMultipleChoice(tiny_config()).eval()
    generator = torch.Generator().manual_seed(11)
    context = torch.randint(4, 100, (200,), generator=generator).tolist()
    choices = [pair_encoding([7, 8, option], context) for option in (20, 21, 22)]
    ids = torch.tensor([choices])
    with torch.no_grad():
        out = model(ids, labels=torch.tensor([1]), output_cluster_assignments=True)
        alone = [model.roberta(torch.tensor([c])).pooler_output for c in choices]
    assert out.logits.shape == (1, 3) and len(set(out.logits[0].tolist())) == 3
    expected = model.classifier(torch.cat(alone)).view(1, 3)
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=0)
    assert out.window_token_index.shape[0] == 3 and torch.isfinite(out.loss)


# ----------------------------------------------------------------------------------------------------------------
# Pipelines over 10k tokens
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(SENTENCES * 4, vocab_size=300)


def long_text(tokenizer, tokens: int = 10_000) -> str:
    text, count = [], 0
    while count < tokens:
        text.append(SENTENCES[len(text) % 3])
        count += len(tokenizer(text[-1], add_special_tokens=False)["input_ids"]) + 1
    return " ".join(text)


class ForwardLengths:
    """The input lengths of every forward call of a model."""

    def __init__(self, model):
        self.lengths: list[int] = []
        model.register_forward_pre_hook(
            lambda module, args, kwargs: self.lengths.append(kwargs["input_ids"].shape[-1]), with_kwargs=True
        )


@pytest.mark.parametrize("task", ["fill-mask", "text-classification", "token-classification"])
def test_pipelines_take_10k_tokens_in_one_pass(task, tokenizer):
    head = {"fill-mask": ClusterFormerForMaskedLM, "text-classification": ClusterFormerForSequenceClassification,
            "token-classification": ClusterFormerForTokenClassification}[task]
    labels = {0: "PLACE", 1: "PERSON", 2: "OTHER"}
    torch.manual_seed(0)
    model = head(tiny_config(vocab_size=len(tokenizer), window_size=64, window_stride=56, max_position_embeddings=80,
                             num_clusters=32, max_context_length=16384, id2label=labels)).eval()
    calls = ForwardLengths(model)
    run = pipeline(task, model=model, tokenizer=tokenizer, device="cpu")
    text = long_text(tokenizer)
    length = len(tokenizer(text)["input_ids"])
    assert length > 10_000
    if task == "fill-mask":
        masked = text[: -len(" bridge.")] + " <mask>."
        result = run(masked, top_k=3)
        assert len(result) == 3 and all(r["sequence"].startswith(text[:100]) for r in result)
        length = len(tokenizer(masked)["input_ids"])
    elif task == "text-classification":
        result = run(text, top_k=None)
        assert sorted(r["label"] for r in result) == sorted(labels.values())
        assert sum(r["score"] for r in result) == pytest.approx(1.0)
    else:
        result = run(text, ignore_labels=[])
        assert len(result) == length - 2  # every token but <s> and </s>
        assert result[-1]["end"] == len(text)
    assert calls.lengths == [length]


# ----------------------------------------------------------------------------------------------------------------
# Saved folders without the plugin; conversion
# ----------------------------------------------------------------------------------------------------------------

LOAD_HEADS = HIDE_PACKAGE + """
import json
import torch
import transformers
from safetensors.torch import load_file

torch.set_num_threads(1)
results = {}
for entry in json.loads(sys.argv[1]):
    ref = load_file(entry["folder"] + "/reference.safetensors")
    model = getattr(transformers, entry["auto"]).from_pretrained(entry["folder"], trust_remote_code=True).eval()
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"]).logits
    equal = bool(torch.allclose(logits, ref["logits"], atol=1e-7, rtol=0))
    results[entry["auto"]] = [type(model).__module__, type(model).__name__, equal]
results["plugin_modules"] = sorted(m for m in sys.modules if m.startswith("hf_clusterformer"))
print(json.dumps(results))
"""


def test_saved_heads_load_without_the_package(tmp_path):
    from safetensors.torch import save_file

    entries = []
    for task, (head, _, auto_class, _) in HEADS.items():
        torch.manual_seed(0)
        model = head(tiny_config(num_labels=3)).eval()
        folder = tmp_path / task
        model.save_pretrained(folder)  # a plain save: auto_map and the code files come with it
        inputs = head_inputs(task, torch.Generator().manual_seed(12))
        with torch.no_grad():
            logits = model(**inputs).logits
        save_file({**inputs, "logits": logits}, folder / "reference.safetensors")
        entries.append({"folder": str(folder), "auto": auto_class.__name__})
    proc = run_with_endpoint(
        LOAD_HEADS, OFFLINE, tmp_path / "home", {"HF_HUB_OFFLINE": "1"}, args=[json.dumps(entries)]
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result.pop("plugin_modules") == []
    for task, (head, _, auto_class, _) in HEADS.items():
        module, name, equal = result[auto_class.__name__]
        assert module.startswith("transformers_modules.") and name == head.__name__ and equal, (task, result)


def bert_source(tmp_path, task: str):
    """A tiny random BERT checkpoint with the ``task`` head and a WordPiece tokenizer."""
    words = sorted({w.strip(".,?").lower() for s in SENTENCES for w in s.split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)})
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    torch.manual_seed(2)
    model = HEADS[task][3](config).eval()
    with torch.no_grad():  # BERT's heads start with zero biases: give them values so a wrong mapping shows
        for name, parameter in model.named_parameters():
            if not name.startswith("bert.encoder"):
                parameter.add_(torch.randn_like(parameter) * 0.1)
    source = tmp_path / f"bert-{task}"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    return model, tokenizer, source


@pytest.mark.parametrize("task", list(HEADS))
def test_bert_heads_after_convert_equal_bert(task, tmp_path):
    bert, tokenizer, source = bert_source(tmp_path, task)
    converted = convert_checkpoint(source, tmp_path / "converted", task=task, cluster_layers=[], window_size=40,
                                   window_stride=32, max_question_length=16)
    assert converted.newly_initialized == []
    model = HEADS[task][2].from_pretrained(converted.path).eval()
    assert type(model) is HEADS[task][0]
    if task == "multiple-choice":
        encoding = tokenizer(["Where does Melka live? Tarsk", "Where does Melka live? river"], [SENTENCES[1]] * 2,
                             return_tensors="pt", padding=True)
        encoding = {k: v.unsqueeze(0) for k, v in encoding.items()}
    else:
        encoding = dict(tokenizer(SENTENCES[:2], return_tensors="pt", padding=True))
    with torch.no_grad():
        theirs = bert(**encoding).logits
        ours = model(**encoding).logits
        without_types = model(**{k: v for k, v in encoding.items() if k != "token_type_ids"}).logits
    if task in ("mlm", "token-classification"):
        real = encoding["attention_mask"].bool()
        theirs, ours, without_types = theirs[real], ours[real], without_types[real]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    torch.testing.assert_close(without_types, theirs, atol=1e-5, rtol=0)


def test_convert_roberta_masked_lm_keeps_its_head_and_refuses_unknown_tasks(tmp_path, tokenizer):
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=80)
    torch.manual_seed(3)
    roberta = RobertaForMaskedLM(config).eval()
    roberta.save_pretrained(tmp_path / "roberta")
    tokenizer.save_pretrained(tmp_path / "roberta")
    converted = convert_checkpoint(tmp_path / "roberta", tmp_path / "converted", task="mlm", cluster_layers=[1],
                                   num_clusters=4, window_size=48, window_stride=40, max_question_length=16)
    assert converted.newly_initialized == []
    config_file = json.loads((converted.path / "config.json").read_text())
    assert config_file["architectures"] == ["ClusterFormerForMaskedLM"]
    assert config_file["auto_map"]["AutoModelForMaskedLM"] == "modeling_clusterformer.ClusterFormerForMaskedLM"
    model = AutoModelForMaskedLM.from_pretrained(converted.path)
    assert torch.equal(model.lm_head.dense.weight, roberta.lm_head.dense.weight)
    assert torch.equal(model.lm_head.bias, roberta.lm_head.bias)
    with pytest.raises(ValueError, match="task must be one of"):
        convert_checkpoint(tmp_path / "roberta", tmp_path / "other", task="summarization")


def test_masked_lm_reads_a_text_with_a_separator_inside_as_one_text():
    """Masking may replace a token by ``</s>``: the MLM head still windows the row as one text (``auto`` would read
    a pair), while the classification heads read ``tokenizer(text, text_pair)`` rows as pairs."""
    torch.manual_seed(0)
    model = ClusterFormerForMaskedLM(tiny_config()).eval()
    ids = single_text(torch.Generator().manual_seed(13), 60)
    ids[5] = 2  # a random replacement that drew </s>
    with torch.no_grad():
        default = model(torch.tensor([ids])).logits
        torch.testing.assert_close(default, model(torch.tensor([ids]), input_format="single").logits, atol=0, rtol=0)
        assert not torch.allclose(default, model(torch.tensor([ids]), input_format="auto").logits, atol=1e-3)
    assert (ClusterFormerForSequenceClassification.input_format, ClusterFormerForTokenClassification.input_format,
            ClusterFormerForMultipleChoice.input_format) == ("auto", "auto", "pair")


def test_token_losses_take_the_trainers_count_of_labelled_tokens():
    """With ``num_items_in_batch`` (gradient accumulation in the Trainer) the MLM loss is the sum over that count."""
    torch.manual_seed(0)
    model = ClusterFormerForMaskedLM(tiny_config()).eval()
    inputs = head_inputs("mlm", torch.Generator().manual_seed(14))
    labels = head_labels("mlm", inputs)
    with torch.no_grad():
        mean = model(**inputs, labels=labels).loss
        summed = model(**inputs, labels=labels, num_items_in_batch=40).loss
    torch.testing.assert_close(summed, mean * int((labels != -100).sum()) / 40)
