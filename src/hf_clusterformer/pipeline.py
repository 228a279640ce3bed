"""The question-answering pipeline over whole long inputs: one forward pass per (question, context).

`ClusterFormerQuestionAnsweringPipeline` tokenizes ``<s> question </s></s> context </s>`` without splitting the
context (up to ``config.max_context_length`` tokens for Cluster-Former models), runs the model once, and maps the best
start/end token pair back to characters of the context (`rank_spans`). Outputs follow the old transformers pipeline:
``{"score", "start", "end", "answer"}`` (a list when ``top_k > 1``); with ``long_answer=True``, ``{"short_answers":
[...], "long_answers": [...]}``, long answers being whole paragraphs (NQ style, `rank_paragraphs`).

A model whose head was never trained, or whose weights are NaN or inf, is refused (`check_trained`, with the record
of untrained weights in the modeling file), and so is every answer read from NaN or inf logits
(`check_finite_outputs`: weights that turned NaN after the pipeline was built). Registration under transformers'
``question-answering`` task and ``hf_clusterformer.pipeline(...)`` live in `hf_clusterformer.loading`; a
question-answering Hub checkpoint holds this file and maps the task to it in ``custom_pipelines``
(``trust_remote_code=True``), which needs neither.
`use_model_limit` raises a tokenizer's limit to the model's (``config.max_input_length``), for this pipeline and
those of the other heads.

This file is self-contained for the Hub: it imports only torch, transformers and the modeling file.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
import re
from typing import Any

import torch
from transformers import AutoModelForQuestionAnswering, Pipeline
from transformers.utils import logging

try:  # package import
    from .modeling_clusterformer import check_finite_outputs, check_input_lengths, check_trained
except ImportError:  # Hub copy loaded with trust_remote_code
    from modeling_clusterformer import check_finite_outputs, check_input_lengths, check_trained

logger = logging.get_logger(__name__)

TASK = "question-answering"
#: Marks the start of a passage in multi-passage (NQ-style) contexts (the SQuAD multi-passage set writes it).
PASSAGE_TOKEN = "<p>"
#: Longest answer in tokens when the caller gives none: the SQuAD evaluation's (transformers' QA pipeline uses 15);
#: `clusterformer predict` / `evaluate` and `hf_clusterformer.features.postprocess_predictions` take it too.
MAX_ANSWER_TOKENS = 30
#: An answer's edges never hold white space or a byte-order mark (a UTF-8 file's first character may be one).
_EDGES = re.compile(r"[\s\ufeff]*(.*?)[\s\ufeff]*", re.DOTALL)
#: Parameters of the old transformers question-answering pipeline that split contexts; they have no meaning here.
_SPLITTING_PARAMETERS = ("doc_stride", "max_seq_len", "max_question_len", "padding")
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+")


def required_model_max_length(config: Any) -> int | None:
    """Longest pair encoding a Cluster-Former config accepts (``max_input_length``); None for other configs."""
    return getattr(config, "max_input_length", None)


def use_model_limit(tokenizer: Any, config: Any) -> None:
    """Raise ``tokenizer.model_max_length`` (RoBERTa's says 512) to the model's limit, ``config.max_input_length``."""
    needed = required_model_max_length(config)
    if tokenizer is not None and needed is not None and (tokenizer.model_max_length or 0) < needed:
        tokenizer.model_max_length = needed


class ClusterFormerQuestionAnsweringPipeline(Pipeline):
    """Extractive QA that feeds the whole context through one forward pass.

    Call with ``pipe(question=..., context=...)``, ``pipe({"question": ..., "context": ...})``, a list of such
    dicts (optionally with ``batch_size``), or ``pipe(question_list, context_list)``.

    Parameters (at construction or per call):
        top_k (`int`, defaults to 1): answers per example; a dict when 1, else a list sorted by score.
        max_answer_len (`int`, defaults to `MAX_ANSWER_TOKENS`, 30): longest answer in tokens (alias
            ``max_answer_length``). Answers never start or end with white space or a byte-order mark.
        handle_impossible_answer (`bool`, defaults to `False`): allow the empty answer ``""`` (start = end = 0).
            Its score is ``P(no answer)`` from the answerability head (``answerable_logits``); a Cluster-Former
            model without the head is refused. Other models (plain RoBERTa QA) score it by the ``<s>`` token's
            start + end logits (the SQuAD 2.0 convention). With the head, span scores become
            ``P(answer) * P(span | answer)``.
        long_answer (`bool`, defaults to `False`): also rank paragraphs as long answers. Paragraphs start at
            each ``passage_token`` of the context, or are separated by blank lines when it has none; a context
            with neither is cut into groups of whole sentences of at most a window (``config.window_stride``
            tokens, 128 for other models), with a warning. Each is scored by ``start_logits`` at its first token,
            softmaxed over the paragraphs.
        long_answer_top_k (`int`, defaults to 1): long answers per example.
        passage_token (`str`, defaults to ``"<p>"``): token that starts a paragraph.
        align_to_words (`bool`, defaults to `False`): widen an answer that starts or ends inside a word (a sub-word
            token) to the whole word, as transformers' QA pipeline does by default; spans that widen to the same
            characters are one answer, with the best span's score. `False`: the tokens' own characters.

    A model whose QA head was newly initialised and never trained (recorded by ``clusterformer convert``, see
    `mark_untrained`) is refused with `UntrainedModelError`; ``allow_untrained=True`` at construction allows it.

    Batches are right-padded (a left-padding tokenizer is copied with ``padding_side="right"``). Models that are not
    Cluster-Former take inputs up to their position table (512 tokens for RoBERTa); longer ones are refused with
    that limit, as contexts are never split.

    Scores lie in [0, 1]: a softmax over every valid span (context tokens only, start <= end, at most
    ``max_answer_len`` tokens) and the empty answer when allowed.
    """

    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __init__(self, *args, allow_untrained: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        check_trained(self.model, allow_untrained)
        if self.tokenizer is None or not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(
                "ClusterFormerQuestionAnsweringPipeline needs a fast tokenizer (for character offsets); "
                f"got {type(self.tokenizer).__name__}."
            )
        if getattr(self.tokenizer, "padding_side", "right") != "right":  # batches are read as right-padded
            self.tokenizer = copy.copy(self.tokenizer)
            self.tokenizer.padding_side = "right"
        use_model_limit(self.tokenizer, self.model.config)

    # -- calling ---------------------------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        """Answer one example or a batch; see the class docstring for the accepted forms."""
        question = kwargs.pop("question", None)
        context = kwargs.pop("context", None)
        if question is not None or context is not None:
            if args:
                raise TypeError("Give either question=/context= or positional inputs, not both.")
            if question is None or context is None:
                raise ValueError("Both question and context are needed.")
            inputs = _pair_inputs(question, context)
        elif len(args) == 2:
            inputs = _pair_inputs(args[0], args[1])
        elif len(args) == 1:
            inputs = args[0]
            if isinstance(inputs, tuple):
                inputs = list(inputs)
        else:
            raise TypeError("Call the pipeline with question= and context=, or with {'question', 'context'} dicts.")
        return super().__call__(inputs, **kwargs)

    def _sanitize_parameters(
        self, top_k: int | None = None, max_answer_len: int | None = None, max_answer_length: int | None = None,
        handle_impossible_answer: bool | None = None, long_answer: bool | None = None,
        long_answer_top_k: int | None = None, passage_token: str | None = None, align_to_words: bool | None = None,
        **unknown,
    ) -> tuple[dict, dict, dict]:
        splitting = [name for name in unknown if name in _SPLITTING_PARAMETERS]
        if splitting:
            raise TypeError(
                f"{', '.join(splitting)} only applied to pipelines that cut contexts into pieces; this pipeline "
                "feeds the whole context in one forward pass (limit: config.max_context_length tokens)."
            )
        if unknown:
            raise TypeError(f"Unknown question-answering pipeline parameters: {sorted(unknown)}.")
        if max_answer_len is not None and max_answer_length is not None and max_answer_len != max_answer_length:
            raise ValueError("max_answer_len and max_answer_length disagree; give one of them.")
        max_answer_len = max_answer_len if max_answer_len is not None else max_answer_length
        preprocess: dict[str, Any] = {}
        postprocess: dict[str, Any] = {}
        for name, value in (
            ("top_k", top_k), ("max_answer_len", max_answer_len), ("long_answer_top_k", long_answer_top_k)
        ):
            if value is not None:
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise ValueError(f"{name} must be a positive integer, got {value!r}.")
                postprocess[name] = value
        if handle_impossible_answer is not None:
            if handle_impossible_answer:
                self._check_impossible_answer()
            postprocess["handle_impossible_answer"] = bool(handle_impossible_answer)
        if long_answer is not None:
            preprocess["long_answer"] = postprocess["long_answer"] = bool(long_answer)
        if align_to_words is not None:
            postprocess["align_to_words"] = bool(align_to_words)
        if passage_token is not None:
            preprocess["passage_token"] = passage_token
        return preprocess, {}, postprocess

    def _check_impossible_answer(self) -> None:
        """A Cluster-Former model scores "no answer" only with its answerability head; without one,
        ``handle_impossible_answer`` is refused (other models keep the ``<s>`` convention of SQuAD 2.0 checkpoints)."""
        config = self.model.config
        if required_model_max_length(config) is not None and not getattr(config, "use_answerability_head", False):
            raise ValueError(
                "handle_impossible_answer=True needs the answerability head, which this Cluster-Former model lacks "
                "(config.use_answerability_head is False): fine-tune a model with use_answerability_head=True "
                "(--use_answerability_head) on data with unanswerable questions, or leave the option out."
            )

    # -- steps -----------------------------------------------------------------------------------------------------

    def preprocess(self, example: dict, long_answer: bool = False, passage_token: str = PASSAGE_TOKEN) -> dict:
        """Tokenize one ``{"question", "context"}`` pair without truncation: model inputs, each (1, T), and per-token
        metadata for `postprocess`."""
        question, context = _check_example(example)
        encoding = self.tokenizer(
            question, context, return_offsets_mapping=True, truncation=False, verbose=False, return_tensors="pt"
        )
        sequence_ids = encoding.sequence_ids(0)
        offsets = [tuple(pair) for pair in encoding.pop("offset_mapping")[0].tolist()]
        token_ids = encoding["input_ids"][0].tolist()
        question_tokens = sum(1 for s in sequence_ids if s == 0)
        context_positions = [i for i, s in enumerate(sequence_ids) if s == 1]
        self._check_lengths(question_tokens, len(context_positions), len(token_ids))

        special = set(self.tokenizer.all_special_ids)
        marks = [i for i, s in enumerate(sequence_ids) if s == 0 and token_ids[i] in special]
        if marks:  # the question's text names a special token: a separator there would end the question
            token = token_ids[marks[0]]
            said = question[slice(*offsets[marks[0]])] or self.tokenizer.convert_ids_to_tokens(token)
            ends = token in {self.tokenizer.sep_token_id, self.tokenizer.eos_token_id, self.tokenizer.cls_token_id,
                             self.tokenizer.bos_token_id}
            raise ValueError(f"The question holds {said!r}, which the tokenizer reads as its special token "
                             f"{self.tokenizer.convert_ids_to_tokens(token)!r} "
                             + ("(it would end the question there)" if ends else "(not as the text it is)")
                             + "; remove it or write it otherwise.")
        candidate = [
            sequence_ids[i] == 1 and token_ids[i] not in special and can_bound_answer(context[slice(*offsets[i])])
            for i in range(len(token_ids))
        ]
        if not any(candidate):
            raise ValueError("The context has no token that can start an answer (it is empty or only special tokens).")
        model_inputs = {k: encoding[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoding}
        paragraphs = (
            self._paragraphs(context, offsets, sequence_ids, token_ids, passage_token) if long_answer else None
        )
        model_inputs.update(context=context, offsets=offsets, candidate=candidate, paragraphs=paragraphs,
                            word_spans=_word_spans(offsets, sequence_ids, encoding.word_ids(0)))
        return model_inputs

    def _forward(self, model_inputs: dict) -> dict:
        """One forward pass: start/end logits (B, T) and optional answerable logits (B, 2)."""
        inputs = {k: model_inputs[k] for k in _MODEL_INPUTS if k in model_inputs}
        outputs = self.model(**inputs)
        result = {"start_logits": outputs["start_logits"], "end_logits": outputs["end_logits"]}
        answerable = outputs.get("answerable_logits") if hasattr(outputs, "get") else None
        check_finite_outputs(self.model, result["start_logits"], result["end_logits"], answerable)  # no NaN answers
        if answerable is not None:
            result["answerable_logits"] = answerable
        result.update({k: v for k, v in model_inputs.items() if k not in _MODEL_INPUTS})
        return result

    def postprocess(
        self, model_outputs: dict, top_k: int = 1, max_answer_len: int = MAX_ANSWER_TOKENS,
        handle_impossible_answer: bool = False, long_answer: bool = False, long_answer_top_k: int = 1,
        align_to_words: bool = False,
    ) -> dict | list[dict]:
        """Rank answer spans (and paragraphs) of one example; see the class docstring."""
        length = len(model_outputs["offsets"])
        start = model_outputs["start_logits"][0, :length].double()  # (T,)
        end = model_outputs["end_logits"][0, :length].double()  # (T,)
        answerable = model_outputs.get("answerable_logits")
        context = model_outputs["context"]
        spans = model_outputs["word_spans"] if align_to_words else model_outputs["offsets"]
        wanted = top_k
        while True:  # spans widened to the same words are one answer: rank more until top_k distinct ones (or all)
            answers = rank_spans(
                start, end, torch.tensor(model_outputs["candidate"]), max_answer_len=max_answer_len, top_k=wanted,
                handle_impossible_answer=handle_impossible_answer,
                answerable_logits=answerable[0].double() if answerable is not None else None,
            )
            best: dict[tuple[int, int], float] = {}  # (start, end) characters -> the best of its spans' scores
            for score, first, last in answers:
                best.setdefault((0, 0) if first < 0 else trim_answer(context, spans[first][0], spans[last][1]), score)
            if len(best) >= top_k or len(answers) < wanted:
                break
            wanted *= 4
        short = [{"score": score, "start": a, "end": b, "answer": context[a:b]}
                 for (a, b), score in list(best.items())[:top_k]]
        if not long_answer:
            return short[0] if top_k == 1 else short
        paragraph_logits = model_outputs["start_logits"][0, :length].double()
        return {
            "short_answers": short,
            "long_answers": rank_paragraphs(paragraph_logits, model_outputs["paragraphs"], context, long_answer_top_k),
        }

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _check_lengths(self, question_tokens: int, context_tokens: int, total: int) -> None:
        config = self.model.config
        if context_tokens == 0:
            raise ValueError("The context is empty after tokenization; give a non-empty context.")
        if question_tokens == 0:
            raise ValueError("The question is empty after tokenization; give a non-empty question.")
        if required_model_max_length(config) is not None:
            check_input_lengths(config, question_tokens, context_tokens)
        elif total > self._input_limit():
            raise ValueError(
                f"The input has {total} tokens, more than this {config.model_type} model takes "
                f"({self._input_limit()}); "
                "this pipeline does not split contexts: shorten the context, or use a Cluster-Former model "
                "(`clusterformer convert` turns a RoBERTa checkpoint into one)."
            )

    def _input_limit(self) -> int:
        """Longest input of a model that is not Cluster-Former: its position table (RoBERTa-style positions start
        after the padding index), or the tokenizer's limit when lower."""
        limit = self.tokenizer.model_max_length or 10**30
        positions = getattr(self.model.config, "max_position_embeddings", None)
        if positions:
            embeddings = getattr(getattr(self.model, "base_model", None), "embeddings", None)
            padding = getattr(embeddings, "padding_idx", None)
            limit = min(limit, positions - (padding + 1 if padding is not None else 0))
        return int(limit)

    def _paragraphs(self, context, offsets, sequence_ids, token_ids, passage_token) -> list[tuple[int, int, int]]:
        """Long-answer candidates: passages, else blank-line paragraphs, else sentence groups of a window (warned)."""
        spans = _paragraphs(context, offsets, sequence_ids, token_ids, self._passage_id(passage_token))
        window = getattr(self.model.config, "window_stride", None) or 128
        if len(spans) == 1 and sum(1 for s in sequence_ids if s == 1) > window:
            logger.warning_once(
                "The context has no passage tokens or blank lines: long answers are groups of whole sentences of at "
                f"most {window} tokens."
            )
            spans = _sentence_groups(context, offsets, sequence_ids, window)
        return spans

    def _passage_id(self, passage_token: str | None) -> int | None:
        if not passage_token:
            return None
        token_id = self.tokenizer.convert_tokens_to_ids(passage_token)
        return None if token_id is None or token_id == self.tokenizer.unk_token_id else token_id

    def save_pretrained(self, save_directory, **kwargs):
        """Save model, tokenizer (reading up to the model's limit) and this pipeline's code so that
        ``trust_remote_code=True`` loads all three (a model of classes outside transformers gets ``auto_map``). A
        Cluster-Former model is written by the package's one writer,
        `hf_clusterformer_model_folder.write_model_folder`, into the folder as it is; other models (or this file's Hub
        copy without the package) by transformers'."""
        use_model_limit(self.tokenizer, self.model.config)
        if getattr(type(self.model.config), "model_type", None) == "clusterformer":
            try:
                from hf_clusterformer_model_folder import write_model_folder
            except ImportError:  # a Hub copy, used without the package
                write_model_folder = None
            if write_model_folder is not None:
                write_model_folder(self.model, save_directory, self.tokenizer, in_place=True, **kwargs)
                return None
        model_class, config_class = type(self.model), type(self.model.config)
        if not model_class.__module__.startswith("transformers."):
            if getattr(config_class, "_auto_class", None) is None:
                config_class.register_for_auto_class()
            if getattr(model_class, "_auto_class", None) is None:
                model_class.register_for_auto_class("AutoModelForQuestionAnswering")
        return super().save_pretrained(save_directory, **kwargs)


def can_bound_answer(text: str) -> bool:
    """Whether a token of these characters may start or end an answer: one that is not only white space and
    byte-order marks (a line end, a file's BOM)."""
    return bool(_EDGES.fullmatch(text).group(1))


def trim_answer(context: str, start: int, end: int) -> tuple[int, int]:
    """``(start, end)`` (characters of ``context``) without white space or byte-order marks at either edge."""
    inner = _EDGES.fullmatch(context, start, end)
    return inner.start(1), inner.end(1)


def rank_spans(
    start_logits: torch.Tensor, end_logits: torch.Tensor, candidate: torch.Tensor,
    max_answer_len: int = MAX_ANSWER_TOKENS, top_k: int = 1, handle_impossible_answer: bool = False,
    answerable_logits: torch.Tensor | None = None,
) -> list[tuple[float, int, int]]:
    """Up to ``top_k`` best answer spans ``(score, start_token, end_token)`` by a softmax over all valid spans, sorted
    by score (equal scores: the earlier span first, so a batch ranks as each example alone); the empty answer
    (``handle_impossible_answer``) is ``(score, -1, -1)``.

    ``start_logits``, ``end_logits``: (T,) of one example; ``candidate``: (T,) bool, tokens that may start or end an
    answer; a span has at most ``max_answer_len`` tokens. ``answerable_logits``: optional (2,) [no answer, answer]
    logits; without them the empty answer's logit is ``start_logits[0] + end_logits[0]``.
    """
    positions = candidate.nonzero().flatten()  # (n,)
    count = positions.numel()
    if count == 0:
        raise ValueError("No token can start an answer: candidate is all False.")
    span_logits, span_starts, span_ends = [], [], []
    for offset in range(min(max_answer_len, count)):
        first, last = positions[: count - offset], positions[offset:]
        fits = (last - first) < max_answer_len
        span_logits.append((start_logits[first] + end_logits[last])[fits])
        span_starts.append(first[fits])
        span_ends.append(last[fits])
    logits = torch.cat(span_logits) if span_logits else start_logits.new_zeros(0)  # (N,)
    starts, ends = torch.cat(span_starts), torch.cat(span_ends)

    null_score = None
    if answerable_logits is not None:
        log_answer = torch.log_softmax(answerable_logits, dim=-1)  # (2,)
        log_scores = torch.log_softmax(logits, dim=0) + (log_answer[1] if handle_impossible_answer else 0.0)
        if handle_impossible_answer:
            null_score = math.exp(float(log_answer[0]))
    elif handle_impossible_answer:
        null_logit = start_logits[0] + end_logits[0]
        normaliser = torch.logsumexp(torch.cat([logits, null_logit.view(1)]), dim=0)
        log_scores = logits - normaliser
        null_score = math.exp(float(null_logit - normaliser))
    else:
        log_scores = torch.log_softmax(logits, dim=0)

    by_position = torch.argsort(starts * (start_logits.numel() + 1) + ends)  # (N,) spans by (start, end)
    log_scores, starts, ends = log_scores[by_position], starts[by_position], ends[by_position]
    best = torch.sort(log_scores, descending=True, stable=True)  # equal scores: the earlier span first
    ranked = [
        (min(1.0, math.exp(float(value))), int(starts[index]), int(ends[index]))
        for value, index in zip(best.values[:top_k], best.indices[:top_k])
    ]
    if null_score is not None:
        ranked.append((min(1.0, null_score), -1, -1))
        ranked.sort(key=lambda item: -item[0])
    return ranked[:top_k]


def rank_paragraphs(
    logits: torch.Tensor, paragraphs: list[tuple[int, int, int]], context: str, top_k: int = 1
) -> list[dict]:
    """Rank ``paragraphs`` (``(first_token, char_start, char_end)`` each) by the logit (``logits``: (T,), the
    ``start_logits``) of their first token, softmaxed over the paragraphs: up to ``top_k`` dicts ``{"score", "start",
    "end", "answer", "index"}`` sorted by score, ``answer == context[start:end]``, ``index`` the paragraph's place."""
    if not paragraphs:
        return []
    scores = torch.softmax(logits[torch.tensor([p[0] for p in paragraphs])], dim=0)  # (P,)
    best = torch.topk(scores, k=min(top_k, len(paragraphs)))
    return [
        {
            "score": min(1.0, float(score)),
            "start": paragraphs[index][1],
            "end": paragraphs[index][2],
            "answer": context[paragraphs[index][1] : paragraphs[index][2]],
            "index": int(index),
        }
        for score, index in zip(best.values, best.indices)
    ]


def _word_spans(offsets: list[tuple[int, int]], sequence_ids: list[int | None], word_ids: list[int | None]
                ) -> list[tuple[int, int]]:
    """Per token, the characters of the whole context word it belongs to (its own offsets outside the context)."""
    words: dict[int, tuple[int, int]] = {}
    for (start, end), sequence, word in zip(offsets, sequence_ids, word_ids):
        if sequence == 1 and word is not None and end > start:
            first, last = words.get(word, (start, end))
            words[word] = (min(first, start), max(last, end))
    return [words.get(word, span) if sequence == 1 and word is not None else span
            for span, sequence, word in zip(offsets, sequence_ids, word_ids)]


def _paragraphs(
    context: str, offsets: list[tuple[int, int]], sequence_ids: list[int | None], token_ids: list[int],
    passage_id: int | None,
) -> list[tuple[int, int, int]]:
    """``(first_token, char_start, char_end)`` of each paragraph: from each passage token, else between blank lines."""
    context_tokens = [i for i, s in enumerate(sequence_ids) if s == 1]
    markers = [i for i in context_tokens if passage_id is not None and token_ids[i] == passage_id]
    if markers:
        starts = [offsets[i][0] for i in markers] + [len(context)]
        return [
            (token, starts[k], starts[k] + len(context[starts[k] : starts[k + 1]].rstrip()))
            for k, token in enumerate(markers)
        ]
    spans, begin = [], 0
    for gap in [*_BLANK_LINE.finditer(context), None]:
        stop = gap.start() if gap is not None else len(context)
        text = context[begin:stop]
        if text.strip():
            char_start = begin + len(text) - len(text.lstrip())
            char_end = begin + len(text.rstrip())
            first = next(
                (i for i in context_tokens if offsets[i][1] > offsets[i][0] and offsets[i][0] >= char_start), None
            )
            if first is not None and offsets[first][0] < char_end:
                spans.append((first, char_start, char_end))
        if gap is not None:
            begin = gap.end()
    return spans


def _sentence_groups(
    context: str, offsets: list[tuple[int, int]], sequence_ids: list[int | None], max_tokens: int
) -> list[tuple[int, int, int]]:
    """``(first_token, char_start, char_end)`` of consecutive whole sentences of at most ``max_tokens`` tokens (a
    longer sentence stands alone)."""
    tokens = [i for i, s in enumerate(sequence_ids) if s == 1 and offsets[i][1] > offsets[i][0]]
    sentence_ends = [match.end() for match in _SENTENCE_END.finditer(context)]
    groups: list[list[int]] = []
    for _, sentence in itertools.groupby(tokens, key=lambda i: bisect.bisect_right(sentence_ends, offsets[i][0])):
        sentence = list(sentence)
        if groups and len(groups[-1]) + len(sentence) <= max_tokens:
            groups[-1].extend(sentence)
        else:
            groups.append(sentence)
    return [(group[0], offsets[group[0]][0], offsets[group[-1]][1]) for group in groups]


def _pair_inputs(question, context) -> dict | list[dict]:
    """Turn question/context strings or lists (a single string is repeated) into pipeline inputs."""
    for name, value in (("question", question), ("context", context)):
        if isinstance(value, (bytes, bytearray)):
            raise ValueError(f"The {name} is bytes; decode it to a string first ({name}.decode('utf-8')).")
        if not isinstance(value, str) and not isinstance(value, (list, tuple)):
            raise ValueError(f"The {name} must be a string or a list of strings, got {type(value).__name__}.")
    if isinstance(question, str) and isinstance(context, str):
        return {"question": question, "context": context}
    questions = [question] if isinstance(question, str) else list(question)
    contexts = [context] if isinstance(context, str) else list(context)
    if len(questions) == 1:
        questions = questions * len(contexts)
    if len(contexts) == 1:
        contexts = contexts * len(questions)
    if len(questions) != len(contexts):
        raise ValueError(f"Got {len(questions)} questions for {len(contexts)} contexts.")
    return [{"question": q, "context": c} for q, c in zip(questions, contexts)]


def _check_example(example: Any) -> tuple[str, str]:
    if not isinstance(example, dict) or "question" not in example or "context" not in example:
        raise ValueError(f"Each input must be a dict with 'question' and 'context', got {type(example).__name__}.")
    question, context = example["question"], example["context"]
    for name, value in (("question", question), ("context", context)):
        if not isinstance(value, str):
            raise ValueError(f"The {name} must be a string, got {type(value).__name__}.")
        if not value.strip():
            raise ValueError(f"The {name} is empty.")
    return question, context


# Pipeline.save_pretrained writes `custom_pipelines` into config.json from this attribute.
ClusterFormerQuestionAnsweringPipeline._registered_impl = {
    TASK: {"impl": ClusterFormerQuestionAnsweringPipeline, "pt": (AutoModelForQuestionAnswering,), "type": "text"}
}


__all__ = [
    "PASSAGE_TOKEN",
    "ClusterFormerQuestionAnsweringPipeline",
    "rank_paragraphs",
    "rank_spans",
]
