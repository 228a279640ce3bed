"""Pytest fixtures and helpers for tests against real Hub-compatible servers.

* :func:`hub_server` – the project's git-backed Hub server (``tests/support/hub_server.py``)
  on 127.0.0.1, ephemeral port, fresh root directory per test.
* :func:`olah_mirror` – an ``olah`` mirror process serving the same git repositories
  in offline mode; the test is skipped when ``olah`` is not installed.
* :func:`run_with_endpoint` – run Python code in a subprocess whose
  ``huggingface_hub``/``transformers`` talk to a given endpoint.

Client code always runs in a subprocess: ``huggingface_hub`` reads ``HF_ENDPOINT``,
``HF_HOME`` and ``HF_HUB_OFFLINE`` once, at import time, so each endpoint, cache
directory and offline setting needs a fresh interpreter. The servers run in (or
are started from) the pytest process.

Use them from ``tests/conftest.py`` with ``pytest_plugins = ["support.hub_fixtures"]``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from .hub_server import HubServer, serve_hub

__all__ = [
    "HubServer",
    "client_env",
    "hf_home_factory",
    "hub_server",
    "olah_available",
    "olah_mirror",
    "run_with_endpoint",
    "serve_hub",
    "serve_olah",
]

TEST_TOKEN = "hf_test_token"
_SCRUBBED_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_")
OLAH_START_TIMEOUT = 60.0


def client_env(
    endpoint: str,
    hf_home: str | os.PathLike[str],
    extra_env: Mapping[str, str] | None = None,
    token: str | None = TEST_TOKEN,
) -> dict[str, str]:
    """Environment for a client process using ``endpoint`` and the cache under ``hf_home``.

    Inherited ``HF_*``, ``HUGGINGFACE_*`` and ``TRANSFORMERS_*`` variables are dropped so the
    developer's own settings (token, cache, offline mode) never leak into the tests.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    no_proxy = ",".join(filter(None, [env.get("NO_PROXY", ""), "127.0.0.1", "localhost"]))
    env.update(
        HF_ENDPOINT=endpoint.rstrip("/"),
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_PROXY=no_proxy,
        no_proxy=no_proxy,
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    if token is not None:
        env["HF_TOKEN"] = token
    env.update(extra_env or {})
    return env


def run_with_endpoint(
    code: str,
    endpoint: str,
    hf_home: str | os.PathLike[str],
    extra_env: Mapping[str, str] | None = None,
    *,
    args: Sequence[str] = (),
    timeout: float = 180.0,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) in a fresh interpreter talking to ``endpoint``.

    ``args`` become ``sys.argv[1:]``. With ``check`` a non-zero exit raises an
    ``AssertionError`` carrying the process output.
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=client_env(endpoint, hf_home, extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"client process failed with exit code {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-5000:]}\n--- stderr ---\n{proc.stderr[-10000:]}"
        )
    return proc


def olah_available() -> bool:
    """Whether the ``olah`` mirror server can be imported."""
    try:
        return importlib.util.find_spec("olah") is not None and importlib.util.find_spec("olah.server") is not None
    except (ImportError, ValueError):
        return False


def _olah_config(mirrors_path: Path, workdir: Path) -> str:
    def q(value: object) -> str:
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'

    # No upstream is ever contacted in offline mode; the hf-* settings point at a closed
    # local port so a stray request could not leave the machine either.
    return textwrap.dedent(
        f"""\
        [basic]
        host = "127.0.0.1"
        port = 0
        repos-path = {q(workdir / "cache")}
        mirrors-path = [{q(mirrors_path)}]
        hf-scheme = "http"
        hf-netloc = "127.0.0.1:9"
        hf-lfs-netloc = "127.0.0.1:9"
        metadata-cache-ttl = 0

        [accessibility]
        offline = true
        """
    )


@contextmanager
def serve_olah(mirrors_path: str | os.PathLike[str], workdir: str | os.PathLike[str]) -> Iterator[str]:
    """Run ``olah`` offline over the git repositories in ``mirrors_path``; yield its endpoint.

    ``mirrors_path`` uses olah's layout, ``{models,datasets,spaces}/{namespace}/{name}``,
    which is how :class:`hub_server.GitStore` stores repositories.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "olah.toml"
    config.write_text(_olah_config(Path(mirrors_path).resolve(), workdir.resolve()))
    log_path = workdir / "olah.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "olah.server", "--config", str(config), "--log-path", str(workdir / "logs")],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        endpoint = None
        deadline = time.monotonic() + OLAH_START_TIMEOUT
        while endpoint is None and time.monotonic() < deadline and proc.poll() is None:
            match = re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", log_path.read_text(errors="replace"))
            if match:
                endpoint = match.group(1)
            else:
                time.sleep(0.1)
        if endpoint is None:
            raise RuntimeError(
                f"olah did not start (exit code {proc.poll()}):\n{log_path.read_text(errors='replace')[-5000:]}"
            )
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture
def hub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """A running git-backed Hub server; use ``.url`` (endpoint) and ``.root`` (repositories).

    ``.requests`` lists the ``(method, path)`` of every request received and
    ``.page_size`` sets the page size of paginated listings.
    """
    if shutil.which("git") is None:
        pytest.skip("the git command line tool is not installed")
    with serve_hub(tmp_path_factory.mktemp("hub-root")) as server:
        yield server


@pytest.fixture
def olah_mirror(hub_server: HubServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint of an offline ``olah`` mirror of ``hub_server``'s repositories (skips without olah)."""
    if not olah_available():
        pytest.skip("olah is not installed (pip install 'olah>=0.5.4')")
    with serve_olah(hub_server.root, tmp_path_factory.mktemp("olah")) as endpoint:
        yield endpoint


@pytest.fixture
def hf_home_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Make a fresh, empty ``HF_HOME`` directory: ``hf_home_factory("pull")``."""

    def make(name: str = "hf-home") -> Path:
        return tmp_path_factory.mktemp(name)

    return make
