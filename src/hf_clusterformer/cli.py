"""The ``clusterformer`` command: train, evaluate, predict, inspect, convert and push Cluster-Former models."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


class CommandError(Exception):
    """A user error the command reports in one line (exit status 2)."""


def _read_context(path: str) -> str:
    if not os.path.isfile(path):
        raise CommandError(f"context file {path} does not exist.")
    text = Path(path).read_text(encoding="utf-8")
    if not text.strip():
        raise CommandError(f"context file {path} is empty; give a file with the context text.")
    return text


def _load_qa_model(path: str):
    """A Cluster-Former QA model and its tokenizer from a checkpoint directory or Hub id, with clear errors."""
    from transformers import AutoTokenizer

    from .modeling_clusterformer import ClusterFormerForQuestionAnswering

    if os.path.isfile(path):
        raise CommandError(f"checkpoint {path} is a file; give the checkpoint directory (with config.json).")
    if not os.path.isdir(path) and path.startswith((".", "/", "~")):
        raise CommandError(f"checkpoint directory {path} does not exist.")
    try:
        model = ClusterFormerForQuestionAnswering.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, json.JSONDecodeError) as error:
        raise CommandError(f"could not load a Cluster-Former checkpoint from {path}: {error}") from error
    return model.eval(), tokenizer


def _cmd_train(argv: list[str], evaluate_only: bool) -> int:
    from .qa_training import main as run_qa

    flags = ["--do_eval"] if evaluate_only else ["--do_train", "--do_eval"]
    argv = list(argv) + [flag for flag in flags if flag not in argv]
    if evaluate_only and "--model_name_or_path" not in argv:
        raise CommandError("evaluate needs --model_name_or_path (a trained Cluster-Former checkpoint).")
    if "--output_dir" not in argv:
        argv += ["--output_dir", "outputs/run_qa"]
    try:
        run_qa(argv, prog=f"clusterformer {'evaluate' if evaluate_only else 'train'}")
    except (FileNotFoundError, ValueError) as error:
        raise CommandError(str(error)) from error
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    from .pipeline import pipeline

    context = _read_context(args.context_file)
    if not args.question.strip():
        raise CommandError("the question is empty.")
    model, tokenizer = _load_qa_model(args.model)
    qa = pipeline(model=model, tokenizer=tokenizer, device=args.device)
    start = time.perf_counter()
    answers = qa(question=args.question, context=context, top_k=args.top_k, max_answer_len=args.max_answer_length)
    seconds = time.perf_counter() - start
    answers = answers if isinstance(answers, list) else [answers]
    tokens = len(tokenizer(args.question, context)["input_ids"])
    if args.json:
        print(json.dumps({"answers": answers, "seconds": seconds, "tokens": tokens}, indent=1))
    else:
        for rank, answer in enumerate(answers, 1):
            print(f"{rank}. {answer['answer']!r}  score {answer['score']:.4f}  chars {answer['start']}-{answer['end']}")
        print(f"{tokens} tokens in one forward pass, {seconds:.2f} s")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .inspection import inspect_clusters

    context = _read_context(args.context_file)
    model, tokenizer = _load_qa_model(args.model)
    try:
        report = inspect_clusters(model, tokenizer, args.question, context, layer=args.layer)
    except ValueError as error:
        raise CommandError(str(error)) from error
    print(report.format(max_clusters=args.max_clusters))
    if args.plot:
        print(f"plot written to {report.plot(args.plot)}")
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from .hub import convert_roberta_checkpoint, push_model

    try:
        converted = convert_roberta_checkpoint(
            args.source,
            args.output_dir,
            cluster_layers=args.cluster_layers,
            num_clusters=args.num_clusters,
            window_size=args.window_size,
            window_stride=args.window_stride,
            global_layer_type=args.global_layer_type,
            max_question_length=args.max_question_length,
            use_answerability_head=args.answerability_head,
        )
    except (OSError, ValueError) as error:
        raise CommandError(f"could not convert {args.source}: {error}") from error
    print(f"wrote {converted.path} (cluster layers {converted.config.cluster_layers}, {converted.config.num_clusters} clusters)")
    if converted.newly_initialized:
        print(f"newly initialised (train before use): {', '.join(converted.newly_initialized)}")
    if args.push_to:
        info = push_model(converted.path, args.push_to, private=args.private)
        print(f"pushed to {args.push_to}: {getattr(info, 'oid', info)}")
    return 0


def _cmd_push(args: argparse.Namespace) -> int:
    from .hub import push_model

    if not os.path.isdir(args.checkpoint):
        raise CommandError(f"checkpoint directory {args.checkpoint} does not exist.")
    try:
        info = push_model(args.checkpoint, args.repo_id, private=args.private, commit_message=args.message)
    except ValueError as error:
        raise CommandError(str(error)) from error
    print(f"pushed {args.checkpoint} to {args.repo_id}: {getattr(info, 'oid', info)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clusterformer",
        description="Cluster-Former: long-context extractive QA with clustering-based sparse attention.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    commands.add_parser(
        "train",
        help="train (and evaluate) on generated, multi-passage or SQuAD-format data",
        description="Train and evaluate; all options of examples/run_qa.py apply (see `clusterformer train --help`).",
        add_help=False,
    )
    commands.add_parser(
        "evaluate",
        help="evaluate a trained checkpoint (EM/F1)",
        description="Evaluate --model_name_or_path; all options of examples/run_qa.py apply.",
        add_help=False,
    )

    predict = commands.add_parser("predict", help="answer a question over a long context file")
    predict.add_argument("model", help="Cluster-Former QA checkpoint (directory or Hub id)")
    predict.add_argument("--question", required=True)
    predict.add_argument("--context-file", required=True, help="UTF-8 text file with the context")
    predict.add_argument("--top-k", type=int, default=1)
    predict.add_argument("--max-answer-length", type=int, default=30, help="in tokens")
    predict.add_argument("--device", default=None, help="e.g. cpu, cuda, cuda:1")
    predict.add_argument("--json", action="store_true", help="print JSON")

    inspect = commands.add_parser("inspect", help="show which tokens share a cluster (paper Table 6)")
    inspect.add_argument("model")
    inspect.add_argument("--question", required=True)
    inspect.add_argument("--context-file", required=True)
    inspect.add_argument("--layer", type=int, default=None, help="cluster layer index (default: the first)")
    inspect.add_argument("--max-clusters", type=int, default=20)
    inspect.add_argument("--plot", default=None, help="write a PNG of cluster id against position (needs matplotlib)")

    convert = commands.add_parser("convert", help="turn a RoBERTa checkpoint into a Cluster-Former one (and push it)")
    convert.add_argument("source", help="RoBERTa / RobertaForQuestionAnswering checkpoint (directory or Hub id)")
    convert.add_argument("output_dir")
    convert.add_argument("--cluster-layers", type=int, nargs="*", default=None, help="0-based (default: paper placement)")
    convert.add_argument("--num-clusters", type=int, default=64)
    convert.add_argument("--window-size", type=int, default=256)
    convert.add_argument("--window-stride", type=int, default=224)
    convert.add_argument("--global-layer-type", default="cluster", choices=["cluster", "lsh", "sparse"])
    convert.add_argument("--max-question-length", type=int, default=64)
    convert.add_argument("--answerability-head", action="store_true")
    convert.add_argument("--push-to", default=None, help="Hub repo id to push the result to")
    convert.add_argument("--private", action="store_true")

    push = commands.add_parser("push", help="push a Cluster-Former checkpoint directory (weights, centroids, code, card)")
    push.add_argument("checkpoint")
    push.add_argument("repo_id")
    push.add_argument("--private", action="store_true")
    push.add_argument("--message", default="Upload Cluster-Former checkpoint")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        if argv and argv[0] in ("train", "evaluate"):
            if "-h" in argv[1:] or "--help" in argv[1:]:
                from .qa_training import parse_args

                parse_args(["--help"], prog=f"clusterformer {argv[0]}")
            return _cmd_train(argv[1:], evaluate_only=argv[0] == "evaluate")
        args = parser.parse_args(argv)
        handler = {"predict": _cmd_predict, "inspect": _cmd_inspect, "convert": _cmd_convert, "push": _cmd_push}
        return handler[args.command](args)
    except CommandError as error:
        print(f"clusterformer: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
