"""The error type and argument parser shared by the ``clusterformer`` command and ``hf_clusterformer.modelcard``, the
command-line flags of a table of options (the command's and the scripts' model options), and what the command checks
before importing torch: the context-length limit, the count options, a context file read in one-line errors, the
version line and the command that converts a checkpoint keeping its head. (Which
files of a folder a model owns: `hf_clusterformer_files`; the heads: `hf_clusterformer_heads`.)

A top-level module with no imports beyond the standard library and `hf_clusterformer_heads`, on the bottom floor (see
ARCHITECTURE.md): the command imports it without importing ``hf_clusterformer`` (torch, transformers), and the card
generator imports it without importing the command.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from hf_clusterformer_heads import architectures_task

__all__: list[str] = []  # the command's own helpers: nothing users call

#: Most context tokens a converted or loaded model may be set to take: 16M tokens, far beyond what one forward pass
#: fits in memory (``max_context_length``; here so that the command's usage errors need no torch).
MAX_CONTEXT_LENGTH = 1 << 24


def convert_command(path: object, architectures: Iterable[str] | None) -> str:
    """The ``clusterformer convert`` of a plain RoBERTa or BERT checkpoint whose config names ``architectures`` that
    keeps its head (``--task`` for one other than question answering; ``--allow-untrained`` for a plain encoder, whose
    question-answering head would be new)."""
    task = architectures_task(architectures)
    if task is None:
        return f"clusterformer convert {path} OUT --allow-untrained"
    return f"clusterformer convert {path} OUT" + ("" if task == "question-answering" else f" --task {task}")


class CommandError(Exception):
    """A user error the command reports in one line (exit status 2)."""


def expand_home(path: str | None) -> str | None:
    """``path`` with a leading ``~`` or ``~user`` expanded, as the shell does for an unquoted path (a quoted one in a
    script reaches the command as it is); `CommandError` when there is no such home folder."""
    if not path or not path.startswith("~"):
        return path
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        raise CommandError(f"{path}: there is no home folder {path.split('/')[0]}; give the full path.")
    return expanded


#: The command's options that name a file or folder (``~`` in them is expanded: `expand_home`).
PATH_OPTIONS = ("model_name_or_path", "tokenizer_name", "train_file", "validation_file", "output_dir",
                "resume_from_checkpoint", "spec", "config", "results", "out", "plot", "context_file")


def expand_home_options(argv: list[str]) -> list[str]:
    """``argv`` with `expand_home` applied to the values of `PATH_OPTIONS` (``--name value`` or ``--name=value``,
    dashes or underscores)."""
    names = {f"--{name}" for option in PATH_OPTIONS for name in (option, option.replace("_", "-"))}
    result = list(argv)
    for index, token in enumerate(result):
        option, equals, value = token.partition("=")
        if option in names and equals:
            result[index] = f"{option}={expand_home(value)}"
        elif index and result[index - 1] in names and not token.startswith("-"):
            result[index] = expand_home(token)
    return result


def unknown_options(tokens: list[str], known: Iterable[str]) -> str:
    """What a parser left of the command line (``tokens``): its options, each with the option it may mean (a typo,
    or an abbreviation: options are taken only in full, so that a script keeps its meaning when options are added),
    else its stray arguments."""
    known = sorted({option.replace("_", "-") for option in known if option.startswith("--")})
    options = [token for token in tokens if token.startswith("-")]
    if not options:
        return ("unexpected arguments " if len(tokens) > 1 else "unexpected argument ") + " ".join(tokens)
    said = []
    for token in options:
        option = token.partition("=")[0].replace("_", "-")
        close = difflib.get_close_matches(option, known, n=1, cutoff=0.75)
        meant = close or [name for name in known if name.startswith(option)]
        said.append(token + (f" (did you mean {meant[0]}?)" if option.startswith("--") and meant else ""))
    return ("unknown options " if len(said) > 1 else "unknown option ") + ", ".join(said)


class OneLineParser(argparse.ArgumentParser):
    """Subcommand parser whose usage errors are one line (exit status 2), like every other error of the command;
    options are taken only in full (`unknown_options`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            tokens = message.removeprefix("unrecognized arguments: ").split()
            message = unknown_options(tokens, (o for a in self._actions for o in a.option_strings))
        raise CommandError(f"{message} (see `{self.prog} --help`)")


def add_option_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    options: Iterable[Any],
    defaults: Mapping[str, Any] | None = None,
    types: Mapping[str, Callable[[str], Any]] | None = None,
    dashes: bool = True,
) -> None:
    """One flag per option of a table (rows with ``name``, ``item_type``, ``many``, ``default``, ``help`` and
    ``choices``, such as `hf_clusterformer.conversion.model_options`).

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


def positive_int(value: str) -> int:
    """A count option's value: a positive integer."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return number


def context_length(value: str) -> int:
    """A ``--max-context-length``: a positive integer up to `MAX_CONTEXT_LENGTH`."""
    number = positive_int(value)
    if number > MAX_CONTEXT_LENGTH:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_CONTEXT_LENGTH} tokens, got {value}")
    return number


def read_text(path: str, what: str) -> str:
    """A UTF-8 text file (``-``: standard input) as it is, line ends included (so answer offsets index the file's own
    characters, from a file and from standard input alike), with one-line errors naming it."""
    try:
        if path == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        if os.path.isdir(path):
            raise CommandError(f"{what} {path} is a folder; give a text file (or - for standard input).")
        if not os.path.isfile(path):
            raise CommandError(f"{what} {path} does not exist.")
        return Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise CommandError(
            f"{what} {path} is not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}); "
            "save it as UTF-8."
        ) from error


def version_line() -> str:
    """``clusterformer X (transformers Y, torch Z, Python V)`` from the installed distributions (no import of them)."""
    def installed(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return (f"clusterformer {installed('hf-clusterformer')} (transformers {installed('transformers')}, torch "
            f"{installed('torch')}, Python {platform.python_version()})")
