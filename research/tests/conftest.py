"""The research package's tests (research/tests/), run by `make test` beside the library's (tests/): tests/ goes on
the import path for the builders they share (tests/helpers.py), and they run under the same settings as the library's
tests (tests/support/session.py: one thread, the longest files first), whether alone or with tests/ in one run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from support.session import _one_thread, pytest_collection_modifyitems, pytest_configure  # noqa: E402,F401
