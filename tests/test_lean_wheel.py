"""A lean library: the hf-clusterformer wheel holds the library only (no experiment harness, no synthetic-data
generator: those are the research package's, in research/), and every module of the wheel imports where the research
package cannot be found."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Files of the research package; none may reach the library's wheel.
RESEARCH_FILES = sorted(path.name for path in (ROOT / "research" / "src" / "clusterformer_research").rglob("*.py")
                        if path.name != "__init__.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built by pip from a copy of this checkout (no dependencies, the installed setuptools), so that the
    checkout itself gets no build/ or egg-info folder."""
    folder = tmp_path_factory.mktemp("wheel")
    source = folder / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "outputs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
        ".cache", "results"))
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
               "-w", str(folder / "dist")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (built,) = (folder / "dist").glob("hf_clusterformer-*.whl")
    return built


def test_the_wheel_holds_the_library_and_nothing_of_the_research_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {"hf_clusterformer/__init__.py", "hf_clusterformer/modeling_clusterformer.py",
            "hf_clusterformer/pipeline.py", "hf_clusterformer/qa_training.py", "hf_clusterformer/data/multipassage.py",
            "hf_clusterformer/modelcard_template.md", "hf_clusterformer_cli.py"} <= set(names)
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"hf_clusterformer", "hf_clusterformer_cli.py", "hf_clusterformer_cli_support.py",
                    "hf_clusterformer_files.py", "hf_clusterformer_heads.py", "hf_clusterformer_model_folder.py",
                    "hf_clusterformer_sources.py", "hf_clusterformer_writing.py"}
    assert [name for name in names if "/experiment/" in name or Path(name).name in RESEARCH_FILES] == []
    assert "longrange.py" in RESEARCH_FILES and "running.py" in RESEARCH_FILES  # the check above checks something
    with zipfile.ZipFile(wheel) as archive:
        for name in names:
            if name.endswith(".py"):
                tree = ast.parse(archive.read(name).decode("utf-8"))
                imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                            for alias in node.names]
                imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
                assert not [m for m in imported if m.split(".")[0] == "clusterformer_research"], name


#: Imports every module of the unpacked wheel (sys.argv[1]) where ``clusterformer_research`` cannot be found.
IMPORT_ALL = """
import importlib, importlib.abc, json, pkgutil, sys


class HideResearch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "clusterformer_research":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HideResearch())
sys.path.insert(0, sys.argv[1])
import hf_clusterformer

modules = ["hf_clusterformer", "hf_clusterformer_cli", "hf_clusterformer_cli_support"]
modules += [info.name for info in pkgutil.walk_packages(hf_clusterformer.__path__, "hf_clusterformer.")]
for name in modules:
    importlib.import_module(name)
print(json.dumps({"file": hf_clusterformer.__file__, "modules": modules,
                  "research": sorted(m for m in sys.modules if m.startswith("clusterformer_research"))}))
"""


def test_every_module_of_the_wheel_imports_without_the_research_package(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, str(site)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(result["file"]).is_relative_to(site)
    assert {"hf_clusterformer.qa_training", "hf_clusterformer.data.multipassage", "hf_clusterformer.modelcard",
            "hf_clusterformer.hub"} <= set(result["modules"])
    assert result["research"] == []
