"""The long-context question-answering pipeline: invariants of its answers, scores against brute force, batching,
one forward pass per example, impossible answers, long answers, registration and input errors.

A random tiny model gives meaningless answers, so the tests check structure and exact relations to the logits.
"""

from __future__ import annotations

import itertools
import logging
import math
import re

import pytest
import torch
import transformers
from helpers import tiny_config, transformers_warnings
from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS

import hf_clusterformer  # noqa: F401  (registers the Auto classes)
from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.data.tokenizer import build_tokenizer
from hf_clusterformer.loading import pipeline as make_pipeline
from hf_clusterformer.loading import register_pipeline
from hf_clusterformer.pipeline import (
    MAX_ANSWER_TOKENS,
    ClusterFormerQuestionAnsweringPipeline,
    rank_spans,
    required_model_max_length,
)

SENTENCES = [
    "Zorvan lives with Melka in the old house by the river.",
    "Melka lives in Tarsk, a town known for its bridge.",
    "The market was quiet that morning and the road was wet.",
    "Where does Zorvan live? Who lives in Tarsk? When was the bridge built?",
    "Many traders waited near the harbour for the evening boat.",
]
QUESTION = "Where does Zorvan live?"
CONTEXT = " ".join(SENTENCES[:3] + SENTENCES[4:])



@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(SENTENCES * 4, vocab_size=300)


def _model(tokenizer, **overrides) -> ClusterFormerForQuestionAnswering:
    torch.manual_seed(0)
    config = tiny_config(vocab_size=len(tokenizer), max_context_length=8192, max_question_length=16, **overrides)
    return ClusterFormerForQuestionAnswering(config).eval()


@pytest.fixture(scope="module")
def model(tokenizer):
    return _model(tokenizer)


@pytest.fixture(scope="module")
def qa(model, tokenizer):
    return ClusterFormerQuestionAnsweringPipeline(model=model, tokenizer=tokenizer, device="cpu")


def _logits(model, tokenizer, question, context):
    """Start/end logits (T,), answerable logits and encoding of one example, straight from the model."""
    encoding = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=encoding["input_ids"], attention_mask=encoding["attention_mask"])
    return out, encoding


def _span_logits(model, tokenizer, question, context, max_answer_len):
    """Every valid span by enumeration: ({(char_start, char_end): start + end logit}, model output, context
    offsets)."""
    out, encoding = _logits(model, tokenizer, question, context)
    start, end = out.start_logits[0].double(), out.end_logits[0].double()
    offsets = encoding["offset_mapping"][0].tolist()
    sequence_ids = encoding.sequence_ids(0)
    ids = encoding["input_ids"][0].tolist()
    special = set(tokenizer.all_special_ids)
    ok = [s == 1 and ids[i] not in special and context[offsets[i][0]:offsets[i][1]].replace("\ufeff", "").strip() != ""
          for i, s in enumerate(sequence_ids)]
    spans = {
        (offsets[i][0], offsets[j][1]): float(start[i] + end[j])
        for i, j in itertools.product(range(len(ids)), repeat=2)
        if ok[i] and ok[j] and i <= j < i + max_answer_len
    }
    return spans, out, [o for o, keep in zip(offsets, ok) if keep]


def _softmax(logits: dict, extra: list[float] = ()) -> dict:
    normaliser = float(torch.logsumexp(torch.tensor([*logits.values(), *extra], dtype=torch.float64), 0))
    return {key: math.exp(value - normaliser) for key, value in logits.items()}


def _assert_valid_answer(answer, context):
    assert set(answer) == {"score", "start", "end", "answer"}
    assert 0 <= answer["start"] < answer["end"] <= len(context)
    assert answer["answer"] == context[answer["start"] : answer["end"]]
    assert 0.0 <= answer["score"] <= 1.0


def test_answers_are_context_spans_with_sorted_scores(qa):
    answers = qa(question=QUESTION, context=CONTEXT, top_k=7)
    assert isinstance(answers, list) and len(answers) == 7
    for answer in answers:
        _assert_valid_answer(answer, CONTEXT)
    scores = [a["score"] for a in answers]
    assert scores == sorted(scores, reverse=True)
    assert len({(a["start"], a["end"]) for a in answers}) == 7
    best = qa(question=QUESTION, context=CONTEXT)
    assert isinstance(best, dict) and best == answers[0]


@pytest.mark.parametrize("max_answer_len", [1, 3, 15, 30])
def test_scores_match_brute_force_softmax_over_valid_spans(qa, model, tokenizer, max_answer_len):
    logits, _, context_offsets = _span_logits(model, tokenizer, QUESTION, CONTEXT, max_answer_len)
    expected = _softmax(logits)
    answers = qa(question=QUESTION, context=CONTEXT, top_k=10_000, max_answer_len=max_answer_len)
    assert len(answers) == len(expected)  # every valid span, none longer than max_answer_len
    got = {(a["start"], a["end"]): a["score"] for a in answers}
    assert got.keys() == expected.keys()
    for span, probability in expected.items():
        assert got[span] == pytest.approx(probability, rel=1e-4, abs=1e-9)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-6)
    for answer in answers:
        inside = [o for o in context_offsets if answer["start"] <= o[0] and o[1] <= answer["end"]]
        assert 1 <= len(inside) <= max_answer_len


def test_max_answer_length_alias_and_validation(qa):
    assert qa(question=QUESTION, context=CONTEXT, top_k=50, max_answer_length=2) == qa(
        question=QUESTION, context=CONTEXT, top_k=50, max_answer_len=2
    )
    with pytest.raises(ValueError, match="max_answer_len"):
        qa(question=QUESTION, context=CONTEXT, max_answer_len=0)
    with pytest.raises(ValueError, match="top_k"):
        qa(question=QUESTION, context=CONTEXT, top_k=0)


def test_batches_equal_single_calls(qa):
    examples = [
        {"question": QUESTION, "context": CONTEXT},
        {"question": "Who lives in Tarsk?", "context": SENTENCES[1]},
        {"question": "When was it?", "context": " ".join(SENTENCES * 3)},
    ]
    single = [qa(example, top_k=3) for example in examples]
    for batch_size in (1, 2, 3):
        batched = qa(examples, top_k=3, batch_size=batch_size)
        assert len(batched) == len(examples)
        for got, want in zip(batched, single):
            spans = [(a["start"], a["end"], a["answer"]) for a in want]
            assert [(a["start"], a["end"], a["answer"]) for a in got] == spans
            assert [a["score"] for a in got] == pytest.approx([a["score"] for a in want], rel=1e-4, abs=1e-7)
    # question/context lists, a single question broadcast over contexts
    assert qa(question=[e["question"] for e in examples], context=[e["context"] for e in examples], top_k=3) == single
    contexts = [e["context"] for e in examples]
    assert qa(question=QUESTION, context=contexts) == [qa(question=QUESTION, context=c) for c in contexts]
    assert qa(QUESTION, CONTEXT) == qa({"question": QUESTION, "context": CONTEXT})




def test_long_context_takes_one_forward_pass_and_no_length_warning(model):
    context = " ".join(SENTENCES[i % 5] for i in range(170))
    plain = build_tokenizer(SENTENCES * 4, vocab_size=300)
    plain.model_max_length = 512  # like a RoBERTa tokenizer
    with transformers_warnings() as records:
        encoded = plain(QUESTION, context)["input_ids"]
    assert len(encoded) > 5000
    assert any("longer than the specified maximum sequence length" in m for m in records)

    tokenizer = build_tokenizer(SENTENCES * 4, vocab_size=300)
    tokenizer.model_max_length = 512
    qa = ClusterFormerQuestionAnsweringPipeline(model=model, tokenizer=tokenizer, device="cpu")
    calls = []
    handle = model.register_forward_hook(
        lambda module, args, kwargs, output: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        with transformers_warnings() as records:
            answers = qa(question=QUESTION, context=context, top_k=3)
            batch = qa([{"question": QUESTION, "context": context}] * 2, batch_size=1)
            assert tokenizer(QUESTION, context)["input_ids"] == encoded
    finally:
        handle.remove()
    assert calls == [(1, len(encoded))] * 3  # the whole context in one pass, one pass per example
    assert not [m for m in records if "sequence length" in m], records
    for answer in answers:
        _assert_valid_answer(answer, context)
    assert batch == [answers[0], answers[0]]


def test_impossible_answer_from_the_answerability_head(tokenizer):
    model = _model(tokenizer, use_answerability_head=True)
    qa = ClusterFormerQuestionAnsweringPipeline(model=model, tokenizer=tokenizer, device="cpu")
    logits, out, _ = _span_logits(model, tokenizer, QUESTION, CONTEXT, MAX_ANSWER_TOKENS)
    p_none, p_answer = torch.softmax(out.answerable_logits[0].double(), 0).tolist()
    expected = _softmax(logits)

    answers = qa(question=QUESTION, context=CONTEXT, top_k=10_000, handle_impossible_answer=True)
    empty = [a for a in answers if a["answer"] == ""]
    assert empty == [{"score": pytest.approx(p_none, rel=1e-5), "start": 0, "end": 0, "answer": ""}]
    spans = {(a["start"], a["end"]): a["score"] for a in answers if a["answer"]}
    for span, probability in expected.items():
        assert spans[span] == pytest.approx(p_answer * probability, rel=1e-4, abs=1e-9)
    assert sum(a["score"] for a in answers) == pytest.approx(1.0, abs=1e-6)
    scores = [a["score"] for a in answers]
    assert scores == sorted(scores, reverse=True)
    # without handle_impossible_answer the scores are P(span | answer)
    best = qa(question=QUESTION, context=CONTEXT)
    assert best["score"] == pytest.approx(max(expected.values()), rel=1e-4)
    # batched, the answerability logits are split per example like the span logits
    examples = [{"question": QUESTION, "context": CONTEXT}, {"question": "Who?", "context": SENTENCES[1]}]
    single = [qa(e, handle_impossible_answer=True, top_k=2) for e in examples]
    batched = qa(examples, handle_impossible_answer=True, top_k=2, batch_size=2)
    single_spans = [[(a["start"], a["end"]) for a in b] for b in single]
    assert [[(a["start"], a["end"]) for a in b] for b in batched] == single_spans
    assert [a["score"] for b in batched for a in b] == pytest.approx([a["score"] for b in single for a in b], rel=1e-4)


def test_impossible_answer_without_head_uses_the_start_token(qa, tokenizer):
    """A Cluster-Former model without the answerability head refuses it; a plain RoBERTa QA model scores the empty
    answer by its ``<s>`` token (the SQuAD 2.0 convention)."""
    with pytest.raises(ValueError, match="needs the answerability head"):
        qa(question=QUESTION, context=CONTEXT, handle_impossible_answer=True)
    from transformers import RobertaConfig, RobertaForQuestionAnswering

    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=514, pad_token_id=1, type_vocab_size=1)
    torch.manual_seed(0)
    model = RobertaForQuestionAnswering(config).eval()
    qa = make_pipeline(model=model, tokenizer=tokenizer, device="cpu")
    logits, out, _ = _span_logits(model, tokenizer, QUESTION, CONTEXT, MAX_ANSWER_TOKENS)
    null = float(out.start_logits[0, 0] + out.end_logits[0, 0])
    expected = _softmax({**logits, "null": null})
    answers = qa(question=QUESTION, context=CONTEXT, top_k=10_000, handle_impossible_answer=True)
    got = {(a["start"], a["end"]) if a["answer"] else "null": a["score"] for a in answers}
    assert len(answers) == len(got) == len(expected)
    for key, probability in expected.items():
        assert got[key] == pytest.approx(probability, rel=1e-4, abs=1e-9)


def test_rank_spans_puts_the_empty_answer_in_rank_order():
    start = torch.tensor([5.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    end = torch.tensor([5.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    candidate = torch.tensor([False, True, True, True])
    ranked = rank_spans(start, end, candidate, max_answer_len=2, top_k=2, handle_impossible_answer=True)
    assert ranked[0][1:] == (-1, -1) and ranked[0][0] > 0.99
    assert ranked[1][1:] == (2, 3)
    plain = rank_spans(start, end, candidate, max_answer_len=2, top_k=10)
    assert [r[1:] for r in plain][:1] == [(2, 3)] and len(plain) == 5  # spans (1,1) (2,2) (3,3) (1,2) (2,3)
    with pytest.raises(ValueError, match="candidate"):
        rank_spans(start, end, torch.zeros(4, dtype=torch.bool))


def test_long_answers_are_passages_ranked_by_their_start_token(qa, model, tokenizer):
    passages = ["<p> " + s for s in SENTENCES]
    context = "\n".join(passages)
    result = qa(question=QUESTION, context=context, long_answer=True, long_answer_top_k=10, top_k=2)
    assert set(result) == {"short_answers", "long_answers"} and len(result["short_answers"]) == 2
    long_answers = result["long_answers"]
    assert len(long_answers) == len(passages)
    assert sorted(a["answer"] for a in long_answers) == sorted(passages)
    for answer in long_answers:
        assert answer["answer"] == context[answer["start"] : answer["end"]] == passages[answer["index"]]
    assert sum(a["score"] for a in long_answers) == pytest.approx(1.0, abs=1e-6)
    # scores are the softmax of the start logits at the <p> tokens
    out, encoding = _logits(model, tokenizer, QUESTION, context)
    marks = (encoding["input_ids"][0] == tokenizer.convert_tokens_to_ids("<p>")).nonzero().flatten()
    expected = torch.softmax(out.start_logits[0, marks].double(), 0).tolist()
    assert [a["score"] for a in sorted(long_answers, key=lambda a: a["index"])] == pytest.approx(expected, rel=1e-5)
    assert [a["index"] for a in qa(question=QUESTION, context=context, long_answer=True)["long_answers"]] == [
        max(range(len(expected)), key=expected.__getitem__)
    ]
    examples = [{"question": QUESTION, "context": context}, {"question": "Who?", "context": "\n".join(passages[:2])}]
    single = [qa(e, long_answer=True, long_answer_top_k=3) for e in examples]
    batched = qa(examples, long_answer=True, long_answer_top_k=3, batch_size=2)
    for got, want in zip(batched, single):
        assert [a["index"] for a in got["long_answers"]] == [a["index"] for a in want["long_answers"]]
        assert [a["answer"] for a in got["short_answers"]] == [a["answer"] for a in want["short_answers"]]


def test_long_answers_split_on_blank_lines_without_passage_tokens(qa):
    paragraphs = ["  " + SENTENCES[0], SENTENCES[1] + " " + SENTENCES[2], SENTENCES[4] + "  "]
    context = "\n\n".join(paragraphs) + "\n \n"
    result = qa(question=QUESTION, context=context, long_answer=True, long_answer_top_k=5)
    texts = {a["index"]: a["answer"] for a in result["long_answers"]}
    assert texts == {i: p.strip() for i, p in enumerate(paragraphs)}
    for answer in result["long_answers"]:
        assert context[answer["start"] : answer["end"]] == answer["answer"]


def test_input_errors_are_clear(qa, tokenizer):
    with pytest.raises(ValueError, match="context is empty"):
        qa(question=QUESTION, context="   ")
    with pytest.raises(ValueError, match="question is empty"):
        qa(question="", context=CONTEXT)
    with pytest.raises(ValueError, match="max_question_length"):
        qa(question=" ".join(SENTENCES), context=CONTEXT)
    with pytest.raises(ValueError, match="'question' and 'context'"):
        qa({"query": QUESTION, "context": CONTEXT})
    with pytest.raises(TypeError, match="doc_stride"):
        qa(question=QUESTION, context=CONTEXT, doc_stride=128)
    with pytest.raises(TypeError, match="Unknown"):
        qa(question=QUESTION, context=CONTEXT, beam_size=3)
    with pytest.raises(ValueError, match="3 questions for 2 contexts"):
        qa(question=[QUESTION] * 3, context=[CONTEXT] * 2)


def test_too_long_context_is_refused(tokenizer):
    model = _model(tokenizer)
    model.config.max_context_length = 50
    qa = ClusterFormerQuestionAnsweringPipeline(model=model, tokenizer=tokenizer, device="cpu")
    with pytest.raises(ValueError, match="max_context_length"):
        qa(question=QUESTION, context=" ".join(SENTENCES * 4))


def test_tokenizer_limit_is_raised_to_the_model_limit(model, tokenizer):
    small = build_tokenizer(SENTENCES * 4, vocab_size=300)
    small.model_max_length = 512
    ClusterFormerQuestionAnsweringPipeline(model=model, tokenizer=small, device="cpu")
    assert small.model_max_length == required_model_max_length(model.config) == 16 + 8192 + 4


def test_the_import_leaves_the_task_list_alone_until_registration_is_asked():
    """``import hf_clusterformer`` registers only the package's own names; `register_pipeline` (or
    `hf_clusterformer.pipeline`) takes ``question-answering`` off transformers' removed tasks. In a fresh process."""
    import json
    import subprocess
    import sys

    code = """
import json
from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS
before = ("question-answering" in REMOVED_TASKS, "question-answering" in PIPELINE_REGISTRY.supported_tasks)
import hf_clusterformer
after_import = ("question-answering" in REMOVED_TASKS, "question-answering" in PIPELINE_REGISTRY.supported_tasks)
hf_clusterformer.register_pipeline()
impl = PIPELINE_REGISTRY.supported_tasks["question-answering"]["impl"]
registered = ("question-answering" in REMOVED_TASKS, impl is hf_clusterformer.ClusterFormerQuestionAnsweringPipeline)
print(json.dumps([before, after_import, registered]))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after_import, registered = json.loads(result.stdout.strip().splitlines()[-1])
    assert after_import == before and before[0] is True
    assert registered == [False, True]


def test_registered_as_question_answering_task(model, tokenizer, tmp_path):
    register_pipeline()
    register_pipeline()  # idempotent
    assert "question-answering" not in REMOVED_TASKS
    assert PIPELINE_REGISTRY.supported_tasks["question-answering"]["impl"] is ClusterFormerQuestionAnsweringPipeline
    qa = transformers.pipeline("question-answering", model=model, tokenizer=tokenizer, device="cpu")
    assert type(qa) is ClusterFormerQuestionAnsweringPipeline
    reference = qa(question=QUESTION, context=CONTEXT, top_k=3)

    # A pipeline saved to disk names itself in config.json and loads back through the factory, no remote code.
    qa.save_pretrained(tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert config.custom_pipelines["question-answering"]["impl"] == "pipeline.ClusterFormerQuestionAnsweringPipeline"
    assert (tmp_path / "pipeline.py").is_file() and (tmp_path / "modeling_clusterformer.py").is_file()
    loaded = make_pipeline(model=str(tmp_path), device="cpu", top_k=3)
    assert type(loaded) is ClusterFormerQuestionAnsweringPipeline
    assert type(loaded.model) is ClusterFormerForQuestionAnswering
    assert loaded(question=QUESTION, context=CONTEXT) == reference


def test_plain_roberta_model_gets_its_position_limit():
    from transformers import RobertaConfig, RobertaForQuestionAnswering

    tokenizer = build_tokenizer(SENTENCES * 4, vocab_size=300)
    tokenizer.model_max_length = 1_000_000  # as when loading with model_max_length=1e6 for long contexts
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=66, pad_token_id=1, type_vocab_size=1)
    torch.manual_seed(0)
    qa = make_pipeline(model=RobertaForQuestionAnswering(config).eval(), tokenizer=tokenizer, device="cpu")
    answer = qa(question=QUESTION, context=SENTENCES[1])  # fits the 64 positions after the padding index
    assert answer["answer"] == SENTENCES[1][answer["start"] : answer["end"]]
    with pytest.raises(ValueError, match=r"more than this roberta model takes \(64\).*Cluster-Former"):
        qa(question=QUESTION, context=" ".join(SENTENCES * 3))


def test_left_padding_tokenizer_is_used_right_padded(model, tokenizer, qa):
    left = build_tokenizer(SENTENCES * 4, vocab_size=300)
    left.padding_side = "left"
    padded = ClusterFormerQuestionAnsweringPipeline(model=model, tokenizer=left, device="cpu")
    examples = [{"question": QUESTION, "context": CONTEXT}, {"question": "Who?", "context": SENTENCES[1]}]
    assert padded(examples, batch_size=2, top_k=2) == qa(examples, batch_size=2, top_k=2)
    assert left.padding_side == "left"  # the caller's tokenizer is left as it was


def test_long_answers_fall_back_to_sentence_groups(tokenizer, caplog):
    model = _model(tokenizer, window_size=24, window_stride=24)
    qa = ClusterFormerQuestionAnsweringPipeline(model=model, tokenizer=tokenizer, device="cpu")
    context = " ".join(SENTENCES[:3] + SENTENCES[4:]) * 2  # no blank line, no passage token
    transformers.logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            result = qa(question=QUESTION, context=context, long_answer=True, long_answer_top_k=20)
    finally:
        transformers.logging.disable_propagation()
    long_answers = sorted(result["long_answers"], key=lambda a: a["index"])
    assert len(long_answers) > 2 and max(a["score"] for a in long_answers) < 1.0
    for answer in long_answers:
        assert answer["answer"] == context[answer["start"] : answer["end"]]
        assert answer["answer"][-1] in ".?" or answer["end"] == len(context.rstrip())  # whole sentences
        if len(re.split(r"(?<=[.?])\s+", answer["answer"])) > 1:  # a longer sentence stands alone
            assert len(tokenizer(answer["answer"], add_special_tokens=False)["input_ids"]) <= 24 + 2
    assert "groups of whole sentences" in caplog.text


def test_the_model_finds_the_question_prefix_the_tokenizer_marks(qa, tokenizer):
    """The pipeline passes no prefix lengths: the model's one rule (`locate_question_prefix` at
    ``config.separator_token_id``) finds the prefix the tokenizer's ``sequence_ids`` mark, for RoBERTa's
    ``<s> Q </s></s> C </s>`` and BERT's template."""
    from transformers import BertTokenizerFast

    from hf_clusterformer.modeling_clusterformer import locate_question_prefix

    assert "question_lengths" not in qa.preprocess({"question": QUESTION, "context": CONTEXT})
    words = sorted({w.strip(".,?").lower() for w in " ".join(SENTENCES).split()})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", ".", ",", "?", *words])}
    bert = BertTokenizerFast(vocab=vocab)
    for encode in (tokenizer, bert):
        encoding = encode(QUESTION, CONTEXT, return_tensors="pt")
        sequence_ids = encoding.sequence_ids(0)
        prefix, question, _ = locate_question_prefix(encoding["input_ids"] == encode.sep_token_id)
        assert int(prefix[0]) == sequence_ids.index(1) and int(question[0]) == sequence_ids.count(0)


def test_align_to_words_widens_answers_to_whole_words_each_once(qa, model, tokenizer):
    """Row: ``align_to_words`` (transformers' QA pipeline parameter) was refused as unknown. With it, an answer
    starting or ending inside a word covers the whole word; spans widened to the same characters are one answer,
    scored by its best span; without it, answers are the tokens' own characters (as before)."""
    spans, _, _ = _span_logits(model, tokenizer, QUESTION, CONTEXT, MAX_ANSWER_TOKENS)
    probability = _softmax(spans)
    words = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", CONTEXT)]

    def widened(a: int, b: int) -> tuple[int, int]:
        return (next(s for s, e in words if s <= a < e or a < s), next(e for s, e in reversed(words) if s < b <= e))

    best: dict = {}
    for (a, b), p in sorted(probability.items(), key=lambda item: -item[1]):
        best.setdefault(widened(a, b), p)
    assert len(best) < len(probability)  # some answers start or end inside a word here
    answers = qa(question=QUESTION, context=CONTEXT, top_k=12, align_to_words=True)
    assert [(a["start"], a["end"]) for a in answers] == list(best)[:12]
    for a in answers:
        assert a["score"] == pytest.approx(best[(a["start"], a["end"])], rel=1e-6)
        assert a["answer"] == CONTEXT[a["start"]:a["end"]]
    plain = qa(question=QUESTION, context=CONTEXT, top_k=12)
    assert plain == qa(question=QUESTION, context=CONTEXT, top_k=12, align_to_words=False)
    assert [(a["start"], a["end"]) for a in plain] == sorted(probability, key=lambda k: -probability[k])[:12]


def test_answers_never_start_or_end_with_white_space_or_a_byte_order_mark(qa):
    """Row: an answer over a file saved with a BOM and Windows line ends could be ``"\\ufeff..."`` or end in
    ``"\\r\\n"``; offsets still index the context as given."""
    context = "\ufeff" + "\r\n".join(SENTENCES) + "\r\n\r\n"
    answers = qa(question=QUESTION, context=context, top_k=10_000)
    assert len(answers) > 100
    for answer in answers:
        _assert_valid_answer(answer, context)
        text = answer["answer"]
        assert text == text.strip() and "\ufeff" not in (text[0], text[-1]), repr(text)
    assert len({(a["start"], a["end"]) for a in answers}) == len(answers)


def test_equal_scores_rank_the_earlier_span_first():
    start = torch.zeros(6, dtype=torch.float64)
    end = torch.zeros(6, dtype=torch.float64)
    candidate = torch.tensor([False, True, True, True, True, True])
    ranked = rank_spans(start, end, candidate, max_answer_len=2, top_k=9)
    assert [(s, e) for _, s, e in ranked] == [(1, 1), (1, 2), (2, 2), (2, 3), (3, 3), (3, 4), (4, 4), (4, 5), (5, 5)]


def test_a_question_naming_a_special_token_is_refused(qa):
    """Row: a question holding the text ``</s>`` was read as ending there (the tokenizer makes it the separator), so
    the rest of it became context, silently."""
    with pytest.raises(ValueError, match=r"^The question holds '</s>', which the tokenizer reads as its special token "
                                         r"'</s>' \(it would end the question there\); remove it"):
        qa(question="Where does </s> Zorvan live?", context=CONTEXT)
    assert qa(question="Where does Zorvan live?", context=CONTEXT + " </s> and more")["answer"]  # context: as given
    with pytest.raises(ValueError, match=r"^The question holds '<mask>', which the tokenizer reads as its special "
                                         r"token '<mask>' \(not as the text it is\); remove it"):
        qa(question="Where does <mask> live?", context=CONTEXT)
