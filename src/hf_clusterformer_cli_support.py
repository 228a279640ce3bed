"""The error type and argument parser shared by the ``clusterformer`` command and ``hf_clusterformer.modelcard``, the
command-line flags of a table of options (the command's and the scripts' model options), and which files of a folder
belong to a model (the write rule of every command and function that writes into a folder).

A top-level module with no imports beyond the standard library, on the bottom floor (see ARCHITECTURE.md): the
command imports it without importing ``hf_clusterformer`` (torch, transformers), and the card generator imports it
without importing the command.
"""

from __future__ import annotations

import argparse
import fnmatch
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

__all__ = [
    "MODEL_FILE_NAMES",
    "MODEL_FILE_PATTERNS",
    "RESULT_FILES",
    "CommandError",
    "OneLineParser",
    "add_option_flags",
    "owned_by_model",
]

#: Files a run writes beside its model (``clusterformer train`` / ``evaluate``): its records.
RESULT_FILES = ("all_results.json", "eval_predictions.json")
#: Names of the files a saved model or its run owns (config, weights, tokenizer, code, card, records): what
#: ``--overwrite`` replaces. Every other file in the folder (notes, logs) is the user's and is kept.
MODEL_FILE_NAMES = frozenset({
    "config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
    "pytorch_model.bin.index.json", "generation_config.json", *RESULT_FILES, "train_results.json", "eval_results.json",
    "trainer_state.json", "training_args.bin", "README.md", "configuration_clusterformer.py",
    "modeling_clusterformer.py", "pipeline.py", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
    "tokenizer.model", "chat_template.jinja",
})
#: Patterns of the other names a model or its run owns: weight shards, Trainer checkpoints, TensorBoard logs.
MODEL_FILE_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "checkpoint-*", "runs")


def owned_by_model(name: str) -> bool:
    """Whether a file or folder named ``name`` (in a model folder) belongs to the model or its run (see
    `MODEL_FILE_NAMES`, `MODEL_FILE_PATTERNS`); other names are the user's."""
    return name in MODEL_FILE_NAMES or any(fnmatch.fnmatchcase(name, pattern) for pattern in MODEL_FILE_PATTERNS)


class CommandError(Exception):
    """A user error the command reports in one line (exit status 2)."""


class OneLineParser(argparse.ArgumentParser):
    """Subcommand parser whose usage errors are one line (exit status 2), like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(f"{message} (see `{self.prog} --help`)")


def add_option_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    options: Iterable[Any],
    defaults: Mapping[str, Any] | None = None,
    types: Mapping[str, Callable[[str], Any]] | None = None,
    dashes: bool = True,
) -> None:
    """One flag per option of a table (rows with ``name``, ``item_type``, ``many``, ``default``, ``help`` and
    ``choices``, such as `hf_clusterformer.configuration_clusterformer.model_options`).

    A flag's default is ``defaults[name]`` when given (a script's recipe), else ``None`` (left out: the caller keeps
    what it has); its help names the default it stands for. Options that take lists take any number of values,
    booleans are ``--name`` / ``--no-name``, and ``types`` replaces the parser of one value of an option.
    """
    defaults = defaults or {}
    for option in options:
        flag = "--" + (option.name.replace("_", "-") if dashes else option.name)
        default = defaults.get(option.name)
        shown = default if option.name in defaults else option.default
        boolean = option.item_type is bool and not option.many
        named = shown is not None and not (boolean and default is not None)  # BooleanOptionalAction names its own
        text = option.help.replace("%", "%%") + (f" (default: {shown})" if named else "")
        settings: dict[str, Any] = {"default": default, "help": text}
        if boolean:
            settings["action"] = argparse.BooleanOptionalAction
        else:
            settings["type"] = (types or {}).get(option.name, option.item_type)
            if option.many:
                settings["nargs"] = "*"
            if option.choices:
                settings["choices"] = option.choices
        parser.add_argument(flag, **settings)
