"""Writing into a folder: a model folder (or a training run's files) staged in a hidden folder inside it and put in
place one atomic rename per file (`writing_model_dir`, the one way every model folder is written), a single file
(`write_file`), a training run's output folder (`run_output_dir`), and Ctrl-C / SIGTERM during a write
(`WriteInterrupted`).

A top-level module with no imports beyond the standard library and the file rules (`hf_clusterformer_files`,
`hf_clusterformer_sources`), on the bottom floor (see ARCHITECTURE.md). The write rule: a folder is written into as it
is (a symlinked folder's target; its mode, owner and other files stay), each file by its own atomic rename; a model in
it is replaced only when asked (``--overwrite`` / ``overwrite=True``), and a file that the library did not write (its
record, `hf_clusterformer_files.OWN_FILES_RECORD`) is never replaced without it; with it, only the library's own files
and Trainer checkpoints are removed. Every other file (notes, logs, a hand-written README) is the user's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hf_clusterformer_files import (
    CODE_FILES,
    OWN_FILES_RECORD,
    RESULT_FILES,
    ModelFolderExistsError,
    check_output_dir,
    check_own_files,
    check_result_files,
    default_mode,
    file_sha256,
    holds_model,
    library_files,
    output_folder,
    tokenizer_strays,
    written_by_library,
)
from hf_clusterformer_sources import is_trainer_checkpoint, last_checkpoint

__all__ = ["WriteInterrupted", "run_output_dir", "writing_model_dir"]

#: Prefix of the hidden folder a write stages its files in, inside the output folder (so every rename is atomic).
STAGING_PREFIX = ".clusterformer-write-"


class _Terminated(BaseException):
    """SIGTERM arrived while a model folder was being written (raised by `_terminate_cleanly`'s handler)."""


class WriteInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a model write; its message says what the folder holds now (the old model, or the
    new one in full)."""


def set_aside(folder: Path, names: Sequence[str]) -> None:
    """Rename each of ``names`` in ``folder`` to ``NAME.yours`` (a free name), saying so: kept, but not read."""
    for name in names:
        kept = next(f"{name}.yours{n or ''}" for n in range(1000) if not (folder / f"{name}.yours{n or ''}").exists())
        os.replace(folder / name, folder / kept)
        print(f"kept your {folder / name} as {kept} (the new tokenizer would read it)", file=sys.stderr)


#: Files every saved model writes, checked before a write starts (a refusal costs nothing); the rest are checked
#: before the new files are put in place.
EXPECTED_FILES = ("config.json", "model.safetensors", *CODE_FILES, "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json")


@contextlib.contextmanager
def _terminate_cleanly() -> Iterator[dict[str, Any]]:
    """Within the block, SIGTERM raises `_Terminated` (so that ``finally`` clauses run, as for SIGINT) unless the
    returned state's ``"committing"`` is set, when SIGTERM and SIGINT are noted in ``"pending"`` and acted on after
    the block (the process ends by SIGTERM; SIGINT raises `WriteInterrupted`), with ``"said"`` written first. Where
    SIGTERM already has a handler of its own (or outside the main thread) nothing changes."""
    state: dict[str, Any] = {"committing": False, "pending": None, "said": ""}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    own_term = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    previous_int = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        if state["committing"]:
            state["pending"] = signum
        elif signum == signal.SIGTERM:
            raise _Terminated()
        else:
            raise KeyboardInterrupt()

    if own_term:
        signal.signal(signal.SIGTERM, handler)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, handler)
    try:
        yield state
    except _Terminated:
        state["pending"] = signal.SIGTERM
    finally:
        if own_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
    if state["pending"] == signal.SIGTERM:  # the folder is as it was (or complete): end as SIGTERM would have
        if state["said"]:
            print(state["said"], file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit(128 + signal.SIGTERM)
    if state["pending"] == signal.SIGINT:
        raise WriteInterrupted(state["said"])


def _remove_leftovers(folder: Path) -> None:
    """Remove the staging folders of writes that were killed (SIGKILL, a power cut) before they finished, saying so."""
    for leftover in sorted(folder.glob(STAGING_PREFIX + "*")):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
            print(f"removed {leftover}, left by a write into {folder} that was killed before it finished",
                  file=sys.stderr)


@contextlib.contextmanager
def writing_model_dir(
    path: str | os.PathLike, overwrite: bool = False, option: str = "overwrite=True", *, check: bool = True,
) -> Iterator[Path]:
    """The one way a model (or a run's files) is written into a folder: into a hidden staging folder inside it,
    then each file put in place on its own by an atomic rename.

    The folder itself is never replaced: a symlinked ``path`` is written through to its target, and the folder's
    mode, owner, group and other files stay. Refuses (before anything is written, unless ``check`` is false) a
    folder that holds a model unless ``overwrite``; and, before anything is put in place, a file the new model
    writes that exists and is not this library's own (`written_by_library`; symlinks included) unless
    ``overwrite`` (then a symlink is replaced, never written through). With ``overwrite`` the old model's own files
    the new one does not write, and its Trainer checkpoints, are removed; nothing else is. New files get the usual
    mode (`default_mode`) and are recorded in `OWN_FILES_RECORD`.

    A failure or Ctrl-C / SIGTERM before the files are put in place leaves the folder as it was, except that the
    Trainer checkpoints of an interrupted run are kept; one while they are put in place is held until they all
    are. Either way the `WriteInterrupted` (or, for SIGTERM, the line on stderr) says which model the folder holds.
    """
    target = output_folder(path)
    check_output_dir(path, overwrite or not check, option)
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(target)
    check_own_files(target, EXPECTED_FILES if check else (), overwrite, option)
    with _terminate_cleanly() as termination:
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target))
        try:
            try:
                yield staging
            except BaseException as error:
                kept = _keep_checkpoints(staging, target)
                if isinstance(error, (KeyboardInterrupt, _Terminated)):
                    termination["said"] = _interrupted_line(target, created, kept)
                    if isinstance(error, KeyboardInterrupt) and not isinstance(error, WriteInterrupted):
                        raise WriteInterrupted(termination["said"]) from None
                raise
            names = [p.name for p in staging.iterdir()]
            check_own_files(target, names, overwrite, option)
            termination["committing"] = True
            set_aside(target, tokenizer_strays(target, names))  # with overwrite: kept, but not read
            _put_in_place(staging, target, replace_model=overwrite and holds_model(staging))
            termination["said"] = f"interrupted after {target} was written in full (the new model)"
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            if created and not any(target.iterdir()):
                target.rmdir()


def _interrupted_line(target: Path, created: bool, kept: list[str]) -> str:
    """What an interrupted write says: the folder is as it was, and which of the run's checkpoints were kept."""
    line = f"interrupted: {target} is left as it was" + ("" if created else " (its earlier files kept)")
    return line + (f"; this run's checkpoints {', '.join(kept)} are kept in it" if kept else "")


def _keep_checkpoints(staging: Path, target: Path) -> list[str]:
    """Move the Trainer checkpoints of an interrupted run from ``staging`` into ``target`` (where no folder of the
    user's has their name; a Trainer checkpoint of the same name is replaced); their names."""
    kept = []
    for checkpoint in sorted(staging.glob("checkpoint-*")):
        destination = target / checkpoint.name
        if not is_trainer_checkpoint(checkpoint):
            continue
        if destination.exists() or destination.is_symlink():
            if not is_trainer_checkpoint(destination):
                continue
            shutil.rmtree(destination)
        os.replace(checkpoint, destination)
        kept.append(checkpoint.name)
    return kept


def _put_in_place(staging: Path, target: Path, replace_model: bool) -> None:
    """`writing_model_dir`'s last step: each entry of ``staging`` replaces its namesake in ``target`` by a rename
    (a replaced folder is moved aside first); with ``replace_model``, the old model's own files and Trainer
    checkpoints that were not replaced go; then the record of the library's files is updated."""
    record = library_files(target)
    file_mode, folder_mode = default_mode(), default_mode(directory=True)
    aside = Path(tempfile.mkdtemp(prefix=".replaced-", dir=staging))
    names = sorted(p.name for p in staging.iterdir() if p != aside and p.name != OWN_FILES_RECORD)
    written = {name: file_sha256(staging / name) for name in names if (staging / name).is_file()}
    if replace_model:  # the old model's own files that the new one does not write
        for name in sorted(os.listdir(target)):
            if name in names or name.startswith(STAGING_PREFIX) or name == OWN_FILES_RECORD:
                continue
            if written_by_library(target, name, record) and (name in record or is_trainer_checkpoint(target / name)):
                os.replace(target / name, aside / name)
                record.pop(name, None)
    for name in names:
        source, destination = staging / name, target / name
        os.chmod(source, folder_mode if source.is_dir() else file_mode)
        if source.is_dir() and (destination.is_dir() and not destination.is_symlink()):
            os.replace(destination, aside / name)
        os.replace(source, destination)
    record = {name: digest for name, digest in record.items() if (target / name).is_file()}
    record.update(written)
    record_file = staging / OWN_FILES_RECORD
    record_file.write_text(json.dumps({"files": dict(sorted(record.items()))}, indent=1) + "\n", encoding="utf-8")
    os.chmod(record_file, file_mode)
    os.replace(record_file, target / OWN_FILES_RECORD)


def write_file(path: str | os.PathLike, data: str | bytes, overwrite: bool = False, option: str = "overwrite=True",
               own: bool = False) -> Path:
    """Write one file atomically (a temporary file beside it, then a rename), with the usual mode. A symlink at
    ``path`` is refused unless ``overwrite``, and then the link is replaced, never written through. ``own``: record
    the file as this library's (`OWN_FILES_RECORD` of its folder), as a model's card is."""
    path = Path(path)
    if path.is_symlink() and not overwrite:
        raise ModelFolderExistsError(f"{path} is a symlink; pass {option} to replace the link (its target is never "
                                     "written), or give another path.")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(raw)
        os.chmod(temporary, default_mode())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    if own:
        record = library_files(path.parent)
        record[path.name] = hashlib.sha256(raw).hexdigest()
        text = json.dumps({"files": dict(sorted(record.items()))}, indent=1) + "\n"
        write_file(path.parent / OWN_FILES_RECORD, text, overwrite=True)
    return path


@contextlib.contextmanager
def run_output_dir(training_args: Any, overwrite: bool, check_records: bool = True) -> Iterator[None]:
    """The write rule of a training run's ``training_args.output_dir`` (a `transformers.TrainingArguments`).

    Training (not resuming) into a folder that holds a model or a run's records (`RESULT_FILES`) is refused unless
    ``overwrite``; an evaluation keeps an earlier run's records unless ``overwrite`` (when ``check_records``). The
    run writes into a staging folder (``training_args.output_dir`` points there inside the block) whose files are
    put in place when the block ends (`writing_model_dir`); an interrupted run keeps its Trainer checkpoints.
    """
    output_dir = training_args.output_dir
    resume = training_args.resume_from_checkpoint
    training = training_args.do_train and not resume
    if training:
        check_output_dir(output_dir, overwrite, "--overwrite", results=RESULT_FILES)
    elif check_records and not training_args.do_train:
        check_result_files(output_dir, RESULT_FILES, overwrite, "--overwrite")
    if resume is True or (isinstance(resume, str) and resume.lower() == "true"):
        training_args.resume_from_checkpoint = last_checkpoint(output_folder(output_dir))
        if training_args.resume_from_checkpoint is None:
            raise ValueError(f"--resume_from_checkpoint: {output_dir} holds no Trainer checkpoint (checkpoint-N) to "
                             "resume from; leave the flag out to start afresh, or name a checkpoint folder.")
    with writing_model_dir(output_dir, overwrite=overwrite, option="--overwrite", check=training) as staging:
        training_args.output_dir = str(staging)
        try:
            yield
        finally:
            training_args.output_dir = output_dir
