"""transformers' own common model tests (``ModelTesterMixin`` of its ``tests/test_modeling_common.py``), loaded from
the source distribution of the installed transformers version.

The wheel ships no tests, so ``make common-tests`` (run by ``make test``) unpacks ``tests/test_modeling_common.py``
from the sdist of the installed version (``pip download transformers==VERSION --no-binary :all:``) into
``.cache/transformers-tests/VERSION/``, or the ``TRANSFORMERS_TESTS`` environment variable names a ``tests`` folder of
a transformers checkout of that version. The sdist holds the top-level test files only: the two mixins
``test_modeling_common.py`` imports from sub-packages (the export and generation testers, which an encoder does not
use) are empty stand-ins here.

`load_model_tester_mixin` returns the class, or ``None`` with the reason when the sources (or the ``parameterized``
package they import) are not at hand. ``python tests/support/transformers_common.py`` fetches them (`fetch`).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

import transformers

REPO = Path(__file__).resolve().parents[2]
#: Where ``make common-tests`` unpacks the test sources of the installed transformers.
CACHE = REPO / ".cache" / "transformers-tests" / transformers.__version__
_PACKAGE = "_transformers_common_tests"


def tests_folder() -> Path | None:
    """The folder holding ``test_modeling_common.py`` of the installed transformers version, if any."""
    given = os.environ.get("TRANSFORMERS_TESTS")
    for folder in ([Path(given)] if given else []) + [CACHE]:
        if (folder / "test_modeling_common.py").is_file():
            return folder
    return None


def load_model_tester_mixin() -> tuple[type | None, str]:
    """(``ModelTesterMixin``, "") or (None, why it cannot be loaded)."""
    folder = tests_folder()
    if folder is None:
        return None, (f"transformers {transformers.__version__}'s test sources are not in {CACHE} (run `make "
                      "common-tests`, or set TRANSFORMERS_TESTS to the tests folder of a transformers checkout)")
    if importlib.util.find_spec("parameterized") is None:
        return None, "transformers' common tests import `parameterized` (pip install parameterized, in the test extra)"
    if _PACKAGE + ".test_modeling_common" in sys.modules:
        return sys.modules[_PACKAGE + ".test_modeling_common"].ModelTesterMixin, ""
    package = types.ModuleType(_PACKAGE)
    package.__path__ = [str(folder)]
    sys.modules[_PACKAGE] = package
    # Stand-ins for the sub-packages the sdist lacks: export and generation testers (not used by an encoder).
    stand_ins = (("exporters.test_export", "ExportTesterMixin"), ("generation.test_utils", "GenerationTesterMixin"))
    for name, attribute in stand_ins:
        parent = f"{_PACKAGE}.{name.split('.')[0]}"
        if parent not in sys.modules:
            sys.modules[parent] = types.ModuleType(parent)
            sys.modules[parent].__path__ = []
        module = types.ModuleType(f"{_PACKAGE}.{name}")
        setattr(module, attribute, type(attribute, (), {}))
        sys.modules[module.__name__] = module
    spec = importlib.util.spec_from_file_location(
        f"{_PACKAGE}.test_modeling_common", folder / "test_modeling_common.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        del sys.modules[spec.name]
        return None, (
            f"{folder / 'test_modeling_common.py'} does not import with transformers "
            f"{transformers.__version__}: {error}"
        )
    return module.ModelTesterMixin, ""


def fetch() -> Path:
    """Unpack ``tests/test_modeling_common.py`` of the installed transformers version's sdist into `CACHE` (kept when
    already there)."""
    target = CACHE / "test_modeling_common.py"
    if target.is_file():
        return target
    version = transformers.__version__
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "pip", "download", f"transformers=={version}", "--no-deps", "--no-binary",
                   ":all:", "--quiet", "--dest", folder]
        subprocess.run(command, check=True)
        (archive,) = Path(folder).glob("transformers-*.tar.gz")
        with tarfile.open(archive) as sdist:
            source = sdist.extractfile(f"transformers-{version}/tests/test_modeling_common.py")
            CACHE.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".partial")
            partial.write_bytes(source.read())
            partial.replace(target)
    return target


if __name__ == "__main__":
    try:
        print(f"transformers' common tests: {fetch()}")
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError, tarfile.TarError) as error:
        # the package registry out of reach: the common tests skip, saying why (the rest of `make test` runs)
        print(f"transformers' common tests not fetched ({error}); tests/test_transformers_common.py will skip them.")
