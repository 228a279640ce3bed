"""Train and evaluate Cluster-Former on long-context extractive QA (the logic of examples/run_qa.py and the CLI).

Data: local SQuAD-format json/jsonl files (``--train_file`` / ``--validation_file``), the SQuAD-based multi-passage
set (``squad-multipassage``), or a dataset name from the Hub when online.
Every context is ONE feature (no doc-stride splitting). Training uses the HF `Trainer` with
`CentroidUpdateCallback`; evaluation maps logits to answer texts and scores SQuAD EM/F1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any, get_args, get_type_hints

import datasets
import torch
from transformers import (
    DataCollatorWithPadding,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

from hf_clusterformer_cli_support import unknown_options
from hf_clusterformer_files import RESULT_FILES, check_result_files
from hf_clusterformer_writing import run_output_dir

from .callback import CentroidUpdateCallback, FiniteTrainingCallback, RoutedRateTrainer
from .centroid_updates import SMALL_MODEL_CENTROIDS, CentroidUpdateSettings
from .configuration_clusterformer import (
    LAYER_KIND_SHORTCUTS,
    ClusterFormerConfig,
    check_context_length,
    required_position_embeddings,
)
from .conversion import ModelOption, load_qa_model, model_options
from .data import build_tokenizer, load_multipassage_dataset, squad_features
from .features import (
    check_columns,
    check_records,
    postprocess_predictions,
    prepare_train_features,
    prepare_validation_features,
    question_fits,
)
from .hub import write_checkpoint
from .loading import check_tokenizer_fits
from .loading import load_tokenizer as load_saved_tokenizer
from .metrics import load_squad_metric
from .modelcard import run_card_data
from .modeling_clusterformer import (
    ClusterFormerForQuestionAnswering,
    check_centroid_memory,
    check_trained,
    locate_question_prefix,
)
from .pipeline import MAX_ANSWER_TOKENS

logger = logging.getLogger(__name__)

#: Data sets this command generated before it read SQuAD-format files only: `load_raw_datasets` says where they went.
FORMER_GENERATED = ("longrange", "local", "mention", "twin")


#: The sizes of a model built from scratch (flags a checkpoint does not read).
FROM_SCRATCH_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
#: Examples built of the multi-passage set per split, unless --train_samples / --eval_samples say (files: all rows).
BUILT_SAMPLES = {"train": 2000, "validation": 200}

#: run_qa's notes on a model option's default (where it differs from the config's).
_DEFAULT_NOTES = {"max_context_length": "--max_seq_length"}


def _model_option_field(option: ModelOption) -> tuple[str, Any, Any]:
    """A `ModelArguments` field for one model option: ``None`` (a checkpoint's own value, or the config default
    from scratch) unless given; type and help from `model_options`."""
    flag_type = list[option.item_type] if option.many else option.item_type
    note = _DEFAULT_NOTES.get(option.name, None if option.default is None else option.default)
    text = option.help.rstrip(".") + ("." if note is None else f". Default: a checkpoint's own, else {note}.")
    metadata = {"help": text, **({"choices": option.choices} if option.choices else {})}
    if flag_type is bool:  # a bare --switch means True (as convert's), a value (true / false) still parses
        metadata.update(nargs="?", const=True)
    return option.name, flag_type | None, field(default=None, metadata=metadata)


def _model_arguments() -> type:
    """`ModelArguments`: the checkpoint, the sizes of a model from scratch, every model option of
    `model_options` (derived, as `CentroidArguments` is from `CentroidUpdateSettings`) and run switches."""
    helps = {
        "model_name_or_path": (
            "RoBERTa or Cluster-Former checkpoint (directory or Hub id). Omit to train from scratch."
        ),
        "tokenizer_name": "Tokenizer (default: the model's, or one built on the data).",
        "hidden_size": "From scratch: hidden size.",
        "num_hidden_layers": "From scratch: encoder layers.",
        "num_attention_heads": "From scratch: attention heads.",
        "intermediate_size": "From scratch: feed-forward size.",
        "vocab_size": "From scratch: size of the BPE vocabulary built on the data.",
        "dropout": "Hidden and attention dropout.",
        "routed_learning_rate_scale": "Learning-rate factor of the window_cluster layers' routed projection, which "
                                      "starts at zero: 1 trains it like the rest (on real text 30 did worse); larger "
                                      "opens the routed path sooner (30 on the long-range twin task).",
        "overwrite": "Train into an output_dir that already holds a model: replace its files (each put in place when "
                     "the run ends; other files are kept); evaluate into one that holds a run's all_results.json: "
                     "replace it.",
        "allow_untrained": "Evaluate even a QA head that was never trained (smoke tests).",
    }
    before = [
        ("model_name_or_path", str | None, None), ("tokenizer_name", str | None, None), ("hidden_size", int, 128),
        ("num_hidden_layers", int, 4), ("num_attention_heads", int, 4), ("intermediate_size", int, 512),
        ("vocab_size", int, 1300),
    ]
    after = [("dropout", float | None, None), ("routed_learning_rate_scale", float, 1.0), ("overwrite", bool, False),
             ("allow_untrained", bool, False)]
    columns = [(name, kind, field(default=default, metadata={"help": helps[name]})) for name, kind, default in before]
    columns += [_model_option_field(option) for option in model_options().values()]
    columns += [(name, kind, field(default=default, metadata={"help": helps[name]})) for name, kind, default in after]

    def __post_init__(self) -> None:
        check_context_length(self.max_context_length, "--max_context_length")
        if not self.routed_learning_rate_scale > 0:
            raise ValueError(f"--routed_learning_rate_scale must be positive, got {self.routed_learning_rate_scale}.")

    def cluster_options(self) -> dict[str, Any]:
        """Config overrides given on the command line: the model options set, and ``dropout``."""
        options = {name: getattr(self, name) for name in model_options() if getattr(self, name) is not None}
        if self.dropout is not None:
            options.update(hidden_dropout_prob=self.dropout, attention_probs_dropout_prob=self.dropout)
        return options

    doc = ("Which model to start from, and the Cluster-Former options (``--cluster_layers`` with no value: no "
           "global layers, the sliding-window baseline).")
    namespace = {"__post_init__": __post_init__, "cluster_options": cluster_options, "__doc__": doc,
                 "__module__": __name__}
    return make_dataclass("ModelArguments", columns, namespace=namespace)


ModelArguments = _model_arguments()


@dataclass
class DataArguments:
    """Which data, and how to turn logits into answers."""

    dataset: str | None = field(
        default=None,
        metadata={"help": "squad-multipassage (built from SQuAD v1.1 dev) or a Hub dataset name; not needed with "
                          "--train_file / --validation_file."},
    )
    train_file: str | None = field(default=None, metadata={"help": "SQuAD-format json/jsonl training file."})
    validation_file: str | None = field(default=None, metadata={"help": "SQuAD-format json/jsonl validation file."})
    squad_path: str | None = field(default=None, metadata={"help": "SQuAD v1.1 json/zip for squad-multipassage."})
    train_samples: int | None = field(default=None, metadata={"help": "Training examples built (squad-multipassage, "
                                                                      "default 2000), or a cap on the files' and Hub "
                                                                      "data's (default: all)."})
    eval_samples: int | None = field(default=None, metadata={"help": "Validation examples built (squad-multipassage, "
                                                                     "default 200), or a cap on the files' and Hub "
                                                                     "data's (default: all)."})
    context_tokens_min: int = field(default=2000, metadata={"help": "squad-multipassage: shortest built context "
                                                                     "(approximate tokens)."})
    context_tokens_max: int = field(default=8000, metadata={"help": "squad-multipassage: longest built context "
                                                                     "(approximate tokens)."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of the built data (squad-multipassage)."})
    max_seq_length: int | None = field(default=None, metadata={"help": "Tokens per feature (question + context); "
                                                                "longer contexts are cut, with a warning (default: "
                                                                "the model's own limit; 16384 from scratch)."})
    max_answer_length: int = field(default=MAX_ANSWER_TOKENS, metadata={"help": "Longest answer in tokens (the "
                                                                             "pipeline's default too)."})

    def __post_init__(self) -> None:
        """A count out of range refused as the flags are parsed, in one line naming its flag."""
        least = {"max_answer_length": 1, "max_seq_length": 1, "train_samples": 0, "eval_samples": 0,
                 "context_tokens_min": 1, "context_tokens_max": 1}
        for name, minimum in least.items():
            value = getattr(self, name)
            if value is not None and value < minimum:
                raise ValueError(f"--{name} must be at least {minimum}, got {value}.")


#: run_qa flag -> the `CentroidUpdateSettings` option it sets (defaults and help come from the settings).
CENTROID_FLAGS = {
    "centroid_update_steps": "update_every_steps",
    "centroid_update_epochs": "update_every_epochs",
    "memory_size": "memory_size",
    "min_states": "min_states",
    "centroid_backend": "backend",
    "max_capture_per_forward": "max_capture_per_forward",
}


def _centroid_arguments() -> type:
    """`CentroidArguments`: one field per entry of `CENTROID_FLAGS`, typed, defaulted and documented as its option."""
    types = get_type_hints(CentroidUpdateSettings)
    options = {f.name: f for f in fields(CentroidUpdateSettings)}
    columns = [
        (flag, types[name], field(default=options[name].default, metadata=dict(options[name].metadata)))
        for flag, name in CENTROID_FLAGS.items()
    ]

    def settings(self) -> CentroidUpdateSettings:
        """The `CentroidUpdateSettings` these flags describe."""
        return CentroidUpdateSettings(**{name: getattr(self, flag) for flag, name in CENTROID_FLAGS.items()})

    def __post_init__(self) -> None:
        """A bad value refused as the flags are parsed, in one line naming its flag."""
        try:
            self.settings()
        except (ValueError, ImportError) as error:
            flag, name = next(((f, n) for f, n in CENTROID_FLAGS.items() if str(error).startswith(f"{n} ")), ("", ""))
            raise type(error)(f"--{flag}{str(error)[len(name):]}" if flag else str(error)) from None

    doc = "When and how the cluster centroids are refitted (CentroidUpdateCallback)."
    namespace = {"settings": settings, "__post_init__": __post_init__, "__doc__": doc, "__module__": __name__}
    return make_dataclass("CentroidArguments", columns, namespace=namespace)


CentroidArguments = _centroid_arguments()


def centroid_flag_options(settings: CentroidUpdateSettings = SMALL_MODEL_CENTROIDS) -> list[ModelOption]:
    """The options of `CENTROID_FLAGS` as rows for `hf_clusterformer_cli_support.add_option_flags` (a script's
    argparse flags): run_qa's flag names, the option's type and help, and its value in ``settings`` as default."""
    types = get_type_hints(CentroidUpdateSettings)
    helps = {f.name: f.metadata["help"] for f in fields(CentroidUpdateSettings)}
    rows = []
    for flag, name in CENTROID_FLAGS.items():
        item = next((t for t in get_args(types[name]) if t is not type(None)), types[name])
        rows.append(ModelOption(name=flag, type=types[name], default=getattr(settings, name), help=helps[name],
                                item_type=item, many=False))
    return rows


def centroid_arguments(values: Any) -> CentroidArguments:
    """`CentroidArguments` from an object (a script's parsed arguments) with one attribute per `CENTROID_FLAGS`."""
    return CentroidArguments(**{flag: getattr(values, flag) for flag in CENTROID_FLAGS})


def parse_args(argv: list[str] | None = None, prog: str | None = None, usage_errors_raise: bool = False):
    """Parse command-line arguments into (model, data, centroid, training) argument dataclasses.

    With ``usage_errors_raise``, a bad option value raises `ValueError` instead of printing the (long) usage.
    """
    parser = _argument_parser((ModelArguments, DataArguments, CentroidArguments, TrainingArguments), prog=prog)
    if usage_errors_raise:

        def error(message: str):
            raise ValueError(f"{message} (see `{parser.prog} --help`)")

        parser.error = error
    if argv is not None and len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    *parsed, unknown = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if unknown:
        options = unknown_options(unknown, (o for a in parser._actions for o in a.option_strings))
        raise ValueError(f"{options} (see `{parser.prog} --help`)")
    return tuple(parsed)


def print_help(prog: str | None = None, training: bool = False, output_dir: str | None = None) -> None:
    """Help of ``clusterformer train`` / ``evaluate``: this package's options, and `TrainingArguments`' only with
    ``training`` (``--help-training``); ``output_dir``: the folder written without ``--output_dir``."""
    classes = (ModelArguments, DataArguments, CentroidArguments, *((TrainingArguments,) if training else ()))
    epilog = None if training else (
        "Every option of transformers' TrainingArguments applies too (--output_dir, --max_steps, --learning_rate, "
        "--per_device_train_batch_size, --seed, --do_train, --do_eval, ...): see --help-training."
    )
    if output_dir is not None:
        evaluation = (prog or "").endswith("evaluate")
        writes = "evaluate writes its records" if evaluation else "train writes its model and records"
        default = (f"Without --output_dir, {writes} (all_results.json, eval_predictions.json) to {output_dir}; a "
                   "model or records already there are kept unless --overwrite.")
        epilog = default if epilog is None else f"{epilog} {default}"
    _argument_parser(classes, prog=prog, epilog=epilog).print_help()


class _DefaultsOnceFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that names an option's default once: not after a help that names it already, nor an unset ``None``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or "Default:" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def _argument_parser(classes: tuple[type, ...], **kwargs: Any) -> HfArgumentParser:
    """The `HfArgumentParser` of ``classes``, where a model option that takes a list also takes none
    (``--cluster_layers`` alone: ``[]``, as ``clusterformer convert --cluster-layers`` reads it)."""
    parser = HfArgumentParser(classes, formatter_class=_DefaultsOnceFormatter, allow_abbrev=False, **kwargs)
    lists = {option.name for option in model_options().values() if option.many}
    for action in parser._actions:
        if action.dest in lists:
            action.nargs = "*"
    return parser


# -- data ---------------------------------------------------------------------------------------------------------


def _flatten_squad_json(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Records from an official nested SQuAD json ({"data": [{"paragraphs": ...}]})."""
    records = []
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                records.append(
                    {
                        "id": str(qa["id"]),
                        "title": article.get("title", ""),
                        "question": qa["question"],
                        "context": paragraph["context"],
                        "answers": {
                            "text": [a["text"] for a in qa.get("answers", [])],
                            "answer_start": [a["answer_start"] for a in qa.get("answers", [])],
                        },
                    }
                )
    return records


def _parse_json_file(path: str) -> Any:
    """The parsed content of a .json file (a list of the lines' values for .jsonl); `ValueError` naming the place
    of invalid JSON or text that is not UTF-8."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a leading byte-order mark is no JSON error
    except UnicodeDecodeError as error:
        raise ValueError(
            f"data file {path} is not UTF-8 text (byte offset {error.start}); save it as UTF-8."
        ) from error
    lines = text.splitlines() if path.endswith(".jsonl") else [text]
    values = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as error:
            where = f"line {number if path.endswith('.jsonl') else error.lineno} column {error.colno}"
            fix = ("it holds one JSON value a line: name it .jsonl" if error.msg == "Extra data" and error.colno == 1
                   and not path.endswith(".jsonl") else "fix that line")
            raise ValueError(f"data file {path} is not valid JSON at {where} ({error.msg}); {fix}.") from error
    return values if path.endswith(".jsonl") else values[0] if values else None


def _load_file(path: str) -> datasets.Dataset:
    if not os.path.exists(path):
        raise FileNotFoundError(f"data file {path} does not exist.")
    if not path.endswith((".json", ".jsonl")):
        raise ValueError(f"data file {path} must be .json or .jsonl (SQuAD format).")
    data = _parse_json_file(path)
    squad_json = isinstance(data, dict) and isinstance(data.get("data"), list) and data["data"]
    if squad_json and "paragraphs" in data["data"][0]:
        return datasets.Dataset.from_list(_flatten_squad_json(data), features=squad_features())
    if squad_json and all(isinstance(record, dict) and "question" in record for record in data["data"]):
        return datasets.Dataset.from_list(data["data"])  # {"data": [flat records]}
    if not data:
        raise ValueError(f"data file {path} holds no records; give SQuAD-format records.")
    return datasets.load_dataset("json", data_files=path, split="train")


def load_raw_datasets(data: DataArguments) -> datasets.DatasetDict:
    """The train/validation splits as SQuAD-format records: the files given, else the built or Hub data set."""
    splits: dict[str, datasets.Dataset] = {}
    if data.train_file or data.validation_file:
        if data.train_file:
            splits["train"] = _load_file(data.train_file)
        if data.validation_file:
            splits["validation"] = _load_file(data.validation_file)
    elif data.dataset is None:
        raise ValueError("no data: give --validation_file (SQuAD-format json/jsonl) to evaluate and --train_file to "
                         "train, or --dataset squad-multipassage or a Hub dataset name.")
    elif data.dataset in FORMER_GENERATED:
        raise ValueError(
            f"--dataset {data.dataset}: the generated long-range sets are not built by this command; write them as "
            "SQuAD-format files "
            f"(`python -m clusterformer_research.longrange --kind {data.dataset} --out train.json`, "
            "the research package of the hf-clusterformer repository) and pass --train_file / --validation_file."
        )
    elif data.dataset == "squad-multipassage":
        train_samples = BUILT_SAMPLES["train"] if data.train_samples is None else data.train_samples
        eval_samples = BUILT_SAMPLES["validation"] if data.eval_samples is None else data.eval_samples
        built = load_multipassage_dataset(
            data.squad_path,
            num_examples=train_samples + eval_samples,
            seed=data.dataset_seed,
            context_tokens=(data.context_tokens_min, data.context_tokens_max),
        )
        splits = {
            "train": built.select(range(train_samples)),
            "validation": built.select(range(train_samples, len(built))),
        }
    else:
        loaded = datasets.load_dataset(data.dataset)
        splits = {name: loaded[name] for name in ("train", "validation") if name in loaded}
    check_columns(splits)
    if "train" in splits and data.train_samples:
        splits["train"] = splits["train"].select(range(min(data.train_samples, len(splits["train"]))))
    if "validation" in splits and data.eval_samples:
        splits["validation"] = splits["validation"].select(range(min(data.eval_samples, len(splits["validation"]))))
    check_records(splits, {"train": data.train_file, "validation": data.validation_file})
    return datasets.DatasetDict(splits)


# -- model --------------------------------------------------------------------------------------------------------


def load_tokenizer(model: ModelArguments, data: DataArguments, raw: datasets.DatasetDict, output_dir: str):
    """The checkpoint's tokenizer, a named one, or a byte-level BPE built on the training questions and contexts
    (the validation split's without training data)."""
    name = model.tokenizer_name or model.model_name_or_path
    if name:
        tokenizer = load_saved_tokenizer(name)
        tokenizer.model_max_length = max(tokenizer.model_max_length or 0, data.max_seq_length or 0)
        return tokenizer
    split = raw["train"] if "train" in raw else raw["validation"]
    texts = (row["question"] + "\n" + row["context"] for row in split)
    return build_tokenizer(texts, vocab_size=model.vocab_size)


#: ``--max_seq_length`` of a model built from scratch when none is given (its ``max_context_length``).
FROM_SCRATCH_LENGTH = 16384


def load_model(
    model: ModelArguments, data: DataArguments, tokenizer, seed: int = 0
) -> ClusterFormerForQuestionAnswering:
    """From a checkpoint (Cluster-Former, RoBERTa or BERT-family) with the command-line cluster options, or from
    scratch. Weights a checkpoint lacks are drawn with ``seed`` and recorded as untrained (`load_qa_model`)."""
    options = model.cluster_options()
    if model.model_name_or_path:
        defaults = {f.name: f.default for f in fields(ModelArguments)}
        unread = [f"--{name} {getattr(model, name)}" for name in FROM_SCRATCH_SIZES
                  if getattr(model, name) != defaults[name]]
        if unread:  # a checkpoint has its own sizes: asking for others is a mistake, not a setting
            raise ValueError(f"{', '.join(unread)}: sizes of a model built from scratch, which --model_name_or_path "
                             "does not read (the checkpoint has its own); leave them out (`clusterformer convert "
                             "--num-hidden-layers N` keeps a checkpoint's first N layers).")
        return load_qa_model(model.model_name_or_path, seed=seed, **options)
    config = ClusterFormerConfig(
        vocab_size=len(tokenizer),
        hidden_size=model.hidden_size,
        num_hidden_layers=model.num_hidden_layers,
        num_attention_heads=model.num_attention_heads,
        intermediate_size=model.intermediate_size,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        type_vocab_size=1,
        **{"max_context_length": max(data.max_seq_length or FROM_SCRATCH_LENGTH, 1), **options},
    )
    config.max_position_embeddings = required_position_embeddings(
        config.max_question_length, config.window_size, config.pad_token_id
    )
    check_centroid_memory(config, "--num_clusters")
    return ClusterFormerForQuestionAnswering(config)


# -- evaluation ---------------------------------------------------------------------------------------------------


def make_trainer(model, training_args: TrainingArguments, train_features, tokenizer, callbacks: list,
                 routed_learning_rate_scale: float = 1.0) -> Trainer:
    """A `Trainer` over one-feature-per-context QA data (dynamic padding per batch), its routed projections at
    ``routed_learning_rate_scale`` times the rate (`RoutedRateTrainer`); cluster statistics of centroid updates reach
    the reporting integrations (``report_to``)."""
    trainer = RoutedRateTrainer(
        model=model,
        args=training_args,
        train_dataset=train_features,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        callbacks=[*callbacks, FiniteTrainingCallback()],
        routed_learning_rate_scale=routed_learning_rate_scale,
    )
    for callback in callbacks:
        if isinstance(callback, CentroidUpdateCallback):
            callback.report_to_integrations(trainer)
    return trainer


def check_question_lengths(features: datasets.Dataset, config: ClusterFormerConfig, split: str) -> None:
    """Raise a `ValueError` with counts when questions exceed ``config.max_question_length`` (before any training);
    questions are found as the model finds them (`locate_question_prefix` at ``config.separator_token_id``)."""
    lengths = []
    for ids in features["input_ids"]:
        _, question, found = locate_question_prefix(torch.tensor([ids]) == config.separator_token_id)
        lengths.append(int(question) if bool(found) else 0)
    too_long = [i for i, n in enumerate(lengths) if n > config.max_question_length]
    if too_long:
        raise ValueError(
            f"{len(too_long)} of {len(lengths)} {split} questions have more than max_question_length="
            f"{config.max_question_length} tokens (longest {max(lengths)}; rows {too_long[:5]}...); pass "
            f"--max_question_length {max(lengths)} or shorten those questions.")


def predict_answers(
    trainer: Trainer,
    examples: datasets.Dataset,
    tokenizer,
    data: DataArguments,
) -> tuple[dict[str, str], dict[str, float]]:
    """Answer texts by example id, and the SQuAD EM/F1 of them (percentages)."""
    with question_fits(examples, tokenizer, data.max_seq_length):
        features = examples.map(
            prepare_validation_features,
            batched=True,
            remove_columns=examples.column_names,
            fn_kwargs={"tokenizer": tokenizer, "max_length": data.max_seq_length},
            desc="Tokenizing validation",
        )
    check_question_lengths(features, trainer.model.config, "validation")
    cut = sum(len(ids) >= data.max_seq_length for ids in features["input_ids"])
    if cut:
        logger.warning("%d of %d validation contexts were cut at %d tokens (--max_seq_length; the model reads up to "
                       "%d): answers past the cut cannot be found.", cut, len(features), data.max_seq_length,
                       trainer.model.config.max_input_length)
    model_inputs = features.remove_columns(
        [c for c in features.column_names if c not in ("input_ids", "attention_mask")]
    )
    output = trainer.predict(model_inputs)
    start_logits, end_logits, *answerable = output.predictions
    unanswerable = sum(not row["text"] for row in examples["answers"])
    if unanswerable and not answerable:
        logger.warning("%d of %d validation questions have no answer (SQuAD 2.0), which a model without the "
                       "answerability head (--use_answerability_head) never gives.", unanswerable, len(examples))
    predictions = postprocess_predictions(examples, features, start_logits, end_logits, data.max_answer_length,
                                          answerable_logits=answerable[0] if answerable else None)
    metric = load_squad_metric()
    scores = metric.compute(
        predictions=[{"id": k, "prediction_text": v} for k, v in predictions.items()],
        references=[{"id": row["id"], "answers": row["answers"]} for row in examples],
    )
    return predictions, {**scores, "contexts_truncated": cut}


# -- main ---------------------------------------------------------------------------------------------------------


#: Config values of the model a run trained or evaluated, recorded in ``all_results.json``: its sizes and every
#: model option.
_RECORDED_CONFIG = (*FROM_SCRATCH_SIZES, *(name for name in model_options() if name not in LAYER_KIND_SHORTCUTS))


def run(
    model_args: ModelArguments,
    data_args: DataArguments,
    centroid_args: CentroidArguments,
    training_args: TrainingArguments,
    callbacks: list | None = None,
) -> dict[str, Any]:
    """Train and/or evaluate; save model, tokenizer, metrics and model card to ``training_args.output_dir``.

    Training into an ``output_dir`` that holds a model or a run's records (`hf_clusterformer_files.RESULT_FILES`) is
    refused (`hf_clusterformer.hub.ModelFolderExistsError`) unless ``model_args.overwrite`` (or
    ``resume_from_checkpoint``); the run writes into a staging folder whose files are put in place in ``output_dir``
    when the run ends (`hf_clusterformer_writing.writing_model_dir`: only the library's own files are replaced). An
    evaluation writes its records over earlier ones (`main`, the command, refuses that without ``--overwrite``).

    Returns the metrics dict (train loss/time, eval EM/F1, truncation counts).
    """
    name = Path(training_args.output_dir).resolve().name
    with run_output_dir(training_args, model_args.overwrite, check_records=False):  # `main` checks an evaluation's
        return _run(model_args, data_args, centroid_args, training_args, callbacks, name)


def _train_features(raw_train: Any, tokenizer: Any, data_args: Any, model: Any, metrics: dict[str, Any]) -> Any:
    """The training set as features (one per example, answers as token positions), its question lengths checked;
    ``metrics["train_answers_truncated"]`` counts the answers lost to ``--max_seq_length``."""
    with question_fits(raw_train, tokenizer, data_args.max_seq_length):
        train_features = raw_train.map(
            prepare_train_features, batched=True, remove_columns=raw_train.column_names,
            fn_kwargs={"tokenizer": tokenizer, "max_length": data_args.max_seq_length, "stats": {}},
            load_from_cache_file=False, desc="Tokenizing training",
        )
    check_question_lengths(train_features, model.config, "training")
    truncated = sum(train_features["answer_truncated"])
    if truncated:
        logger.warning("%d of %d training answers were lost to truncation at %d tokens.", truncated,
                       len(train_features), data_args.max_seq_length)
    metrics["train_answers_truncated"] = truncated
    return train_features.remove_columns(["answer_truncated"])


def check_run_plan(training_args: TrainingArguments, raw: datasets.DatasetDict) -> None:
    """`ValueError` (one line) for a plan this command cannot carry out (data missing, evaluation during training)."""
    strategy = str(training_args.eval_strategy).rsplit(".", 1)[-1].lower()
    if strategy != "no":
        raise ValueError(f"--eval_strategy {strategy}: this command evaluates once, after training, on the validation "
                         "data (EM/F1; --do_eval), not during it; leave --eval_strategy (and "
                         "--load_best_model_at_end) out.")
    if training_args.do_train and "train" not in raw:
        raise ValueError("--do_train needs training data: give --train_file or a dataset with a train split.")
    if training_args.do_eval and "validation" not in raw:
        raise ValueError("evaluation needs validation data: give --validation_file or a --dataset with a validation "
                         "split.")


def _run(model_args, data_args, centroid_args, training_args, callbacks, name: str) -> dict[str, Any]:
    start = time.time()
    if training_args.dataloader_pin_memory and not torch.cuda.is_available():
        training_args.dataloader_pin_memory = False  # pinned memory needs an accelerator; torch warns each epoch
    raw = load_raw_datasets(data_args)
    check_run_plan(training_args, raw)
    tokenizer = load_tokenizer(model_args, data_args, raw, training_args.output_dir)
    set_seed(training_args.seed)  # before the model: a from-scratch initialisation follows --seed
    model = load_model(model_args, data_args, tokenizer, seed=training_args.seed)
    if model_args.model_name_or_path or model_args.tokenizer_name:
        check_tokenizer_fits(tokenizer, model.config, model_args.tokenizer_name or model_args.model_name_or_path)
    logger.info("model: %s", model.config.layer_kinds)
    if data_args.max_seq_length is None:  # the model's own limit: nothing is cut that the model could read
        data_args.max_seq_length = model.config.max_input_length
        tokenizer.model_max_length = max(tokenizer.model_max_length or 0, data_args.max_seq_length)
    if not training_args.do_train:
        check_trained(model, model_args.allow_untrained)

    metrics: dict[str, Any] = {}
    train_features = None
    if training_args.do_train:
        train_features = _train_features(raw["train"], tokenizer, data_args, model, metrics)

    all_callbacks = list(callbacks or [])
    if model.cluster_routers():  # cluster and window_cluster layers: centroids to fit
        all_callbacks.append(CentroidUpdateCallback(centroid_args.settings(), seed=training_args.seed))
    trainer = make_trainer(model, training_args, train_features, tokenizer, all_callbacks,
                           model_args.routed_learning_rate_scale)
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        metrics.update({k: v for k, v in result.metrics.items() if isinstance(v, (int, float))})
        trainer.save_model()
    if training_args.do_eval:
        predictions, scores = predict_answers(trainer, raw["validation"], tokenizer, data_args)
        metrics.update({"eval_exact_match": scores["exact_match"], "eval_f1": scores["f1"],
                        "eval_samples": len(raw["validation"]),
                        "eval_contexts_truncated": scores["contexts_truncated"]})
        if trainer.is_world_process_zero():
            os.makedirs(training_args.output_dir, exist_ok=True)
            with open(Path(training_args.output_dir) / "eval_predictions.json", "w", encoding="utf-8") as handle:
                json.dump(predictions, handle, indent=1)
    metrics["seconds"] = round(time.time() - start, 1)
    if trainer.is_world_process_zero():
        os.makedirs(training_args.output_dir, exist_ok=True)
        evaluated = {name: getattr(model.config, name, None) for name in _RECORDED_CONFIG}  # not the CLI's defaults
        results = {"metrics": metrics, "data": asdict(data_args),
                   "model": {"model_name_or_path": model_args.model_name_or_path, **evaluated}}
        with open(Path(training_args.output_dir) / "all_results.json", "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
        if training_args.do_train:  # code files, auto_map, tokenizer and card: `clusterformer push` takes it as it is
            card = {"model_id": name, **run_card_data(results)}
            if model_args.model_name_or_path and not os.path.exists(model_args.model_name_or_path):
                card["base_model"] = model_args.model_name_or_path
            write_checkpoint(trainer.model, tokenizer, training_args.output_dir, card_data=card)  # over save_model's
    return metrics


def main(argv: list[str] | None = None, prog: str | None = None, usage_errors_raise: bool = False) -> dict[str, Any]:
    """Entry point of examples/run_qa.py and ``clusterformer train`` / ``evaluate`` (see `parse_args`); an evaluation
    into a folder that holds a run's records (`hf_clusterformer_files.RESULT_FILES`) is refused without
    ``--overwrite``."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    logging.getLogger("faiss").setLevel(logging.WARNING)  # which SIMD build it loaded, on every run
    model_args, data_args, centroid_args, training_args = parse_args(argv, prog, usage_errors_raise)
    if not training_args.do_train:  # an evaluation: the records of an earlier run (which cards read) are kept
        check_result_files(training_args.output_dir, RESULT_FILES, model_args.overwrite, "--overwrite")
    metrics = run(model_args, data_args, centroid_args, training_args)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()}, indent=1))
    return metrics


__all__ = ["CentroidArguments", "DataArguments", "ModelArguments", "RoutedRateTrainer", "main", "run"]

