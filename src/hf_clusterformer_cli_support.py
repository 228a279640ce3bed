"""The error type and argument parser shared by the ``clusterformer`` command and ``hf_clusterformer.modelcard``.

A top-level module with no imports beyond the standard library, on the bottom floor (see ARCHITECTURE.md): the
command imports it without importing ``hf_clusterformer`` (torch, transformers), and the card generator imports it
without importing the command.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["CommandError", "OneLineParser"]


class CommandError(Exception):
    """A user error the command reports in one line (exit status 2)."""


class OneLineParser(argparse.ArgumentParser):
    """Subcommand parser whose usage errors are one line (exit status 2), like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(f"{message} (see `{self.prog} --help`)")
