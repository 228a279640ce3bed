"""The floors of ARCHITECTURE.md: the import-linter contracts of pyproject.toml hold, every module has a floor, no
import circle exists (counting imports inside functions), and ARCHITECTURE.md names the floors and code that exist."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
SRC = ROOT / "src"
#: The top-level modules of the ground floor (every top-level module but the command), each with the only project
#: modules it may import: the rest of its imports are the standard library's, so the command imports them without
#: torch. The command's error type and parser; the table of heads; checkpoint kinds and the local-source check; the
#: file rules; staged writes of a folder or file; the one writer of a model folder.
GROUND_TOP_LEVEL = {
    "hf_clusterformer_cli_support": {"hf_clusterformer_heads"},
    "hf_clusterformer_heads": set(),
    "hf_clusterformer_sources": set(),
    "hf_clusterformer_files": {"hf_clusterformer_sources"},
    "hf_clusterformer_writing": {"hf_clusterformer_files", "hf_clusterformer_sources"},
    "hf_clusterformer_model_folder": {"hf_clusterformer_files", "hf_clusterformer_writing"},
}


def _floors() -> list[list[str]]:
    """The layers contract's floors, top first, each a list of module names."""
    contracts = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    (layers,) = [contract["layers"] for contract in contracts if contract["type"] == "layers"]
    return [[name.strip() for name in floor.replace("|", ":").split(":")] for floor in layers]


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), i.e. the import circles among ``modules``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module) & modules:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return circles


def _project_imports(path: Path) -> set[str]:
    """The ``hf_clusterformer*`` modules a source file imports anywhere (top level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {name for name in names if name.split(".")[0].startswith("hf_clusterformer")}


def test_import_linter_contracts_are_kept():
    """``lint-imports`` in its own process: it reconfigures logging, which would silence this process's loggers."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(PYPROJECT)!r}, no_cache=True, no_logo=True))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_every_module_has_a_floor():
    placed = {name for floor in _floors() for name in floor}
    package = SRC / "hf_clusterformer"
    modules = {f"hf_clusterformer.{path.stem}" for path in package.glob("*.py") if path.stem != "__init__"}
    modules |= {f"hf_clusterformer.{path.parent.name}" for path in package.glob("*/__init__.py")}
    assert modules == placed


def test_no_import_circle():
    """Within the package; a circle through the command would need a library module importing it (`cli-on-top`)."""
    graph = grimp.build_graph("hf_clusterformer", cache_dir=None)
    assert _cycles(graph, set(graph.modules)) == []


def _imports(path: Path) -> set[str]:
    """The top-level names of the modules a source file imports anywhere."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_command_sits_on_top():
    """The command's error type and parser import nothing of the project but the table of heads, which imports only
    the standard library; the command imports the library, and the library never the command (the `cli-on-top`
    contract checks the last)."""
    assert _project_imports(SRC / "hf_clusterformer_cli_support.py") == {"hf_clusterformer_heads"}
    assert _imports(SRC / "hf_clusterformer_heads.py") <= set(sys.stdlib_module_names) | {"__future__"}
    assert _project_imports(SRC / "hf_clusterformer_cli.py") >= {"hf_clusterformer_cli_support",
                                                                 "hf_clusterformer.conversion"}


def test_ground_floor_top_level_modules_import_the_standard_library_only():
    """Every top-level module but the command is on the ground floor and imports only the standard library and the
    ground-floor modules `GROUND_TOP_LEVEL` allows it."""
    top_level = {path.stem for path in SRC.glob("hf_clusterformer_*.py")}
    assert top_level - {"hf_clusterformer_cli"} == set(GROUND_TOP_LEVEL)
    for name, allowed in GROUND_TOP_LEVEL.items():
        assert _imports(SRC / f"{name}.py") <= set(sys.stdlib_module_names) | {"__future__"} | allowed, name


def test_the_cycle_finder_finds_a_circle():
    class Graph:
        imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, module: str) -> set[str]:
            return self.imports[module]

    assert _cycles(Graph(), {"a", "b", "c", "d"}) == [["a", "b", "c"]]


#: The folders of the tests: the library's and the research package's.
TEST_FOLDERS = (ROOT / "tests", ROOT / "research" / "tests")


def _test_module_imports(source: str) -> list[str]:
    """The ``test_*`` modules a source imports anywhere (top level or inside functions; ``tests.test_x`` and relative
    imports too): a test file is no library; what tests share lives in tests/helpers.py and its ``*_helpers`` kin."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] if node.module else []
            if node.module is None or node.module.split(".")[-1] == "tests":  # ``from . import test_x``: the alias
                names += [alias.name for alias in node.names]
        else:
            continue
        found += [name for name in names if any(part.startswith("test_") for part in name.split("."))]
    return found


def test_no_test_file_imports_another():
    """No file under tests/ or research/tests/ (test files, helpers, workers, conftest) imports a ``test_*`` module:
    each test file runs alone, and the builders that tests share live in the helper modules."""
    scanned, offenders = 0, []
    for folder in TEST_FOLDERS:
        assert folder.is_dir(), folder
        for path in sorted(folder.rglob("*.py")):
            scanned += 1
            imported = _test_module_imports(path.read_text(encoding="utf-8"))
            offenders += [f"{path.relative_to(ROOT)} imports {name}" for name in imported]
    assert scanned > 40 and offenders == [], offenders


def test_the_test_import_scan_finds_one():
    source = ("import helpers\nfrom test_export import CONFIG\nimport tests.test_cli\nfrom . import test_heads\n"
              "from tests import test_tasks\nfrom helpers import test_like_name\n"
              "def f():\n    import test_remote_code\n")
    found = _test_module_imports(source)
    assert sorted(found) == ["test_export", "test_heads", "test_remote_code", "test_tasks", "tests.test_cli"]


def _resolve(name: str) -> object:
    """The object a dotted name ``package.module.attribute...`` names (AttributeError / ImportError if none)."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute)
        return target
    raise ImportError(name)


def test_architecture_page_floors_match_the_contract():
    """The page's floor table lists, top floor first, the contract's floors (plus the top-level modules)."""
    rows = [line for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines() if re.match(r"\| \d\. ", line)]
    page = [{name if name.startswith("hf_clusterformer_") else f"hf_clusterformer.{name}"
             for name in re.findall(r"`([\w.]+)`", row.split("|")[2])} for row in rows]
    assert page[0] == {"hf_clusterformer_cli"}
    expected = [set(floor) for floor in _floors()]
    expected[-1] |= set(GROUND_TOP_LEVEL)
    assert page[1:] == expected


def test_architecture_page_names_real_code():
    names = set(re.findall(r"`(hf_clusterformer(?:\.\w+)+)`", ARCHITECTURE.read_text(encoding="utf-8")))
    assert len(names) > 15
    for name in sorted(names):
        _resolve(name)


def test_architecture_page_names_the_research_packages_modules():
    """The research package's rooms named on the page exist (it is installed beside the library by `make install`)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    names = set(re.findall(r"`(clusterformer_research(?:\.\w+)+)`", text))
    assert {"clusterformer_research.longrange", "clusterformer_research.experiment"} <= names
    for name in sorted(names):
        _resolve(name)


def test_functions_and_modules_stay_readable():
    """No library function over 60 lines; no module over 700 lines but the modeling file (the model in one file,
    copied into every Hub checkpoint)."""
    import ast

    long_functions, long_modules = [], []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > 700 and path.name != "modeling_clusterformer.py":
            long_modules.append(f"{path.relative_to(SRC)}: {len(text.splitlines())}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long_functions.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}")
    assert long_functions == [] and long_modules == []


#: Most names one module's ``__all__`` lists, and all of the library's lists together: what users call, not helpers.
MOST_IN_ONE_ALL, MOST_IN_ALL_LISTS = 20, 100


def _library_modules() -> list[str]:
    """Every module of the library by name: the package, its modules and subpackages, the top-level modules."""
    names = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_all_lists_name_only_what_users_call():
    """ARCHITECTURE.md: each module's ``__all__`` names what users call; helpers that other modules import stay
    importable but out of it. Every listed name exists; the lists stay short."""
    lists = {}
    for name in _library_modules():
        module = importlib.import_module(name)
        if hasattr(module, "__all__"):
            listed = list(module.__all__)
            assert len(set(listed)) == len(listed) and [n for n in listed if not hasattr(module, n)] == [], name
            lists[name] = listed
    sizes = {name: len(listed) for name, listed in lists.items()}
    assert max(sizes.values()) <= MOST_IN_ONE_ALL and sum(sizes.values()) <= MOST_IN_ALL_LISTS, sizes


def test_the_package_shows_what_users_call_and_hides_no_module():
    """``dir(hf_clusterformer)`` holds `__all__`, the package's modules and dunder names, no leaked import; no name
    of the package hides one of its modules: ``hf_clusterformer.pipeline`` is the pipeline's module, callable as the
    function that builds a pipeline (``hf_clusterformer.pipeline(model=...)``, as the README shows)."""
    import inspect
    import pkgutil
    import types

    import hf_clusterformer
    from hf_clusterformer import loading

    for found in pkgutil.iter_modules(hf_clusterformer.__path__):
        module = importlib.import_module(f"hf_clusterformer.{found.name}")
        assert getattr(hf_clusterformer, found.name) is module, found.name
    shown = {name for name in dir(hf_clusterformer) if not name.startswith("__")}
    modules = {name for name in shown
               if sys.modules.get(f"hf_clusterformer.{name}") is getattr(hf_clusterformer, name)}
    assert shown - modules == set(hf_clusterformer.__all__) - modules and set(hf_clusterformer.__all__) <= shown
    assert not {"AutoConfig", "AutoModel", "importlib", "hf_clusterformer_heads", "_LAZY"} & set(dir(hf_clusterformer))
    for name, value in vars(hf_clusterformer).items():  # the namespace itself: no name imported for internal use
        own = getattr(value, "__module__", None) or getattr(value, "__name__", "")
        assert name.startswith("_") or own.split(".")[0] == "hf_clusterformer", name
    assert hf_clusterformer.default_cluster_layers(24) == [15, 20]  # a helper stays importable, out of __all__

    import hf_clusterformer.pipeline as pipeline_module
    from hf_clusterformer import pipeline

    assert pipeline is pipeline_module is sys.modules["hf_clusterformer.pipeline"]
    assert isinstance(pipeline, types.ModuleType) and pipeline.PASSAGE_TOKEN == "<p>"
    assert callable(pipeline) and inspect.signature(pipeline) == inspect.signature(loading.pipeline)
    with pytest.raises(ValueError, match="task must be one of"):  # the call is loading.pipeline's
        pipeline(model=None, task="summarization")
