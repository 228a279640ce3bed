"""A small Hugging Face Hub-compatible HTTP server backed by git repositories.

Each repository is a bare git repository at ``ROOT/{type}s/{namespace}/{name}``
(the layout olah expects for its ``mirrors-path``). Every commit made through
the API is a real git commit and the sha reported by the API is its git sha.

It implements the part of the Hub API used by ``huggingface_hub`` and
``transformers`` to create repositories, commit files and download them:

* ``GET  /api/whoami-v2``
* ``POST /api/repos/create``, ``POST /api/repos/delete``
* ``POST /api/validate-yaml``
* ``GET  /api/{type}s/{repo}`` and ``/api/{type}s/{repo}/revision/{rev}``
* ``GET  /api/{type}s/{repo}/tree/{rev}[/{path}]`` (``Link`` header pagination)
* ``POST /api/{type}s/{repo}/paths-info/{rev}``
* ``GET  /api/{type}s/{repo}/refs`` and ``/api/{type}s/{repo}/commits/{rev}``
* ``POST /api/{type}s/{repo}/preupload/{rev}`` (always ``uploadMode: regular``)
* ``POST /api/{type}s/{repo}/commit/{rev}`` (NDJSON: ``header``, ``file``,
  ``deletedFile``, ``deletedFolder``)
* ``HEAD|GET /[{type}s/]{repo}/resolve/{rev}/{path}``

Xet and LFS are never advertised: the preupload answer is always ``regular``
(so file contents arrive base64-encoded inside the commit payload) and
downloads carry no ``X-Xet-Hash`` header, so clients use plain HTTP both ways.

Run standalone with ``python tests/support/hub_server.py --root DIR --port N``.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import yaml

USER = "user"
REPO_TYPES = ("model", "dataset", "space")
API_ACTIONS = ("preupload", "commit", "revision", "tree", "paths-info", "refs", "commits")
# The Hub's default .gitattributes, committed on creation like the Hub does. This server
# still stores every file as a regular git blob (it never asks clients for LFS uploads).
DEFAULT_GITATTRIBUTES = (
    "*.bin filter=lfs diff=lfs merge=lfs -text\n"
    "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    "*.pt filter=lfs diff=lfs merge=lfs -text\n"
    "*.pth filter=lfs diff=lfs merge=lfs -text\n"
    "*.ckpt filter=lfs diff=lfs merge=lfs -text\n"
    "*.h5 filter=lfs diff=lfs merge=lfs -text\n"
    "*.onnx filter=lfs diff=lfs merge=lfs -text\n"
    "*.zip filter=lfs diff=lfs merge=lfs -text\n"
)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REV_RE = re.compile(r"^[A-Za-z0-9._/-]{1,200}$")
_GIT_TIMEOUT = 60.0


class HubError(Exception):
    """An HTTP error answered with the Hub's ``X-Error-Code`` conventions."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}


def _valid_repo_id(repo_id: str) -> bool:
    parts = repo_id.split("/")
    return 1 <= len(parts) <= 2 and all(_NAME_RE.match(p) and ".." not in p for p in parts)


def _valid_path(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and all(p not in ("", ".", "..", ".git") for p in parts) and "\x00" not in path


def _iso(timestamp: int) -> str:
    """Format a unix timestamp the way the Hub does (``%Y-%m-%dT%H:%M:%S.000Z``)."""
    moment = _dt.datetime.fromtimestamp(timestamp, tz=_dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


@dataclass(frozen=True)
class TreeEntry:
    """One entry of a git tree."""

    mode: str
    kind: str  # "blob" or "tree"
    sha: str
    size: int
    path: str


class GitStore:
    """Hub repositories stored as bare git repositories under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._locks: dict[Path, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    # -- plumbing -------------------------------------------------------------------

    def repo_dir(self, repo_type: str, repo_id: str) -> Path:
        """Directory of the bare repository of ``repo_id``."""
        return self.root.joinpath(f"{repo_type}s", *repo_id.split("/"))

    def _lock(self, path: Path) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(path, threading.Lock())

    @staticmethod
    def git(
        repo: Path,
        *args: str,
        data: bytes | None = None,
        env: dict[str, str] | None = None,
        check: bool = True,
    ) -> bytes:
        """Run ``git --git-dir=repo ARGS`` and return its stdout."""
        full_env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", **(env or {})}
        proc = subprocess.run(
            ["git", f"--git-dir={repo}", *args],
            input=data,
            capture_output=True,
            env=full_env,
            timeout=_GIT_TIMEOUT,
        )
        if check and proc.returncode != 0:
            raise HubError(500, f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout

    def exists(self, repo_type: str, repo_id: str) -> bool:
        """Whether the repository exists."""
        return (self.repo_dir(repo_type, repo_id) / "HEAD").is_file()

    def require(self, repo_type: str, repo_id: str) -> Path:
        """The repository directory, or a ``RepoNotFound`` error."""
        if not _valid_repo_id(repo_id) or not self.exists(repo_type, repo_id):
            raise HubError(404, "Repository not found", "RepoNotFound")
        return self.repo_dir(repo_type, repo_id)

    # -- repositories -----------------------------------------------------------------

    def create(self, repo_type: str, repo_id: str) -> bool:
        """Create a repository with an initial commit; False if it already exists."""
        path = self.repo_dir(repo_type, repo_id)
        with self._lock(path):
            if self.exists(repo_type, repo_id):
                return False
            path.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["git", "init", "--quiet", "--bare", "--initial-branch=main", str(path)],
                check=True,
                capture_output=True,
                timeout=_GIT_TIMEOUT,
            )
            self._write_commit(
                path, "main", None, {".gitattributes": DEFAULT_GITATTRIBUTES.encode()}, "initial commit"
            )
            return True

    def delete(self, repo_type: str, repo_id: str) -> None:
        """Delete a repository."""
        path = self.require(repo_type, repo_id)
        with self._lock(path):
            shutil.rmtree(path)

    # -- reading ----------------------------------------------------------------------

    def resolve(self, repo: Path, revision: str) -> str:
        """Commit sha of ``revision`` (branch, tag or sha), or ``RevisionNotFound``."""
        if not _REV_RE.match(revision) or revision.startswith("-") or ".." in revision:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        out = self.git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", check=False).strip()
        if not out:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return out.decode()

    def ls_tree(self, repo: Path, commit: str, path: str = "", recursive: bool = False) -> list[TreeEntry]:
        """Entries under ``path`` (``""`` = root), directories included."""
        args = ["ls-tree", "-l", "-z"]
        if recursive:
            args += ["-r", "-t"]
        args.append(commit)
        if path:
            args += ["--", path.rstrip("/") + "/"]
        entries = []
        for record in self.git(repo, *args).split(b"\x00"):
            if not record:
                continue
            meta, name = record.split(b"\t", 1)
            mode, kind, sha, size = meta.decode().split()
            entries.append(TreeEntry(mode, kind, sha, 0 if size == "-" else int(size), name.decode()))
        return entries

    def entry(self, repo: Path, commit: str, path: str) -> TreeEntry | None:
        """The tree entry at exactly ``path``, if any."""
        if not _valid_path(path):
            return None
        out = self.git(repo, "ls-tree", "-l", "-z", commit, "--", path)
        for record in out.split(b"\x00"):
            if record:
                meta, name = record.split(b"\t", 1)
                if name.decode() == path:
                    mode, kind, sha, size = meta.decode().split()
                    return TreeEntry(mode, kind, sha, 0 if size == "-" else int(size), path)
        return None

    def blob(self, repo: Path, sha: str) -> bytes:
        """Content of a blob."""
        return self.git(repo, "cat-file", "blob", sha)

    def commit_meta(self, repo: Path, commit: str, path: str | None = None) -> dict[str, Any]:
        """``{id, title, message, author, date}`` of ``commit`` (or of the last commit touching ``path``)."""
        args = ["log", "-1", "--format=%H%x00%s%x00%b%x00%an%x00%ct", commit]
        if path:
            args += ["--", path]
        sha, title, body, author, ts = self.git(repo, *args).decode().rstrip("\n").split("\x00", 4)
        return {"id": sha, "title": title, "message": body.strip(), "author": author, "date": _iso(int(ts))}

    def log(self, repo: Path, commit: str) -> list[dict[str, Any]]:
        """History of ``commit``, newest first."""
        out = self.git(repo, "log", "-z", "--format=%H%x00%s%x00%b%x00%an%x00%ct", commit)
        fields = out.decode().split("\x00")
        commits = []
        for i in range(0, len(fields) - 4, 5):
            sha, title, body, author, ts = (f.strip("\n") for f in fields[i : i + 5])
            commits.append(
                {"id": sha, "title": title, "message": body.strip(), "author": author, "date": _iso(int(ts))}
            )
        return commits

    def refs(self, repo: Path) -> dict[str, list[dict[str, str]]]:
        """Branches, tags and converts, in the ``/refs`` answer format."""
        groups = {
            "refs/heads/": "branches",
            "refs/tags/": "tags",
            "refs/convert/": "converts",
            "refs/pr/": "pullRequests",
        }
        result: dict[str, list[dict[str, str]]] = {g: [] for g in groups.values()}
        out = self.git(repo, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(*objectname)")
        for line in out.decode().splitlines():
            ref, target, peeled = line.split("\x00")
            for prefix, group in groups.items():
                if ref.startswith(prefix):
                    result[group].append({"name": ref[len(prefix) :], "ref": ref, "targetCommit": peeled or target})
        return result

    # -- writing ----------------------------------------------------------------------

    def _write_commit(
        self,
        repo: Path,
        branch: str,
        parent: str | None,
        files: dict[str, bytes | None],
        summary: str,
        description: str = "",
        deleted_folders: tuple[str, ...] = (),
    ) -> str:
        """Commit ``files`` (path -> content, None = delete) on top of ``parent``; caller holds the lock."""
        current: dict[str, tuple[str, str]] = {}
        if parent is not None:
            for e in self.ls_tree(repo, parent, recursive=True):
                if e.kind == "blob":
                    current[e.path] = (e.mode, e.sha)
        for folder in deleted_folders:
            prefix = folder.rstrip("/") + "/"
            doomed = [p for p in current if p.startswith(prefix)]
            if not doomed:
                raise HubError(404, f"A folder with this name doesn't exist: {folder}", "EntryNotFound")
            for p in doomed:
                del current[p]
        for path, content in files.items():
            if content is None:
                if path not in current:
                    raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                del current[path]
            else:
                sha = self.git(repo, "hash-object", "-w", "--stdin", data=content).decode().strip()
                current[path] = ("100644", sha)
        paths = set(current)
        for path in paths:
            for i in range(1, path.count("/") + 1):
                if path.rsplit("/", i)[0] in paths:
                    raise HubError(400, f"'{path}' conflicts with the file '{path.rsplit('/', i)[0]}'")
        with tempfile.TemporaryDirectory(prefix="hub-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            info = b"".join(f"{mode} {sha}\t{p}".encode() + b"\x00" for p, (mode, sha) in sorted(current.items()))
            self.git(repo, "update-index", "--add", "-z", "--index-info", data=info, env=env)
            tree = self.git(repo, "write-tree", env=env).decode().strip()
        message = summary if not description else f"{summary}\n\n{description}"
        who = {
            "GIT_AUTHOR_NAME": USER,
            "GIT_AUTHOR_EMAIL": f"{USER}@localhost",
            "GIT_COMMITTER_NAME": USER,
            "GIT_COMMITTER_EMAIL": f"{USER}@localhost",
        }
        parent_args = ["-p", parent] if parent else []
        sha = self.git(repo, "commit-tree", tree, *parent_args, data=message.encode(), env=who).decode().strip()
        self.git(repo, "update-ref", f"refs/heads/{branch}", sha, parent or "0" * 40)
        return sha

    def commit(
        self,
        repo_type: str,
        repo_id: str,
        branch: str,
        operations: list[dict[str, Any]],
        summary: str,
        description: str = "",
        parent_commit: str | None = None,
    ) -> str:
        """Apply NDJSON commit operations on ``branch`` and return the new commit sha."""
        repo = self.require(repo_type, repo_id)
        files: dict[str, bytes | None] = {}
        folders: list[str] = []
        for op in operations:
            key, value = op.get("key"), op.get("value") or {}
            path = str(value.get("path", "")).lstrip("/")
            if key == "deletedFolder":
                if not _valid_path(path.rstrip("/")):
                    raise HubError(400, f"Invalid path: {path!r}")
                folders.append(path)
                continue
            if not _valid_path(path):
                raise HubError(400, f"Invalid path: {path!r}")
            if key == "file":
                if value.get("encoding", "base64") != "base64":
                    raise HubError(400, f"Unsupported encoding: {value.get('encoding')}")
                files[path] = base64.b64decode(value.get("content", ""), validate=True)
            elif key == "deletedFile":
                files[path] = None
            elif key == "lfsFile":
                raise HubError(
                    400, "This server stores every file as a regular git blob; LFS uploads are not supported"
                )
            else:
                raise HubError(400, f"Unknown commit operation: {key!r}")
        with self._lock(repo):
            if not _REV_RE.match(branch) or branch.startswith("-") or ".." in branch:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            head_ref = self.git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False).strip()
            if not head_ref:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            head = head_ref.decode()
            if parent_commit and not head.startswith(parent_commit.lower()):
                raise HubError(412, f"Parent commit {parent_commit} is not the head of {branch} ({head})")
            return self._write_commit(repo, branch, head, files, summary, description, tuple(folders))


class HubRequestHandler(BaseHTTPRequestHandler):
    """Request handler; the server instance is a :class:`HubServer`."""

    server: HubServer
    protocol_version = "HTTP/1.1"
    timeout = 120  # seconds an idle keep-alive connection is kept
    error_content_type = "application/json"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.verbose:
            super().log_message(format, *args)

    # -- plumbing -----------------------------------------------------------------------

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        head_only: bool = False,
        length: int | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if not head_only and body:
            self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers=headers, head_only=self.command == "HEAD")

    def _error(self, err: HubError) -> None:
        headers = dict(err.headers)
        if err.code:
            headers["X-Error-Code"] = err.code
        headers["X-Error-Message"] = err.message.replace("\n", " ")[:500]
        self._json({"error": err.message}, status=err.status, headers=headers)

    def _dispatch(self) -> None:
        self.server.record(self.command, self.path)
        try:
            split = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            body = self._body() if self.command == "POST" else b""
            segments = [unquote(s) for s in split.path.split("/")[1:]]
            if segments and segments[-1] == "" and len(segments) > 1:
                segments = segments[:-1]
            if segments[:1] == ["api"]:
                self._api(segments[1:], query, body)
            else:
                self._resolve(segments)
        except HubError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception as exc:  # noqa: BLE001 - answer any bug as a 500, keep serving
            self._error(HubError(500, f"{type(exc).__name__}: {exc}"))

    do_GET = do_HEAD = do_POST = _dispatch  # noqa: N815

    def _require_token(self) -> None:
        auth = self.headers.get("Authorization", "")
        if not auth.lower().startswith("bearer ") or not auth[7:].strip():
            raise HubError(401, "Invalid credentials in Authorization header")

    # -- API ---------------------------------------------------------------------------

    def _api(self, seg: list[str], query: dict[str, str], body: bytes) -> None:
        store = self.server.store
        if seg == ["whoami-v2"]:
            self._require_token()
            return self._json(
                {
                    "type": "user",
                    "id": "0" * 24,
                    "name": USER,
                    "fullname": "Test User",
                    "email": f"{USER}@localhost",
                    "emailVerified": True,
                    "isPro": False,
                    "orgs": [],
                    "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": "write"}},
                }
            )
        if seg == ["validate-yaml"] and self.command == "POST":
            return self._validate_yaml(body)
        if seg[:1] == ["repos"] and seg[1:] in (["create"], ["delete"]) and self.command == "POST":
            self._require_token()
            payload = json.loads(body or b"{}")
            repo_type = payload.get("type") or "model"
            if repo_type not in REPO_TYPES:
                raise HubError(400, f"Invalid repo type: {repo_type}")
            name, org = payload.get("name", ""), payload.get("organization")
            repo_id = f"{org or USER}/{name}" if "/" not in name else name
            if not _valid_repo_id(repo_id):
                raise HubError(400, f"Invalid repo name: {repo_id!r}")
            url = self.server.repo_url(repo_type, repo_id)
            if seg[1] == "delete":
                store.delete(repo_type, repo_id)
                return self._json({})
            if not store.create(repo_type, repo_id):
                return self._json({"error": "You already created this repo", "url": url}, status=409)
            return self._json({"url": url, "name": repo_id, "id": repo_id})
        if len(seg) >= 2 and seg[0] in ("models", "datasets", "spaces"):
            repo_type = seg[0][:-1]
            rest = seg[1:]
            if len(rest) >= 2 and (rest[1] not in API_ACTIONS or store.exists(repo_type, "/".join(rest[:2]))):
                repo_id, rest = "/".join(rest[:2]), rest[2:]
            else:
                repo_id, rest = rest[0], rest[1:]
            return self._repo_api(repo_type, repo_id, rest, query, body)
        raise HubError(404, f"Not found: /api/{'/'.join(seg)}")

    def _validate_yaml(self, body: bytes) -> None:
        content = json.loads(body or b"{}").get("content", "")
        match = re.match(r"^\s*---\s*\n(.*?)\n---\s*(\n|$)", content, flags=re.S)
        errors = []
        if match:
            try:
                data = yaml.safe_load(match.group(1))
            except yaml.YAMLError as exc:
                errors.append({"message": f"Invalid YAML in README.md metadata: {exc}"})
            else:
                if data is not None and not isinstance(data, dict):
                    errors.append({"message": "README.md metadata must be a YAML mapping"})
        return self._json({"errors": errors, "warnings": []}, status=400 if errors else 200)

    def _repo_api(self, repo_type: str, repo_id: str, rest: list[str], query: dict[str, str], body: bytes) -> None:
        store = self.server.store
        repo = store.require(repo_type, repo_id)
        action = rest[0] if rest else None
        if action is None and self.command in ("GET", "HEAD"):
            return self._json(self._info(repo_type, repo_id, repo, "main", query))
        if action == "revision" and len(rest) >= 2:
            return self._json(self._info(repo_type, repo_id, repo, "/".join(rest[1:]), query))
        if action == "refs":
            refs = store.refs(repo)
            if query.get("include_prs") not in ("1", "true", "True"):
                refs.pop("pullRequests")
            return self._json(refs)
        if action == "commits" and len(rest) >= 2:
            commit = store.resolve(repo, "/".join(rest[1:]))
            items = [
                {
                    "id": c["id"],
                    "title": c["title"],
                    "message": c["message"],
                    "authors": [{"user": c["author"]}],
                    "date": c["date"],
                }
                for c in store.log(repo, commit)
            ]
            return self._paginated(items, query)
        if action == "tree" and len(rest) >= 2:
            return self._tree(repo, rest[1], "/".join(rest[2:]), query)
        if action == "paths-info" and len(rest) == 2 and self.command == "POST":
            return self._paths_info(repo, rest[1], body)
        if action == "preupload" and len(rest) == 2 and self.command == "POST":
            self._require_token()
            return self._preupload(repo, rest[1], body, query)
        if action == "commit" and len(rest) == 2 and self.command == "POST":
            self._require_token()
            return self._commit(repo_type, repo_id, rest[1], body, query)
        raise HubError(404, f"Not found: {self.path}")

    def _info(self, repo_type: str, repo_id: str, repo: Path, revision: str, query: dict[str, str]) -> dict[str, Any]:
        store = self.server.store
        commit = store.resolve(repo, revision)
        entries = [e for e in store.ls_tree(repo, commit, recursive=True) if e.kind == "blob"]
        blobs = query.get("blobs") in ("1", "true", "True")
        siblings = [{"rfilename": e.path, **({"size": e.size, "blobId": e.sha} if blobs else {})} for e in entries]
        card: Any = None
        readme = next((e for e in entries if e.path == "README.md"), None)
        if readme is not None:
            match = re.match(r"^\s*---\s*\n(.*?)\n---", store.blob(repo, readme.sha).decode(errors="replace"), re.S)
            if match:
                try:
                    card = yaml.safe_load(match.group(1))
                except yaml.YAMLError:
                    card = None
        meta = store.commit_meta(repo, commit)
        first = store.log(repo, commit)[-1]
        info: dict[str, Any] = {
            "_id": repo_id,
            "id": repo_id,
            "author": repo_id.split("/")[0] if "/" in repo_id else USER,
            "sha": commit,
            "lastModified": meta["date"],
            "createdAt": first["date"],
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": list(card.get("tags") or []) if isinstance(card, dict) else [],
            "siblings": siblings,
        }
        if isinstance(card, dict):
            info["cardData"] = card
        if repo_type == "model" and isinstance(card, dict):
            if card.get("library_name"):
                info["library_name"] = card["library_name"]
            if card.get("pipeline_tag"):
                info["pipeline_tag"] = card["pipeline_tag"]
        if blobs:
            info["usedStorage"] = sum(e.size for e in entries)
        return info

    def _paginated(self, items: list[Any], query: dict[str, str]) -> None:
        size = self.server.page_size
        start = int(query.get("cursor") or 0)
        page = items[start : start + size]
        headers = {}
        if start + size < len(items):
            split = urlsplit(self.path)
            params = {k: v for k, v in parse_qs(split.query).items() if k != "cursor"}
            params["cursor"] = [str(start + size)]
            qs = "&".join(f"{quote(k)}={quote(v)}" for k, vs in params.items() for v in vs)
            headers["Link"] = f'<{self.server.url}{split.path}?{qs}>; rel="next"'
        self._json(page, headers=headers)

    def _entry_json(self, repo: Path, commit: str, e: TreeEntry, expand: bool) -> dict[str, Any]:
        item: dict[str, Any] = {
            "type": "file" if e.kind == "blob" else "directory",
            "oid": e.sha,
            "size": e.size,
            "path": e.path,
        }
        if expand:
            meta = self.server.store.commit_meta(repo, commit, e.path)
            item["lastCommit"] = {"id": meta["id"], "title": meta["title"], "date": meta["date"]}
        return item

    def _tree(self, repo: Path, revision: str, path: str, query: dict[str, str]) -> None:
        store = self.server.store
        commit = store.resolve(repo, revision)
        path = path.strip("/")
        if path:
            target = store.entry(repo, commit, path)
            if target is None or target.kind != "tree":
                raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit})
        recursive = query.get("recursive") in ("1", "true", "True")
        expand = query.get("expand") in ("1", "true", "True")
        entries = store.ls_tree(repo, commit, path, recursive=recursive)
        self._paginated([self._entry_json(repo, commit, e, expand) for e in entries], query)

    def _paths_info(self, repo: Path, revision: str, body: bytes) -> None:
        store = self.server.store
        commit = store.resolve(repo, revision)
        ctype = self.headers.get("Content-Type", "")
        if ctype.startswith("application/json"):
            payload = json.loads(body or b"{}")
            paths, expand = list(payload.get("paths", [])), bool(payload.get("expand"))
        else:
            form = parse_qs(body.decode(), keep_blank_values=True)
            paths = form.get("paths", [])
            expand = (form.get("expand") or ["False"])[-1] in ("1", "true", "True")
        result = []
        for path in paths:
            e = store.entry(repo, commit, path.strip("/"))
            if e is not None:
                result.append(self._entry_json(repo, commit, e, expand))
        self._json(result)

    def _preupload(self, repo: Path, revision: str, body: bytes, query: dict[str, str]) -> None:
        store = self.server.store
        commit = store.resolve(repo, revision)
        files = []
        for f in json.loads(body or b"{}").get("files", []):
            path = str(f.get("path", "")).lstrip("/")
            if not _valid_path(path):
                raise HubError(400, f"Invalid path: {path!r}")
            e = store.entry(repo, commit, path)
            files.append(
                {
                    "path": path,
                    "uploadMode": "regular",
                    "shouldIgnore": False,
                    "oid": e.sha if e is not None and e.kind == "blob" else None,
                }
            )
        self._json({"files": files, "commitOid": commit})

    def _commit(self, repo_type: str, repo_id: str, revision: str, body: bytes, query: dict[str, str]) -> None:
        if query.get("create_pr") in ("1", "true", "True"):
            raise HubError(400, "Pull requests are not supported by this server")
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next((item.get("value") or {} for item in lines if item.get("key") == "header"), {})
        operations = [item for item in lines if item.get("key") != "header"]
        summary = header.get("summary") or "Upload files"
        sha = self.server.store.commit(
            repo_type,
            repo_id,
            revision,
            operations,
            summary,
            header.get("description") or "",
            header.get("parentCommit"),
        )
        url = self.server.repo_url(repo_type, repo_id)
        self._json({"success": True, "commitOid": sha, "commitUrl": f"{url}/commit/{sha}", "pullRequestUrl": None})

    # -- file downloads ----------------------------------------------------------------

    def _resolve(self, seg: list[str]) -> None:
        if self.command not in ("GET", "HEAD"):
            raise HubError(405, "Method not allowed")
        repo_type = "model"
        if seg[:1] and seg[0] in ("datasets", "spaces"):
            repo_type, seg = seg[0][:-1], seg[1:]
        if "resolve" not in seg[1:3]:
            raise HubError(404, f"Not found: {self.path}")
        i = seg.index("resolve", 1)
        repo_id, rest = "/".join(seg[:i]), seg[i + 1 :]
        if len(rest) < 2:
            raise HubError(404, f"Not found: {self.path}")
        store = self.server.store
        repo = store.require(repo_type, repo_id)
        commit = store.resolve(repo, rest[0])
        path = "/".join(rest[1:])
        e = store.entry(repo, commit, path)
        if e is None or e.kind != "blob":
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit})
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{e.sha}"',
            "Accept-Ranges": "bytes",
        }
        head_only = self.command == "HEAD"
        rng = self.headers.get("Range")
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip()) if rng else None
        if match and not head_only and (match.group(1) or match.group(2)):
            data = store.blob(repo, e.sha)
            first, last = match.group(1), match.group(2)
            start = int(first) if first else max(0, len(data) - int(last))
            end = min(int(last), len(data) - 1) if first and last else len(data) - 1
            if start >= len(data) or start > end:
                headers["Content-Range"] = f"bytes */{len(data)}"
                return self._send(416, b"", "application/octet-stream", headers)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return self._send(206, data[start : end + 1], "application/octet-stream", headers)
        body = b"" if head_only else store.blob(repo, e.sha)
        self._send(200, body, "application/octet-stream", headers, head_only=head_only, length=e.size)


class HubServer(ThreadingHTTPServer):
    """Threaded Hub-compatible server over a :class:`GitStore`."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        root: Path | str,
        host: str = "127.0.0.1",
        port: int = 0,
        page_size: int = 1000,
        verbose: bool = False,
    ) -> None:
        super().__init__((host, port), HubRequestHandler)
        self.store = GitStore(Path(root))
        self.page_size = page_size
        self.verbose = verbose
        self.requests: list[tuple[str, str]] = []
        self._requests_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Endpoint URL, e.g. ``http://127.0.0.1:PORT``."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def root(self) -> Path:
        """Directory holding the git repositories."""
        return self.store.root

    def repo_url(self, repo_type: str, repo_id: str) -> str:
        """Web URL of a repository."""
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        return f"{self.url}/{prefix}{repo_id}"

    def record(self, method: str, path: str) -> None:
        """Remember a request (method, path) for later inspection."""
        with self._requests_lock:
            self.requests.append((method, path))

    def start(self) -> HubServer:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self.server_close()


@contextmanager
def serve_hub(root: Path | str, page_size: int = 1000, verbose: bool = False) -> Iterator[HubServer]:
    """Run a :class:`HubServer` on 127.0.0.1 (ephemeral port) for the duration of the block."""
    server = HubServer(root, page_size=page_size, verbose=verbose).start()
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="directory holding the git repositories")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--quiet", action="store_true", help="do not log requests")
    args = parser.parse_args(argv)
    server = HubServer(args.root, args.host, args.port, args.page_size, verbose=not args.quiet)
    print(f"Serving {Path(args.root).resolve()} at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
