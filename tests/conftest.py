"""Test configuration: the local Hub server and olah fixtures live in tests/hub_fixtures.py."""

import pytest
import torch

pytest_plugins = ["hub_fixtures"]


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tiny models run fastest on one thread, and the suite stays fast on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
