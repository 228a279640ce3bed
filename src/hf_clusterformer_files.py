"""File policy of every writer: which files of a folder a model or its run owns, the modes new files get, writing a
model folder all at once, and what kind of checkpoint a folder holds.

A top-level module with no imports beyond the standard library, on the bottom floor (see ARCHITECTURE.md): the
command imports it without importing ``hf_clusterformer`` (torch, transformers). The write rule: a folder that holds a
model is replaced only when asked (``--overwrite`` / ``overwrite=True``), and then only the model's own files
(`owned_by_model`); every other file in it (notes, logs, a hand-written README next to no model) is the user's.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "CLUSTERFORMER_MODEL_TYPE",
    "CODE_FILES",
    "MODEL_FILE_NAMES",
    "MODEL_FILE_PATTERNS",
    "MODEL_MARKER_FILES",
    "RESULT_FILES",
    "TOKENIZER_FILES",
    "ModelFolderExistsError",
    "apply_default_modes",
    "check_output_dir",
    "check_result_files",
    "checkpoint_kind",
    "default_mode",
    "holds_model",
    "owned_by_model",
    "writing_model_dir",
]

#: ``model_type`` of a Cluster-Former checkpoint's ``config.json``.
CLUSTERFORMER_MODEL_TYPE = "clusterformer"
#: The code files a self-contained checkpoint carries beside its weights (what ``trust_remote_code`` loads).
CODE_FILES = ("configuration_clusterformer.py", "modeling_clusterformer.py", "pipeline.py")
#: Files a run writes beside its model (``clusterformer train`` / ``evaluate``): its records.
RESULT_FILES = ("all_results.json", "eval_predictions.json")
#: Files of which a saved tokenizer has at least one.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.model")
#: Files whose presence makes a folder hold a model (its config or weights).
MODEL_MARKER_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
#: Names of the files a saved model or its run owns (config, weights, tokenizer, code, card, records): what
#: ``--overwrite`` replaces. Every other file in the folder (notes, logs) is the user's and is kept.
MODEL_FILE_NAMES = frozenset({
    *MODEL_MARKER_FILES, "pytorch_model.bin.index.json", "generation_config.json", *RESULT_FILES,
    "train_results.json", "eval_results.json", "trainer_state.json", "training_args.bin", "README.md", *CODE_FILES,
    *TOKENIZER_FILES, "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
})
#: Patterns of the other names a model or its run owns: weight shards, Trainer checkpoints, TensorBoard logs.
MODEL_FILE_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "checkpoint-*", "runs")


def owned_by_model(name: str) -> bool:
    """Whether a file or folder named ``name`` (in a model folder) belongs to the model or its run (see
    `MODEL_FILE_NAMES`, `MODEL_FILE_PATTERNS`); other names are the user's."""
    return name in MODEL_FILE_NAMES or any(fnmatch.fnmatchcase(name, pattern) for pattern in MODEL_FILE_PATTERNS)


def checkpoint_kind(path: str | os.PathLike) -> str | None:
    """The ``model_type`` of a local checkpoint folder's ``config.json`` (``"clusterformer"``, ``"roberta"``, ...), or
    None when ``path`` is no folder with a readable config."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


class ModelFolderExistsError(FileExistsError):
    """The output folder already holds a model (or a run's records) and ``overwrite`` was not given."""


def holds_model(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder with a saved model in it (its config or weights; Trainer ``checkpoint-*`` folders
    alone, such as those of the run whose model is being saved, do not count)."""
    path = Path(path)
    return path.is_dir() and any((path / name).exists() for name in MODEL_MARKER_FILES)


def check_output_dir(
    path: str | os.PathLike, overwrite: bool = False, option: str = "overwrite=True", results: Sequence[str] = (),
) -> None:
    """Raise `ModelFolderExistsError` when ``path`` holds a model (or one of the records named in ``results``) and
    ``overwrite`` is false, and `NotADirectoryError` when it is a file; ``option`` names the switch in the
    message (``--overwrite``)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"output folder {path} is a file; give a folder.")
    if overwrite:
        return
    if holds_model(path):
        raise ModelFolderExistsError(
            f"output folder {path} already holds a model; pass {option} to replace the model's files (other files "
            "are kept), or give another folder."
        )
    check_result_files(path, results, overwrite, option)


def check_result_files(path: str | os.PathLike, names: Sequence[str], overwrite: bool = False,
                       option: str = "overwrite=True") -> None:
    """Raise `ModelFolderExistsError` when one of the record files ``names`` exists in folder ``path`` and
    ``overwrite`` is false (a run's results, which ``clusterformer card`` reads)."""
    existing = [name for name in names if (Path(path) / name).exists()]
    if existing and not overwrite:
        raise ModelFolderExistsError(
            f"output folder {path} already holds {', '.join(existing)} of an earlier run; pass {option} to replace "
            "them, or give another --output_dir."
        )


def default_mode(directory: bool = False) -> int:
    """The mode a new file (``0o666``) or folder (``0o777``) gets under the process umask (0644 / 0755 under the
    usual 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def apply_default_modes(folder: str | os.PathLike, suffixes: Sequence[str] = (".safetensors",)) -> None:
    """Give the files of ``folder`` ending in one of ``suffixes`` the usual mode (`default_mode`; transformers writes
    weight files 0600)."""
    mode = default_mode()
    for name in os.listdir(folder):
        if name.endswith(tuple(suffixes)):
            os.chmod(os.path.join(folder, name), mode)


@contextlib.contextmanager
def writing_model_dir(path: str | os.PathLike, overwrite: bool = False, option: str = "overwrite=True") -> Iterator[Path]:
    """Write a model into a sibling temporary folder, then put it in place of ``path`` in one rename.

    Refuses (before anything is written) a ``path`` that holds a model unless ``overwrite``; with it, the old model's
    own files (`owned_by_model`: config, weights, tokenizer, card, records, Trainer checkpoints) are replaced and
    every other file in the folder is kept. A folder without a model keeps all its files that the new model does not
    write. A failure or interruption removes the temporary folder and leaves ``path`` as it was. The folder gets the
    usual mode (`default_mode`), not the temporary folder's 0700.
    """
    path = Path(path)
    check_output_dir(path, overwrite, option)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        yield staging
        os.chmod(staging, default_mode(directory=True))
        if path.is_dir():
            replaced = holds_model(path)  # the old model's own files go with it
            for child in path.iterdir():
                if not (staging / child.name).exists() and not (replaced and owned_by_model(child.name)):
                    os.replace(child, staging / child.name)
        previous = None
        if path.exists():
            previous = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, previous / "model")
        os.replace(staging, path)
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
