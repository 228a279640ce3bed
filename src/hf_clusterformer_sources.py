"""What a checkpoint folder holds and whether a local checkpoint path can load at all: the ``model_type`` of its
config (`checkpoint_kind`), Trainer ``checkpoint-*`` folders (`is_trainer_checkpoint`, `last_checkpoint`), and the
fail-fast check of a checkpoint argument (`check_local_source`, the command's usage check before torch; `looks_local`
tells a path from a Hub id).

A top-level module with no imports beyond the standard library, on the bottom floor (see ARCHITECTURE.md): the
command imports it without importing ``hf_clusterformer`` (torch, transformers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["check_local_source", "checkpoint_kind"]


def looks_local(path: str) -> bool:
    """Whether a model argument is meant as a directory rather than a Hub id (``name`` or ``user/name``): it starts
    with ``.``, ``/`` or ``~``, has more than one ``/``, ends with one, or starts with an existing folder."""
    return path.startswith((".", "/", "~", "\\")) or path.count("/") > 1 or path.endswith("/") or (
        "/" in path and os.path.isdir(path.split("/")[0])
    )


def check_local_source(source: Any, what: str = "checkpoint") -> str:
    """``source`` (a checkpoint directory or Hub id) as a string, after failing fast in one line on what cannot load
    without asking the Hub: `TypeError` (not a str or path), `NotADirectoryError` (a file), `FileNotFoundError` (a
    folder without ``config.json``, or a missing path that `looks_local`). A name that may be a Hub id passes."""
    if isinstance(source, bytes) or not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"{what} must be a checkpoint directory or Hub id (a str or path), got "
                        f"{type(source).__name__} {source!r}.")
    path = os.fspath(source)
    if os.path.isfile(path):
        raise NotADirectoryError(f"{what} {path} is a file; give the checkpoint directory (with config.json).")
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"{what} {path} has no config.json; give a checkpoint directory.")
    elif isinstance(source, os.PathLike) or looks_local(path):
        raise FileNotFoundError(f"{what} directory {path} does not exist.")
    return path


def checkpoint_kind(path: str | os.PathLike) -> str | None:
    """The ``model_type`` of a local checkpoint folder's ``config.json`` (``"clusterformer"``, ``"roberta"``, ...), or
    None when ``path`` is no folder with a readable config."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def is_trainer_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a Trainer checkpoint folder (``checkpoint-*`` holding its ``trainer_state.json``)."""
    path = Path(path)
    return (path.name.startswith("checkpoint-") and not path.is_symlink() and path.is_dir()
            and (path / "trainer_state.json").is_file())


def last_checkpoint(folder: str | os.PathLike) -> str | None:
    """The Trainer checkpoint in ``folder`` with the most steps (``resume_from_checkpoint=True``), or None."""
    found = [p for p in Path(folder).glob("checkpoint-*") if p.name[11:].isdigit() and is_trainer_checkpoint(p)]
    return str(max(found, key=lambda p: int(p.name[11:]))) if found else None
