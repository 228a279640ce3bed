"""Push to and pull from real Hub-compatible servers with the real clients.

The upload side is the project's git-backed server (``tests/support/hub_server.py``); the
download side is checked against that server and, independently, against an
``olah`` mirror serving the same git repositories offline. Client code runs in
subprocesses (see ``support/hub_fixtures.py``).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
from support.hub_fixtures import TEST_TOKEN, HubServer, olah_available, run_with_endpoint, serve_hub, serve_olah

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="the git command line tool is not installed")

BLOB_SIZE = 4 * 1024 * 1024  # sent base64-encoded inside the NDJSON commit payload

PUSH = """
import hashlib, json, random, sys
import torch
from huggingface_hub import HfApi, ModelCard
from transformers import RobertaConfig, RobertaForQuestionAnswering

out = sys.argv[1]
torch.manual_seed(0)
torch.set_num_threads(1)
config = RobertaConfig(
    vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=64, max_position_embeddings=64,
)
model = RobertaForQuestionAnswering(config).eval()
input_ids = torch.randint(3, 100, (2, 16))
with torch.no_grad():
    logits = model(input_ids=input_ids)
torch.save({"input_ids": input_ids, "start": logits.start_logits, "end": logits.end_logits}, out + "/reference.pt")

api = HfApi()
assert api.whoami()["name"] == "user"
pushed = model.push_to_hub("user/tiny").oid
assert api.model_info("user/tiny").sha == pushed

card = ModelCard("---\\nlicense: apache-2.0\\ntags:\\n- question-answering\\n---\\n# tiny\\n\\nA tiny test model.\\n")
card.push_to_hub("user/tiny", commit_message="Update model card")
carded = api.model_info("user/tiny").sha

blob = random.Random(0).randbytes(BLOB_SIZE)
updated = api.upload_file(
    path_or_fileobj=blob, path_in_repo="extra/blob.bin", repo_id="user/tiny", commit_message="Add blob"
).oid
info = api.model_info("user/tiny")
assert info.sha == updated, (info.sha, updated)
assert info.card_data["license"] == "apache-2.0"
print(json.dumps({
    "pushed": pushed, "carded": carded, "updated": updated,
    "blob_sha256": hashlib.sha256(blob).hexdigest(),
    "files": sorted(api.list_repo_files("user/tiny")),
}))
""".replace("BLOB_SIZE", str(BLOB_SIZE))

PULL = """
import hashlib, json, os, sys
import torch
from huggingface_hub import constants, hf_hub_download, list_repo_files, snapshot_download
from transformers import RobertaForQuestionAnswering

torch.set_num_threads(1)
reference = torch.load(sys.argv[1] + "/reference.pt")
model = RobertaForQuestionAnswering.from_pretrained("user/tiny").eval()
with torch.no_grad():
    logits = model(input_ids=reference["input_ids"])
logits_equal = (
    torch.equal(logits.start_logits, reference["start"]) and torch.equal(logits.end_logits, reference["end"])
)

folder = snapshot_download("user/tiny")
files = sorted(
    os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/")
    for d, _, names in os.walk(folder) for f in names
)
with open(os.path.join(folder, "extra", "blob.bin"), "rb") as f:
    blob_sha256 = hashlib.sha256(f.read()).hexdigest()
with open(os.path.join(folder, "README.md"), encoding="utf-8") as f:
    readme = f.read()
result = {
    "offline": constants.HF_HUB_OFFLINE,
    "logits_equal": logits_equal,
    "snapshot": os.path.basename(folder),
    "files": files,
    "blob_sha256": blob_sha256,
    "readme_has_card": "A tiny test model." in readme,
}
if not constants.HF_HUB_OFFLINE:
    result["listed"] = sorted(list_repo_files("user/tiny"))
    first = json.loads(sys.argv[2])["pushed"]
    with open(hf_hub_download("user/tiny", "README.md", revision=first), encoding="utf-8") as f:
        result["first_readme_has_card"] = "A tiny test model." in f.read()
print(json.dumps(result))
"""


def _last_json(proc: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={repo}", *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


@dataclass
class PushedRepo:
    """A tiny model pushed to a running :class:`HubServer`."""

    server: HubServer
    workdir: Path
    shas: dict


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PushedRepo]:
    """Serve a Hub with ``user/tiny`` pushed by transformers, then a card update and a 4 MiB file."""
    workdir = tmp_path_factory.mktemp("pushed")
    with serve_hub(tmp_path_factory.mktemp("hub-root")) as server:
        proc = run_with_endpoint(PUSH, server.url, workdir / "push-home", args=[str(workdir)])
        yield PushedRepo(server, workdir, _last_json(proc))


def test_push_creates_real_git_commits(pushed: PushedRepo) -> None:
    """Each push is a git commit whose sha the API reports; contents travel inline."""
    shas = pushed.shas
    assert len({shas["pushed"], shas["carded"], shas["updated"]}) == 3
    assert shas["files"] == [".gitattributes", "README.md", "config.json", "extra/blob.bin", "model.safetensors"]
    git_dir = pushed.server.root / "models" / "user" / "tiny"
    assert _git(git_dir, "rev-parse", "refs/heads/main") == shas["updated"]
    history = _git(git_dir, "log", "--format=%H", "main").splitlines()
    assert history[:3] == [shas["updated"], shas["carded"], shas["pushed"]]
    assert _git(git_dir, "cat-file", "-s", "main:extra/blob.bin") == str(BLOB_SIZE)
    # Nothing was negotiated through LFS or Xet: contents came inline in the commits.
    paths = [path for _, path in pushed.server.requests]
    assert any(path.startswith("/api/models/user/tiny/commit/main") for path in paths)
    assert not [path for path in paths if "xet" in path.lower() or "lfs" in path.lower()]


def test_from_pretrained_snapshot_and_offline_cache(pushed: PushedRepo, tmp_path: Path) -> None:
    """A fresh cache reproduces the logits exactly, then does so again with HF_HUB_OFFLINE=1."""
    server, shas = pushed.server, pushed.shas
    home = tmp_path / "pull-home"
    expected_files = shas["files"]

    online = _last_json(run_with_endpoint(PULL, server.url, home, args=[str(pushed.workdir), json.dumps(shas)]))
    assert online["offline"] is False
    assert online["logits_equal"]
    assert online["snapshot"] == shas["updated"]
    assert online["files"] == expected_files
    assert online["listed"] == expected_files
    assert online["blob_sha256"] == shas["blob_sha256"]
    assert online["readme_has_card"] and not online["first_readme_has_card"]

    served = len(server.requests)
    offline = _last_json(
        run_with_endpoint(PULL, server.url, home, {"HF_HUB_OFFLINE": "1"}, args=[str(pushed.workdir)])
    )
    assert offline["offline"] is True
    assert offline["logits_equal"]
    assert offline["snapshot"] == shas["updated"]
    assert offline["files"] == expected_files
    assert offline["blob_sha256"] == shas["blob_sha256"]
    assert len(server.requests) == served, server.requests[served:]


@pytest.mark.skipif(not olah_available(), reason="olah is not installed (pip install 'olah>=0.5.4')")
def test_olah_offline_mirror_serves_pushed_repo(pushed: PushedRepo, tmp_path: Path) -> None:
    """olah, offline over the same git repositories, serves the model with identical logits."""
    with serve_olah(pushed.server.root, tmp_path / "olah") as endpoint:
        served = len(pushed.server.requests)
        result = _last_json(
            run_with_endpoint(
                PULL, endpoint, tmp_path / "olah-home", args=[str(pushed.workdir), json.dumps(pushed.shas)]
            )
        )
    assert result["logits_equal"]
    assert result["snapshot"] == pushed.shas["updated"]
    assert result["files"] == pushed.shas["files"]
    assert result["blob_sha256"] == pushed.shas["blob_sha256"]
    assert result["readme_has_card"] and not result["first_readme_has_card"]
    assert len(pushed.server.requests) == served  # olah read the git repositories, not our server


HUB_API = """
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

api = HfApi()
url = api.create_repo("proto")  # no namespace: created under the token's user
assert url.repo_id == "user/proto", url
assert api.create_repo("user/proto", exist_ok=True).repo_id == "user/proto"
try:
    api.create_repo("user/proto")
except Exception as err:
    assert err.response.status_code == 409
else:
    raise AssertionError("second create_repo should conflict")

ops = [CommitOperationAdd(f"dir/f{i}.txt", f"file {i}".encode()) for i in range(5)]
first = api.create_commit("user/proto", ops, commit_message="five files").oid
files = api.list_repo_files("user/proto")  # 8 entries, page size 3
assert files == [".gitattributes"] + [f"dir/f{i}.txt" for i in range(5)], files
tree = {e.path: type(e).__name__ for e in api.list_repo_tree("user/proto", recursive=True)}
assert tree["dir"] == "RepoFolder" and tree["dir/f0.txt"] == "RepoFile"
infos = api.get_paths_info("user/proto", ["dir/f1.txt", "missing"])
assert [i.path for i in infos] == ["dir/f1.txt"] and infos[0].size == 6

# unchanged files are skipped by the client thanks to the preupload oids
same = api.upload_file(path_or_fileobj=b"file 1", path_in_repo="dir/f1.txt", repo_id="user/proto")
assert same.oid == first
second = api.create_commit(
    "user/proto",
    [CommitOperationDelete("dir/f0.txt"), CommitOperationAdd("dir/f1.txt", b"changed")],
    commit_message="edit", parent_commit=first,
).oid
assert second != first
try:
    api.create_commit("user/proto", [CommitOperationAdd("x", b"x")], commit_message="stale", parent_commit=first)
except Exception as err:
    assert err.response.status_code == 412
else:
    raise AssertionError("stale parent_commit should be refused")

assert [c.commit_id for c in api.list_repo_commits("user/proto")][:2] == [second, first]
assert api.list_repo_refs("user/proto").branches[0].target_commit == second
assert open(hf_hub_download("user/proto", "dir/f1.txt"), "rb").read() == b"changed"
assert open(hf_hub_download("user/proto", "dir/f1.txt", revision=first), "rb").read() == b"file 1"

for call, error in [
    (lambda: hf_hub_download("user/proto", "nope.txt"), EntryNotFoundError),
    (lambda: hf_hub_download("user/proto", "dir/f1.txt", revision="nobranch"), RevisionNotFoundError),
    (lambda: api.model_info("user/absent"), RepositoryNotFoundError),
]:
    try:
        call()
    except error:
        pass
    else:
        raise AssertionError(f"expected {error.__name__}")

api.delete_folder("dir", "user/proto")
assert api.list_repo_files("user/proto") == [".gitattributes"]
print("ok")
"""


def test_hub_api_with_huggingface_hub(hub_server: HubServer, tmp_path: Path) -> None:
    """Repository, commit, listing and error semantics as seen by ``HfApi``."""
    hub_server.page_size = 3
    proc = run_with_endpoint(HUB_API, hub_server.url, tmp_path / "home")
    assert proc.stdout.strip().endswith("ok")
    paths = [path for _, path in hub_server.requests]
    assert any("cursor=" in path for path in paths)  # pagination was followed
    assert not [path for path in paths if "xet" in path.lower() or "lfs" in path.lower()]


def _http(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict, bytes]:
    try:
        with urlopen(Request(url, data=body, method=method, headers=headers or {}), timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_raw_protocol_headers_ranges_and_auth(hub_server: HubServer) -> None:
    """Wire-level answers: auth, NDJSON commits, resolve headers, ranges, error codes."""
    url, auth = hub_server.url, {"Authorization": f"Bearer {TEST_TOKEN}"}
    create = json.dumps({"name": "raw", "organization": "org", "type": "dataset"}).encode()
    assert _http("POST", f"{url}/api/repos/create", create)[0] == 401
    status, _, body = _http("POST", f"{url}/api/repos/create", create, {**auth, "Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["url"] == f"{url}/datasets/org/raw"

    content = bytes(range(256)) * 4
    ndjson = b"\n".join(
        json.dumps(item).encode()
        for item in [
            {"key": "header", "value": {"summary": "raw commit", "description": "via NDJSON"}},
            {
                "key": "file",
                "value": {"path": "data/x.bin", "encoding": "base64", "content": base64.b64encode(content).decode()},
            },
        ]
    )
    status, _, body = _http(
        "POST", f"{url}/api/datasets/org/raw/commit/main", ndjson, {**auth, "Content-Type": "application/x-ndjson"}
    )
    assert status == 200, body
    sha = json.loads(body)["commitOid"]
    lfs = json.dumps({"key": "lfsFile", "value": {"path": "y", "algo": "sha256", "oid": "0" * 64, "size": 1}}).encode()
    assert _http("POST", f"{url}/api/datasets/org/raw/commit/main", lfs, auth)[0] == 400

    status, headers, body = _http("HEAD", f"{url}/datasets/org/raw/resolve/main/data/x.bin")
    blob = _git(hub_server.root / "datasets" / "org" / "raw", "rev-parse", "main:data/x.bin")
    assert (status, body) == (200, b"")
    assert headers["X-Repo-Commit"] == sha and headers["ETag"] == f'"{blob}"'
    assert headers["Content-Length"] == str(len(content))
    assert not [h for h in headers if h.lower().startswith("x-xet") or h.lower().startswith("x-linked")]
    status, headers, body = _http(
        "GET", f"{url}/datasets/org/raw/resolve/{sha}/data/x.bin", headers={"Range": "bytes=10-19"}
    )
    assert (status, body, headers["Content-Range"]) == (206, content[10:20], f"bytes 10-19/{len(content)}")
    assert (
        _http("GET", f"{url}/datasets/org/raw/resolve/main/data/x.bin", headers={"Range": "bytes=-5"})[2]
        == content[-5:]
    )
    assert _http("GET", f"{url}/datasets/org/raw/resolve/main/data/x.bin", headers={"Range": "bytes=9999-"})[0] == 416
    status, headers, _ = _http("HEAD", f"{url}/datasets/org/raw/resolve/main/missing.txt")
    assert (status, headers["X-Error-Code"], headers["X-Repo-Commit"]) == (404, "EntryNotFound", sha)
    assert _http("HEAD", f"{url}/datasets/org/raw/resolve/nope/data/x.bin")[1]["X-Error-Code"] == "RevisionNotFound"
    assert _http("GET", f"{url}/api/datasets/org/none")[1]["X-Error-Code"] == "RepoNotFound"
    status, _, body = _http("POST", f"{url}/api/validate-yaml", json.dumps({"content": "---\na: [\n---\n"}).encode())
    assert status == 400 and json.loads(body)["errors"]


def test_olah_mirror_fixture(hub_server: HubServer, olah_mirror: str, tmp_path: Path) -> None:
    """A file committed through ``hub_server`` is served by ``olah_mirror``."""
    push = """
    from huggingface_hub import HfApi
    api = HfApi()
    api.create_repo("user/m")
    print(api.upload_file(path_or_fileobj=b"mirrored", path_in_repo="a/b.txt", repo_id="user/m").oid)
    """
    sha = run_with_endpoint(push, hub_server.url, tmp_path / "push").stdout.split()[-1]
    pull = """
    from huggingface_hub import hf_hub_download, list_repo_files, model_info
    print(model_info("user/m", revision="main").sha)
    print(open(hf_hub_download("user/m", "a/b.txt"), "rb").read().decode())
    print(",".join(list_repo_files("user/m")))
    """
    lines = run_with_endpoint(pull, olah_mirror, tmp_path / "pull").stdout.split()
    assert lines[-3:] == [sha, "mirrored", ".gitattributes,a/b.txt"]


def test_server_command_line(tmp_path: Path) -> None:
    """``python tests/support/hub_server.py --root DIR --port 0`` serves the API."""
    script = Path(__file__).parent / "support" / "hub_server.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), "--root", str(tmp_path / "root"), "--port", "0", "--quiet"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed before serving
        match = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        assert match, line
        request = Request(match.group(1) + "/api/whoami-v2", headers={"Authorization": f"Bearer {TEST_TOKEN}"})
        deadline = time.monotonic() + 10
        while True:
            try:
                with urlopen(request, timeout=5) as response:
                    assert json.load(response)["name"] == "user"
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
