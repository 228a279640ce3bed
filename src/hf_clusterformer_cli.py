"""The ``clusterformer`` command: train, evaluate, predict, inspect, convert, push, card and export.

A top-level module so that the command starts without importing ``hf_clusterformer`` (torch, transformers):
``clusterformer --help`` and the usage errors of predict, inspect and push are instant; each subcommand imports what
it needs (convert's model options and train's flags come from the library's config).
``python -m hf_clusterformer_cli`` is the same command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from hf_clusterformer_cli_support import (
    CommandError,
    OneLineParser,
    add_option_flags,
    context_length,
    convert_command,
    expand_home,
    expand_home_options,
    positive_int,
    read_text,
    version_line,
)
from hf_clusterformer_heads import architectures_task, find_head, head_names, head_tasks
from hf_clusterformer_sources import check_local_source

#: What the running command has finished writing (``{"done": ..., "pending": ...}``): a Ctrl-C that comes after the
#: output is complete ends the command with status 0 (`main`), saying so, or names what did not finish.
_PROGRESS: dict[str, str | None] = {"done": None, "pending": None}


def _finished(what: str | None, pending: str | None = None) -> None:
    """Record that ``what`` is complete on disk (and ``pending``, what the command still does after it)."""
    _PROGRESS.update(done=what, pending=pending)


def _read_inputs(args: argparse.Namespace) -> tuple[str, str]:
    """The question and the context file's text of predict / inspect."""
    context = read_text(args.context_file, "context file")
    if not context.strip():
        raise CommandError(f"context file {args.context_file} is empty; give a file with the context text.")
    if not args.question.strip():
        raise CommandError("the question is empty.")
    return args.question, context


#: The checkpoint argument of each subcommand that `check_usage` checks on disk: (attribute, its name in errors).
_CHECKPOINT_ARGUMENTS = {"predict": ("model", "checkpoint"), "inspect": ("model", "checkpoint"),
                         "export": ("model", "MODEL_DIR"), "push": ("checkpoint", "checkpoint")}


def check_usage(args: argparse.Namespace) -> None:
    """What a subcommand refuses before torch is imported, so that its usage errors take no time: the question and
    context file of predict / inspect (read into ``args.inputs``), a push source that is no directory, and a local
    checkpoint path that cannot load (a Hub id is checked later, with the library)."""
    if args.command in ("predict", "inspect"):
        args.inputs = _read_inputs(args)
    if args.command in _CHECKPOINT_ARGUMENTS:
        attribute, what = _CHECKPOINT_ARGUMENTS[args.command]
        try:
            check_local_source(getattr(args, attribute), what)
        except (OSError, TypeError) as error:
            raise CommandError(str(error)) from error
    # a name that could be a Hub id: push needs a folder
    if args.command == "push" and not os.path.isdir(args.checkpoint):
        raise CommandError(f"checkpoint directory {args.checkpoint} does not exist.")


def check_model_path(path: str, option: str = "checkpoint") -> None:
    """Fail fast on a missing local checkpoint directory, or on a Hub id when the Hub cannot be reached
    (`hf_clusterformer.loading.check_checkpoint_source`)."""
    from hf_clusterformer.loading import check_checkpoint_source

    try:
        check_checkpoint_source(path, option)
    except (OSError, TypeError) as error:
        raise CommandError(str(error)) from error


def check_cluster_former(path: str, command: str) -> None:
    """Refuse a plain RoBERTa or BERT checkpoint where a Cluster-Former one is needed (predict, inspect, card, push),
    saying what loading it would add and how to convert it."""
    from transformers import PretrainedConfig

    try:
        config, _ = PretrainedConfig.get_config_dict(path)
    except (OSError, ValueError) as error:
        raise CommandError(f"could not load a Cluster-Former checkpoint from {path}: {error}") from error
    kind = config.get("model_type")
    if kind == "clusterformer":
        if command == "predict":
            from hf_clusterformer.loading import check_question_answering_config

            try:
                check_question_answering_config(config, path)
            except ValueError as error:
                raise CommandError(str(error)) from error
        return
    if kind not in ("roberta", "bert"):
        raise CommandError(
            f"{path} is a {kind!r} checkpoint, not a Cluster-Former one; give a Cluster-Former checkpoint."
        )
    if command not in ("predict", "inspect"):
        raise CommandError(
            f"{path} is a plain {kind} checkpoint, not a Cluster-Former one; convert it first "
            f"(`{convert_command(path, config.get('architectures'))}`, which adds the cluster layers and can "
            "--push-to) "
            f"and {command} OUT."
        )
    from hf_clusterformer.configuration_clusterformer import ClusterFormerConfig, default_cluster_layers

    layers = default_cluster_layers(config.get("num_hidden_layers", 12))
    window, stride = ClusterFormerConfig.window_size, ClusterFormerConfig.window_stride
    question_answering = architectures_task(config.get("architectures")) == "question-answering"
    raise CommandError(
        f"{path} is a plain {kind} checkpoint, not a Cluster-Former one: {command} would add cluster layers {layers} "
        f"with random, never-fitted centroids and windows {window}/{stride} to it. Convert it first: `clusterformer "
        f"convert {path} OUT{'' if question_answering else ' --allow-untrained'}` "
        "(--cluster-layers with no value keeps "
        "sliding windows only), then fine-tune OUT (`clusterformer train --model_name_or_path OUT`)."
    )


def _weights_error(path: str, error: Exception) -> str:
    """A one-line message naming the unreadable safetensors file of checkpoint ``path``."""
    from hf_clusterformer.loading import unreadable_weights

    return unreadable_weights(path, error)


def _load_qa_model(path: str, max_context_length: int | None = None, command: str = "predict"):
    """A Cluster-Former QA model and its tokenizer from a checkpoint directory or Hub id, with clear errors (a plain
    RoBERTa or BERT checkpoint is refused: `check_cluster_former`)."""
    from safetensors import SafetensorError

    from hf_clusterformer.conversion import load_qa_model
    from hf_clusterformer.loading import check_tokenizer_fits, load_tokenizer

    check_model_path(path)
    check_cluster_former(path, command)
    options = {} if max_context_length is None else {"max_context_length": max_context_length}
    try:
        model = load_qa_model(path, **options)
        tokenizer = load_tokenizer(path)
        check_tokenizer_fits(tokenizer, model.config, path)
    except SafetensorError as error:
        raise CommandError(_weights_error(path, error)) from error
    except (OSError, ValueError, json.JSONDecodeError) as error:
        raise CommandError(f"could not load a Cluster-Former checkpoint from {path}: {error}") from error
    return model.eval(), tokenizer


def _device(value: str | None) -> str | None:
    """Check ``--device`` against this torch build."""
    if value is None:
        return None
    import torch

    try:
        device = torch.device(value)
    except RuntimeError as error:
        raise CommandError(f"--device {value} is not a device name; use cpu, cuda, cuda:1 or mps.") from error
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CommandError(
                f"--device {value}: this torch build ({torch.__version__}) sees no CUDA GPU; use --device cpu."
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CommandError(f"--device {value}: there are {torch.cuda.device_count()} CUDA devices; use cuda:0.")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise CommandError(f"--device {value}: MPS is not available here; use --device cpu.")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise CommandError(f"--device {value}: use cpu, cuda, cuda:1 or mps.")
    return value


def _option_value(argv: list[str], name: str) -> str | None:
    """The value of ``--name`` (either spelling, ``--name value`` or ``--name=value``) in a run_qa argument list."""
    spellings = {f"--{name}", f"--{name.replace('_', '-')}"}
    for index, token in enumerate(argv):
        option, equals, value = token.partition("=")
        if option in spellings:
            return value if equals else (argv[index + 1] if index + 1 < len(argv) else None)
    return None


#: Where ``train`` and ``evaluate`` write without ``--output_dir``.
DEFAULT_OUTPUT_DIR = "outputs/run_qa"
#: Where ``evaluate`` writes its records without ``--output_dir``: beside, not into, the trained model's default folder
#: (whose records of the training run would refuse them).
DEFAULT_EVALUATION_DIR = "outputs/evaluate"


def _cmd_train(argv: list[str], evaluate_only: bool, quiet: bool = False) -> int:
    from safetensors import SafetensorError

    from hf_clusterformer.qa_training import main as run_qa

    given = {token.partition("=")[0].replace("-", "_") for token in argv if token.startswith("--")}
    model_path = _option_value(argv, "model_name_or_path")
    if evaluate_only and model_path is None:
        raise CommandError("evaluate needs --model_name_or_path (a trained Cluster-Former checkpoint).")
    if evaluate_only and "__do_train" in given:
        raise CommandError("evaluate does not train: leave --do_train out, or use `clusterformer train` (which "
                           "evaluates too when validation data is given).")
    if model_path is not None:
        check_model_path(model_path, "--model_name_or_path")
    # Evaluate when there is validation data: a --train_file alone means training only.
    evaluate = evaluate_only or not (_option_value(argv, "train_file") and not _option_value(argv, "validation_file"))
    flags = (["--do_train"] if not evaluate_only else []) + (["--do_eval"] if evaluate else [])
    argv = list(argv) + [flag for flag in flags if flag.replace("-", "_") not in given]
    if "__disable_tqdm" not in given:  # the Trainer's progress bar, unless -q (quiet loading would turn it off)
        argv += ["--disable_tqdm", str(quiet)]
    if "__output_dir" not in given:
        argv += ["--output_dir", DEFAULT_EVALUATION_DIR if evaluate_only else DEFAULT_OUTPUT_DIR]
    try:
        run_qa(argv, prog=f"clusterformer {'evaluate' if evaluate_only else 'train'}", usage_errors_raise=True)
    except SafetensorError as error:
        raise CommandError(_weights_error(model_path or "", error)) from error
    except (OSError, ValueError) as error:  # data files, checkpoints and options
        raise CommandError(str(error)) from error
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    from hf_clusterformer.loading import pipeline

    question, context = args.inputs
    device = _device(args.device)
    model, tokenizer = _load_qa_model(args.model, args.max_context_length)
    from hf_clusterformer.modeling_clusterformer import UntrainedModelError

    try:
        qa = pipeline(model=model, tokenizer=tokenizer, device=device, allow_untrained=args.allow_untrained)
    except UntrainedModelError as error:
        message = str(error).replace("allow_untrained=True (--allow-untrained)", "--allow-untrained")
        raise CommandError(f"{args.model}: {message}") from error
    encoding = tokenizer(question, context)
    tokens = len(encoding["input_ids"])
    context_tokens = sum(1 for sequence in encoding.sequence_ids() if sequence == 1)
    if context_tokens > model.config.max_context_length:
        raise CommandError(
            f"context file {args.context_file} has {context_tokens} tokens, more than "
            + (f"--max-context-length {args.max_context_length}" if args.max_context_length is not None else
               f"the checkpoint's max_context_length ({model.config.max_context_length})")
            + f"; pass --max-context-length {context_tokens} or shorten the file."
        )
    start = time.perf_counter()
    try:
        answers = qa(question=question, context=context, top_k=args.top_k, align_to_words=args.align_to_words,
                     max_answer_len=args.max_answer_length)  # None: the pipeline's default
    except ValueError as error:
        raise CommandError(f"cannot answer over {args.context_file}: {error}") from error
    seconds = time.perf_counter() - start
    answers = answers if isinstance(answers, list) else [answers]
    if args.json:
        print(json.dumps({"answers": answers, "seconds": seconds, "tokens": tokens}, indent=1))
    else:
        for rank, answer in enumerate(answers, 1):
            print(
                f"{rank}. {answer['answer']!r}  score {answer['score']:.4f}  chars {answer['start']}-{answer['end']}"
            )
        print(f"{tokens} tokens in one forward pass, {seconds:.2f} s")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from hf_clusterformer.inspection import inspect_clusters

    question, context = args.inputs
    if args.plot:
        from hf_clusterformer.inspection import check_plot_path

        try:
            check_plot_path(args.plot, args.overwrite)
        except (OSError, ValueError) as error:
            raise CommandError(f"--plot {error}") from error
    model, tokenizer = _load_qa_model(args.model, args.max_context_length, "inspect")
    try:
        report = inspect_clusters(model, tokenizer, question, context, layer=args.layer)
    except ValueError as error:
        raise CommandError(str(error)) from error
    print(report.format(max_clusters=args.max_clusters))
    if args.plot:
        try:
            plot = report.plot(args.plot, overwrite=args.overwrite)
            _finished(f"{plot} was written")
            print(f"plot written to {plot}")
        except ImportError as error:
            raise CommandError(f"--plot {args.plot}: {error}") from error
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from safetensors import SafetensorError

    from hf_clusterformer.conversion import ConversionTaskError, convert_checkpoint
    from hf_clusterformer_files import ModelFolderExistsError, check_output_dir

    check_model_path(args.source, "source")
    if args.tokenizer is not None:
        check_model_path(args.tokenizer, "--tokenizer")
    if os.path.isdir(args.source) and Path(args.source).resolve() == Path(args.output_dir).resolve() \
            and not args.overwrite:
        raise CommandError(f"output folder {args.output_dir} is the source folder {args.source}; give another output "
                           "folder (or pass --overwrite to replace the source model with the converted one).")
    try:
        check_output_dir(args.output_dir, args.overwrite, "--overwrite")
    except OSError as error:
        raise CommandError(str(error)) from error
    from hf_clusterformer.conversion import model_options

    options = {name: getattr(args, name) for name in model_options()}
    try:
        converted = convert_checkpoint(
            args.source, args.output_dir, num_hidden_layers=args.num_hidden_layers, tokenizer=args.tokenizer,
            overwrite=args.overwrite,
            seed=args.seed, task=args.task, allow_untrained=args.allow_untrained, **options,
        )
    except ModelFolderExistsError as error:
        raise CommandError(str(error).replace("overwrite=True", "--overwrite")) from error
    except ConversionTaskError as error:
        raise CommandError(error.command) from error
    except SafetensorError as error:
        raise CommandError(_weights_error(args.source, error)) from error
    except (OSError, ValueError) as error:
        raise CommandError(f"could not convert {args.source}: {error}") from error
    config = converted.config
    task = find_head(converted.task).task
    _finished(f"{converted.path} was written in full",
              f"the push to {args.push_to} did not finish; run `clusterformer push {converted.path} {args.push_to}`"
              if args.push_to else None)
    print(f"wrote {converted.path}, a {task} model, from a {converted.source_type} checkpoint (layers "
          f"{config.layer_kinds}, {config.num_clusters} clusters, "
          f"windows {config.window_size}/{config.window_stride})")
    if converted.newly_initialized:
        print(f"newly initialised (train before use): {', '.join(converted.newly_initialized)}")

    if args.push_to:
        _push(str(converted.path), args.push_to, private=args.private)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    check_model_path(args.model, "MODEL_DIR")
    import logging

    from hf_clusterformer.export import ExportError, export_format, export_model

    notes = logging.getLogger("torch.onnx")  # a level set: export_model shows the exporters' notes (-v)
    level = notes.level
    if getattr(args, "verbose", False):
        notes.setLevel(logging.INFO)
    try:
        out = export_model(args.model, args.out, format=args.format, allow_untrained=args.allow_untrained,
                           overwrite=args.overwrite, quantize=args.quantize)
    except ExportError as error:
        raise CommandError(str(error).replace("allow_untrained=True (--allow-untrained)", "--allow-untrained")
                           .replace("overwrite=True (--overwrite)", "--overwrite")) from error
    finally:
        notes.setLevel(level)
    kind = args.format or export_format(out)
    _finished(f"{out} was written in full")
    print(f"wrote {out} ({kind}{', int8 weights' if args.quantize else ''}: dynamic batch and length); run it with "
          f"hf_clusterformer.export.load_exported({str(out)!r})")
    return 0


def _cmd_push(args: argparse.Namespace) -> int:
    check_model_path(args.checkpoint)
    check_cluster_former(args.checkpoint, "push")
    from hf_clusterformer.hub import check_repo_id

    try:
        check_repo_id(args.repo_id)
    except ValueError as error:
        raise CommandError(str(error)) from error
    return _push(args.checkpoint, args.repo_id, private=args.private, message=args.message)


def _push(checkpoint: str, repo_id: str, private: bool = False, message: str | None = None) -> int:
    """Upload a checkpoint directory; Hub and network failures become one-line errors."""
    import httpx
    from huggingface_hub.errors import HfHubHTTPError

    from hf_clusterformer.hub import check_hub_checkpoint, hub_files, push_model
    from hf_clusterformer.loading import hub_unreachable

    target = f"{checkpoint} to {repo_id}"
    problems = check_hub_checkpoint(checkpoint, hub_files(checkpoint)[0])  # before any connection
    if problems:
        raise CommandError(f"refusing to push {checkpoint}: {'; '.join(problems)}; write checkpoints with "
                           "`clusterformer train` or hf_clusterformer.hub.save_for_hub.")
    from hf_clusterformer.loading import check_finite_file

    try:
        check_finite_file(checkpoint, "a push")
    except ValueError as error:
        raise CommandError(str(error)) from error
    try:
        reason = hub_unreachable()
        if reason:
            raise ConnectionError(reason)
        options = {"commit_message": message} if message else {}
        info = push_model(checkpoint, repo_id, private=private, **options)
    except ValueError as error:
        raise CommandError(
            f"{error}; write checkpoints with `clusterformer train` or hf_clusterformer.hub.save_for_hub."
        ) from error
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        fix = (
            "log in with `hf auth login` or set HF_TOKEN to a token with write access"
            if status in (401, 403)
            else "retry later"
        )
        raise CommandError(f"the Hub refused to push {target} (HTTP {status}); {fix}.") from error
    except (OSError, httpx.HTTPError) as error:  # unreachable, or the connection dropped during the upload
        raise CommandError(f"cannot push {target}: {error}; check the network or HF_ENDPOINT.") from error
    commit = getattr(info, "oid", info)
    _finished(f"{target} was pushed (commit {commit})")
    print(f"pushed {target}: commit {commit}; pin it where the code is loaded remotely: "
          f"from_pretrained({repo_id!r}, trust_remote_code=True, revision={str(commit)!r})")
    skipped = Counter(name.split("/")[0] + ("/" if "/" in name else "") for name in hub_files(checkpoint)[1])
    if skipped:
        listed = ", ".join(
            name + (f" ({count} files)" if name.endswith("/") else "") for name, count in skipped.items()
        )
        print(f"skipped (training state, not uploaded): {listed}")
    return 0


def _add_model_option_flags(convert: argparse.ArgumentParser) -> None:
    """``convert``'s flags for the model options, from `hf_clusterformer.conversion.model_options`
    (names, types, defaults and help of `ClusterFormerConfig`); unset, they are ``None``."""
    from hf_clusterformer.conversion import model_options

    options = convert.add_argument_group("model options (left out: a Cluster-Former source's own, else the default)")
    add_option_flags(options, model_options().values(), types={"max_context_length": context_length})


def _add_predict_and_inspect(commands: argparse._SubParsersAction, library_defaults: bool) -> None:
    """The ``predict`` and ``inspect`` subcommands: a model, a question and a context file. ``predict``'s help names
    the pipeline's default answer length only with ``library_defaults`` (it loads the library)."""
    max_answer_tokens = "the pipeline's"
    if library_defaults:
        from hf_clusterformer.pipeline import MAX_ANSWER_TOKENS

        max_answer_tokens = str(MAX_ANSWER_TOKENS)
    for name, text in (("predict", "answer a question over a long context file"),
                       ("inspect", "show which tokens share a cluster (paper Table 6)")):
        command = commands.add_parser(name, help=text)
        command.add_argument("model", help="Cluster-Former QA checkpoint (directory or Hub id)")
        command.add_argument("--question", required=True)
        command.add_argument("--context-file", required=True, help="UTF-8 text file with the context (- reads it "
                             "from standard input)")
        command.add_argument("--max-context-length", type=context_length, default=None,
                             help="raise the checkpoint's context limit (tokens)")
        if name == "predict":
            command.add_argument("--top-k", type=positive_int, default=1)
            command.add_argument("--max-answer-length", type=positive_int, default=None,
                                 help=f"longest answer in tokens (default: {max_answer_tokens})")
            command.add_argument("--align-to-words", action="store_true",
                                 help="widen an answer that starts or ends inside a word to the whole word")
            command.add_argument("--device", default=None, help="e.g. cpu, cuda, cuda:1")
            command.add_argument("--json", action="store_true", help="print JSON")
            command.add_argument("--allow-untrained", action="store_true",
                                 help="answer even with a QA head that was never trained (smoke tests)")
        else:
            command.add_argument("--layer", type=int, default=None, help="cluster layer index (default: the first)")
            command.add_argument("--max-clusters", type=positive_int, default=20)
            command.add_argument("--plot", default=None,
                                 help="write a plot of cluster id against position to this .png, .pdf or .svg file "
                                      "(needs matplotlib)")
            command.add_argument("--overwrite", action="store_true", help="replace an existing --plot file")


def _add_export(commands: argparse._SubParsersAction) -> None:
    """The ``export`` subcommand."""
    export = commands.add_parser(
        "export", help="export a checkpoint to ONNX or a torch.export program (dynamic batch and length)",
        description="Trace MODEL_DIR once with torch.export; the file takes inputs of any batch size and length. Run "
                    "it with hf_clusterformer.export.load_exported(OUT), which checks each batch and adds the two "
                    "size inputs the program reads its layout from.",
    )
    export.add_argument("model", metavar="MODEL_DIR", help="Cluster-Former checkpoint (directory or Hub id)")
    export.add_argument("out", metavar="OUT", help="file to write (e.g. model.onnx or model.pt2)")
    export.add_argument("--format", choices=("onnx", "torch"), default=None,
                        help="onnx (run with onnxruntime) or torch (load with torch.export.load); default: by OUT's "
                             "suffix (.onnx, .pt2), ONNX for any other")
    export.add_argument("--quantize", choices=("int8",), default=None,
                        help="int8: ONNX matrix products with int8 weights (onnxruntime's dynamic quantization): "
                             "smaller and faster on CPU, outputs close to fp32")
    export.add_argument("--allow-untrained", action="store_true", help="export a head that was never trained")
    export.add_argument("--overwrite", action="store_true", help="replace an existing OUT")


def _add_convert(commands: argparse._SubParsersAction, model_options: bool) -> None:
    """The ``convert`` subcommand (its model option flags only with ``model_options``)."""
    convert = commands.add_parser(
        "convert",
        help="turn a RoBERTa, BERT-family or Cluster-Former checkpoint into a Cluster-Former one (and push it)",
        description="Options left out keep a Cluster-Former source's own settings, else the defaults shown.",
    )
    convert.add_argument("source", help="RoBERTa, BERT-family (BERT, MiniLM, bge, e5) or Cluster-Former checkpoint "
                                        "(directory or Hub id)")
    convert.add_argument("output_dir")
    convert.add_argument("--num-hidden-layers", type=int, default=None, help="keep only the first N layers")
    convert.add_argument("--tokenizer", default=None,
                         help="tokenizer folder or Hub id to save with the result (default: the source's own)")
    convert.add_argument("--overwrite", action="store_true",
                         help="replace a model already in OUTPUT_DIR, and files of yours with a model file's name "
                         "(other files are kept)")
    keys = head_names()[len(head_tasks()):]
    convert.add_argument("--task", choices=list(head_names()), default=None,
                         help="the head to build, by its pipeline task or its key (" + ", ".join(keys) + "; default: "
                              "a Cluster-Former source's own, else question-answering); a head the source lacks is "
                              "new: it needs --allow-untrained")
    convert.add_argument("--allow-untrained", action="store_true",
                         help="build a head the source lacks (or holds untrained): new weights, to fine-tune")
    convert.add_argument("--seed", type=int, default=0,
                         help="seed of the newly initialised weights (default: %(default)s)")
    convert.add_argument("--push-to", default=None, help="Hub repo id to push the result to")
    convert.add_argument("--private", action="store_true")
    if model_options:
        _add_model_option_flags(convert)


def build_parser(model_options: bool = False, library_defaults: bool = False) -> argparse.ArgumentParser:
    """The command's parser; ``convert`` gets its model option flags only with ``model_options``, and ``predict``'s
    help its library defaults only with ``library_defaults`` (they load the library, which ``clusterformer --help``
    and the commands' usage errors do without)."""
    parser = argparse.ArgumentParser(
        prog="clusterformer", allow_abbrev=False,
        description="Cluster-Former: long-context extractive QA with clustering-based sparse attention.",
        epilog="Options take dashes or underscores (--max-answer-length or --max_answer_length). -v (--verbose) "
               "shows progress bars and the libraries' loading reports; -q (--quiet) hides the progress bar of "
               "train and evaluate.",
    )
    parser.add_argument("--version", action="version", version=version_line(),
                        help="show the versions of this package, transformers and torch, and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    commands.required = True

    commands.add_parser(
        "train",
        help=f"train (and evaluate) on generated, multi-passage or SQuAD-format data, into --output_dir (default "
             f"{DEFAULT_OUTPUT_DIR})",
        description="Train and evaluate; all options of examples/run_qa.py apply (see `clusterformer train --help`).",
        add_help=False,
    )
    commands.add_parser(
        "evaluate",
        help=f"evaluate a trained checkpoint (EM/F1); records into --output_dir (default {DEFAULT_EVALUATION_DIR})",
        description="Evaluate --model_name_or_path; all options of examples/run_qa.py apply.",
        add_help=False,
    )
    commands.add_parser(
        "card",
        help="write the model card (README.md) of a checkpoint, with its results",
        description="Write a model card; see `clusterformer card --help`.",
        add_help=False,
    )

    _add_predict_and_inspect(commands, library_defaults)
    _add_convert(commands, model_options)
    _add_export(commands)
    push = commands.add_parser(
        "push", help="push a Cluster-Former checkpoint directory (weights, centroids, code, card)"
    )
    push.add_argument("checkpoint")
    push.add_argument("repo_id")
    push.add_argument("--private", action="store_true")
    push.add_argument("--message", default="Upload Cluster-Former checkpoint")
    return parser


def _dash_options(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--max_answer_length`` spelt as the subcommand's ``--max-answer-length`` (both spellings work everywhere)."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = commands.choices.get(argv[0]) if argv else None
    if command is None:
        return argv
    known = {option for action in command._actions for option in action.option_strings}
    normalised = [argv[0]]
    for token in argv[1:]:
        option, equals, value = token.partition("=")
        dashed = "--" + option[2:].replace("_", "-")
        normalised.append(dashed + equals + value if option.startswith("--") and dashed in known else token)
    return normalised


@contextlib.contextmanager
def _quiet(verbose: bool, datasets_bars: bool = False) -> Iterator[None]:
    """Without ``-v``: no loading/saving progress bars and no transformers reports below errors (restored after);
    this package's own warnings (unfitted centroids) still show, once."""
    if verbose:
        yield
        return
    from hf_clusterformer.hub import quiet_loading

    with quiet_loading(datasets_bars):
        yield


def main(argv: list[str] | None = None) -> int:
    """The command; ``argv`` defaults to the process's (the console script, which also ignores a Ctrl-C that comes
    while the process ends after a complete output)."""
    _finished(None)
    code = _main(list(sys.argv[1:] if argv is None else argv))
    if argv is None and _PROGRESS["done"] is not None and _PROGRESS["pending"] is None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


def _main(argv: list[str]) -> int:
    verbose = any(token in ("-v", "--verbose") for token in argv)
    quiet = any(token in ("-q", "--quiet") for token in argv)
    argv = [token for token in argv if token not in ("-v", "--verbose", "-q", "--quiet")]
    try:
        if argv and argv[0] in ("train", "evaluate"):
            argv = [argv[0], *expand_home_options(argv[1:])]  # run_qa's parser: a quoted ~ in a path option
            training_help = "--help-training" in argv[1:]
            if training_help or "-h" in argv[1:] or "--help" in argv[1:]:
                from hf_clusterformer.qa_training import print_help

                print_help(prog=f"clusterformer {argv[0]}", training=training_help,
                           output_dir=DEFAULT_EVALUATION_DIR if argv[0] == "evaluate" else DEFAULT_OUTPUT_DIR)
                raise SystemExit(0)
            with _quiet(verbose, datasets_bars=True):
                return _cmd_train(argv[1:], evaluate_only=argv[0] == "evaluate", quiet=quiet)
        if argv and argv[0] == "card":
            from hf_clusterformer.modelcard import main as card

            return card(argv[1:], prog="clusterformer card")
        command = argv[0] if argv else None
        asks_help = any(token in ("-h", "--help") for token in argv[1:])
        parser = build_parser(model_options=command == "convert", library_defaults=command == "predict" and asks_help)
        args, unknown = parser.parse_known_args(_dash_options(parser, argv))
        if unknown:
            commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            commands.choices[args.command].error("unrecognized arguments: " + " ".join(unknown))
        handler = {"predict": _cmd_predict, "inspect": _cmd_inspect, "convert": _cmd_convert, "push": _cmd_push,
                   "export": _cmd_export}
        args.verbose = verbose
        for name in ("model", "source", "output_dir", "out", "checkpoint", "context_file", "plot"):
            if isinstance(getattr(args, name, None), str):  # a quoted ~ (a script's) as the shell would expand it
                setattr(args, name, expand_home(getattr(args, name)))
        check_usage(args)
        with _quiet(verbose):
            return handler[args.command](args)
    except CommandError as error:
        print(f"clusterformer: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # a write says what the folder holds now; elsewhere nothing was written
        done, pending = _PROGRESS["done"], _PROGRESS["pending"]
        if done is not None:  # after the output was complete: nothing is lost, unless more was to come
            print(f"clusterformer: interrupted after {done}" + (f"; {pending}" if pending else ""), file=sys.stderr)
            return 130 if pending else 0
        print(f"clusterformer: {' '.join(str(error).split()) or 'interrupted; nothing was written'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`... | head`): what it took was printed; no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
