"""Test configuration: the local Hub server and olah fixtures live in tests/support/hub_fixtures.py, the model-folder
fixtures of the write and refusal tests (a work folder, tiny RoBERTa checkpoints, their conversion) in
tests/support/model_folders.py; what every test process shares (one thread, the longest files first, the marks of
transformers' common model tests) in tests/support/session.py, which research/tests/conftest.py imports too."""

from support.session import _one_thread, pytest_collection_modifyitems, pytest_configure  # noqa: F401

pytest_plugins = ["support.hub_fixtures", "support.model_folders"]
