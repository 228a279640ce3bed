"""The heads of Cluster-Former, one row each: the one table every part that handles heads reads (the Auto
registrations, the Hub's ``auto_map``, conversion, export, the model card, the command's ``--task``).

A row names its classes by name; the library resolves them (the model classes in
``hf_clusterformer.modeling_clusterformer``, the Auto classes in ``transformers``). A top-level module with no imports
beyond the standard library, on the bottom floor (see ARCHITECTURE.md), so the command reads it before importing
torch. Every reader looks the table up when it runs (`HEADS`), so a row added here reaches them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["HEADS", "Head"]


@dataclass(frozen=True)
class Head:
    """One head of Cluster-Former."""

    #: The pipeline task (what ``clusterformer convert --task`` takes and a card's ``pipeline_tag`` says).
    task: str
    #: The head's short key, which `hf_clusterformer.conversion.convert_checkpoint` also takes as its ``task`` and
    #: reports as `hf_clusterformer.conversion.ConvertedCheckpoint.task`.
    key: str
    #: The model class (in ``hf_clusterformer.modeling_clusterformer``).
    class_name: str
    #: The transformers Auto class that loads it.
    auto_class: str
    #: The ends of the model class names (Cluster-Former's, RoBERTa's, BERT's) that hold this head.
    endings: tuple[str, ...]
    #: How messages name the head.
    name: str
    #: The outputs of an exported program, in order.
    outputs: tuple[str, ...] = ("logits",)
    #: The dimensions of its ``input_ids`` and ``attention_mask`` (a multiple-choice head's hold a row per choice), as
    #: export traces them and the runner of an exported file checks them.
    inputs: tuple[str, ...] = ("batch", "length")
    #: How a model card describes the head (its template's ``head`` words; ``{mask}``: the mask token), with the names
    #: of its settings rows (``longest_prefix``, ``longest_text``, ``untrained_head``; by default a pair head's) and
    #: its widget (``widget``: ``question`` with a context, ``masked text``, ``text`` (the default) or ``none``).
    card: Mapping[str, str] = field(default_factory=dict)
    #: The card's usage snippet of the head, but for QA's (in the card's template): its imports and the code after
    #: ``long_text`` is defined (``{repo}``, ``{load}``: the loading arguments, ``{mask}``, ``{task}``).
    usage: tuple[str, str] = ("from transformers import pipeline",
                              'run = pipeline("{task}", model="{repo}"{load})\nprint(run(long_text))\n')
    #: Where a BERT checkpoint's weights of this head go in the RoBERTa layout: source prefix -> target prefix.
    bert_weights: Mapping[str, str] = field(default_factory=dict)
    #: The transformers pipeline class that serves the head over whole texts (`hf_clusterformer.pipeline`), if any.
    pipeline_class: str | None = None


_PAIR_PREFIX = "the text's `<s>` (for a pair of texts, the first text)"
_MULTIPLE_CHOICE_CALL = """question, options = "Where was the lighthouse keeper born?", ["Garlow", "Harrow", "Arden"]
tokenizer = AutoTokenizer.from_pretrained("{repo}"{load})
model = AutoModelForMultipleChoice.from_pretrained("{repo}"{load})
choices = tokenizer([f"{{question}} {{option}}" for option in options], [long_text] * len(options), padding=True,
                    return_tensors="pt")
with torch.no_grad():
    logits = model(**{{name: tensor.unsqueeze(0) for name, tensor in choices.items()}}).logits  # (1, choices)
print(options[int(logits.argmax())])
"""

#: The heads, question answering (the default) first.
HEADS: tuple[Head, ...] = (
    Head(
        "question-answering", "qa", "ClusterFormerForQuestionAnswering", "AutoModelForQuestionAnswering",
        ("ForQuestionAnswering",), "question-answering", ("start_logits", "end_logits"),
        card={"prefix": "the question", "longest_prefix": "Longest question", "longest_text": "Longest context",
              "untrained_head": "QA head", "widget": "question"},
        bert_weights={"qa_outputs.": "qa_outputs."},
    ),
    Head(
        "fill-mask", "mlm", "ClusterFormerForMaskedLM", "AutoModelForMaskedLM", ("ForMaskedLM", "ForPreTraining"),
        "masked-LM",
        card={
            "model": "A masked language model", "input": "A text (or a pair of texts)",
            "output": "the masked-LM head gives logits over the vocabulary for every input token",
            "prefix": _PAIR_PREFIX,
            "returns": "The pipeline returns the `top_k` most likely tokens for the mask token (`{mask}`, one per "
                       "text), each with its `score` and the filled-in `sequence`.",
            "untrained_head": "Masked-LM head", "widget": "masked text",
        },
        usage=("from transformers import pipeline", 'fill = pipeline("fill-mask", model="{repo}"{load})\n'
               'print(fill(long_text + " She was born in {mask}.", top_k=3))\n'),
        # BERT's MLM transform is ``lm_head``; the decoder is tied to the word embeddings
        bert_weights={"cls.predictions.transform.dense.": "lm_head.dense.",
                      "cls.predictions.transform.LayerNorm.": "lm_head.layer_norm.",
                      "cls.predictions.bias": "lm_head.bias"},
        pipeline_class="FillMaskPipeline",
    ),
    Head(
        "text-classification", "sequence-classification", "ClusterFormerForSequenceClassification",
        "AutoModelForSequenceClassification", ("ForSequenceClassification",), "sequence-classification",
        card={
            "model": "A text classifier", "input": "A text (or a pair of texts)",
            "output": "the classification head reads the mean of the windows' `<s>` states and gives a score per "
                      "label",
            "prefix": _PAIR_PREFIX,
            "returns": "The pipeline returns a `label` and its `score` (with `top_k=None`, every label).",
            "untrained_head": "Classification head",
        },
        usage=(
            "from transformers import pipeline",
            'classify = pipeline("text-classification", model="{repo}"{load})\n'
            "print(classify(long_text, top_k=None))\n",
        ),
        # BERT's pooler + classifier is RoBERTa's classification head
        bert_weights={"roberta.pooler.dense.": "classifier.dense.", "classifier.": "classifier.out_proj."},
        pipeline_class="TextClassificationPipeline",
    ),
    Head(
        "token-classification", "token-classification", "ClusterFormerForTokenClassification",
        "AutoModelForTokenClassification", ("ForTokenClassification",), "token-classification",
        card={
            "model": "A token classifier", "input": "A text (or a pair of texts)",
            "output": "the head gives a score per label for every input token",
            "prefix": _PAIR_PREFIX,
            "returns": "The pipeline returns an entry per token (`entity`, `score`, `word`, `start`, `end`), leaving "
                       "out the labels of `ignore_labels`; `aggregation_strategy` groups them into words or spans.",
            "untrained_head": "Token-classification head",
        },
        usage=("from transformers import pipeline", 'tag = pipeline("token-classification", model="{repo}"{load})\n'
               "print(tag(long_text)[:10])\n"),
        bert_weights={"classifier.": "classifier."},
        pipeline_class="TokenClassificationPipeline",
    ),
    Head(
        "multiple-choice", "multiple-choice", "ClusterFormerForMultipleChoice", "AutoModelForMultipleChoice",
        ("ForMultipleChoice",), "multiple-choice", inputs=("batch", "choices", "length"),
        card={
            "model": "A multiple-choice model",
            "input": "Each choice, `<s> question option </s></s> context </s>` with the whole context",
            "output": "the head scores it from the mean of the windows' `<s>` states",
            "prefix": "the question and the option",
            "returns": "`logits` holds a score per choice, (batch, choices); the highest is the model's answer.",
            "longest_prefix": "Longest question and option", "longest_text": "Longest context",
            "untrained_head": "Multiple-choice head", "widget": "none",  # the Hub has no widget for it
        },
        usage=(
            "import torch\nfrom transformers import AutoModelForMultipleChoice, AutoTokenizer",
            _MULTIPLE_CHOICE_CALL,
        ),
        bert_weights={"roberta.pooler.": "roberta.pooler.", "classifier.": "classifier."},
    ),
)


def head_tasks() -> tuple[str, ...]:
    """The pipeline task of every head, in table order."""
    return tuple(head.task for head in HEADS)


def head_names() -> tuple[str, ...]:
    """What names a head (the command's ``--task`` choices): every pipeline task, then every key that is no task."""
    return (*head_tasks(), *(head.key for head in HEADS if head.key not in head_tasks()))


def find_head(name: str | None) -> Head | None:
    """The head of a pipeline task, a head's key (``qa``, ``mlm``, ...) or a model class name; ``None`` if none."""
    for head in HEADS:
        if name in (head.task, head.key, head.class_name):
            return head
    return None


def architectures_task(architectures: Iterable[str] | None) -> str | None:
    """The pipeline task of the head of the first class in ``architectures`` (a config's), or ``None`` for a plain
    encoder (``RobertaModel``, ``ClusterFormerModel``) or no class."""
    for name in list(architectures or [])[:1]:
        for head in HEADS:
            if name.endswith(head.endings):
                return head.task
    return None
