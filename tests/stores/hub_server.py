"""A small Hugging Face Hub on 127.0.0.1 for the ``hf://`` store's tests: the endpoints the store
and ``huggingface_hub``'s uploads use, with the Hub's own answers.

- ``GET /api/datasets/{repo}/revision/{rev}``: ``{"id", "sha"}`` of a branch, tag or commit;
- ``GET /api/datasets/{repo}/tree/{rev}[/{path}]?recursive=true``: the files below, paged
  (``Link: <…&cursor=N>; rel="next"``) as the Hub pages them;
- ``GET|HEAD /datasets/{repo}/resolve/{rev}/{path}`` with ``Range``; ``X-Repo-Commit`` and
  ``ETag`` headers; files over ``redirect_over`` bytes answered by a 302 to a file URL (the Hub
  sends large files to its file servers);
- ``POST /api/datasets/{repo}/preupload/{rev}`` and ``/commit/{rev}`` (NDJSON, inline base64
  files): a new commit on the branch.

While ``token`` is set, every request needs ``Authorization: Bearer <token>`` (401 otherwise).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from typing import Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

from web_server import FileHandler, Served


class Hub:
    """Repositories as commits of ``{path: bytes}``; branches name commits."""

    def __init__(self) -> None:
        self.commits: Dict[str, Dict[str, bytes]] = {}
        self.branches: Dict[Tuple[str, str], str] = {}
        self.token: Optional[str] = None
        self.page = 3  # entries per tree page: small, so that the tests see paging
        self.redirect_over = 100_000
        self.requests: List[str] = []
        self.lock = threading.Lock()

    def commit(self, repo: str, files: Dict[str, Optional[bytes]], branch: str = "main") -> str:
        with self.lock:
            parent = self.branches.get((repo, branch))
            tree = dict(self.commits.get(parent, {})) if parent else {}
            for path, data in files.items():
                if data is None:
                    tree.pop(path, None)
                else:
                    tree[path] = data
            sha = hashlib.sha1(f"{repo}{len(self.commits)}{parent}".encode()).hexdigest()
            self.commits[sha] = tree
            self.branches[(repo, branch)] = sha
            return sha

    def resolve(self, repo: str, rev: str) -> Optional[str]:
        with self.lock:
            if rev in self.commits:
                return rev
            return self.branches.get((repo, rev))


def _handler(hub: Hub):
    class Handler(FileHandler):
        def _json(self, value, headers=None) -> None:
            self._send(200, json.dumps(value).encode(), dict(headers or {}, **{"Content-Type": "application/json"}))

        def _authorized(self) -> bool:
            if hub.token is not None and self.headers.get("Authorization") != f"Bearer {hub.token}":
                self._send(401, b'{"error": "Invalid credentials"}')
                return False
            return True

        def do_HEAD(self) -> None:
            self.do_GET(head=True)

        def do_GET(self, head: bool = False) -> None:
            hub.requests.append(f"{self.command} {self.path}")
            parts = urlsplit(self.path)
            path, query = unquote(parts.path), parse_qs(parts.query)
            if path.startswith("/cdn/"):  # a file server: no token needed (the Hub signed the URL)
                return self._file(hub.commits[query["commit"][0]][path[len("/cdn/"):]], query["commit"][0], head)
            if not self._authorized():
                return
            m = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/revision/(.+)", path)
            if m:
                sha = hub.resolve(m[1], m[2])
                return self._json({"id": m[1], "sha": sha}) if sha else self._send(404, b'{"error": "Revision"}')
            m = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/tree/([^/]+)/?(.*)", path)
            if m:
                return self._tree(m[1], m[2], m[3], query)
            m = re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if m:
                sha = hub.resolve(m[1], m[2])
                data = hub.commits.get(sha, {}).get(m[3]) if sha else None
                if data is None:
                    return self._send(404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"}, head)
                if len(data) > hub.redirect_over:
                    return self._send(302, b"", {"Location": f"/cdn/{m[3]}?commit={sha}&X-Amz-Signature=abc",
                                                 "X-Repo-Commit": sha, "X-Linked-Size": str(len(data)),
                                                 "ETag": _etag(data)}, head)
                return self._file(data, sha, head)
            self._send(404, b'{"error": "no such endpoint"}')

        def _tree(self, repo: str, rev: str, folder: str, query) -> None:
            sha = hub.resolve(repo, rev)
            if sha is None:
                return self._send(404, b'{"error": "Revision"}')
            prefix = folder.rstrip("/") + "/" if folder else ""
            files = sorted(p for p in hub.commits[sha] if p.startswith(prefix))
            if folder and not files:
                return self._send(404, b'{"error": "Entry not found"}')
            recursive = query.get("recursive", ["false"])[0] == "true"
            entries = [{"type": "file", "oid": hashlib.sha1(hub.commits[sha][p]).hexdigest(), "size": len(hub.commits[sha][p]),
                        "path": p} for p in files if recursive or "/" not in p[len(prefix):]]
            start = int(query.get("cursor", ["0"])[0])
            page = entries[start:start + hub.page]
            headers = {}
            if start + hub.page < len(entries):
                headers["Link"] = f'<{self.path.split("&cursor=")[0]}&cursor={start + hub.page}>; rel="next"'
            self._json(page, headers)

        def _file(self, data: bytes, sha: str, head: bool) -> None:
            self._ranged(data, {"X-Repo-Commit": sha, "ETag": _etag(data), "Accept-Ranges": "bytes"}, head)

        def do_POST(self) -> None:
            hub.requests.append(f"POST {self.path}")
            if not self._authorized():
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            path = unquote(urlsplit(self.path).path)
            m = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/preupload/(.+)", path)
            if m:
                files = json.loads(body).get("files", [])
                return self._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                             for f in files]})
            m = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/commit/(.+)", path)
            if m:
                files: Dict[str, Optional[bytes]] = {}
                for line in body.decode().splitlines():
                    item = json.loads(line)
                    if item.get("key") == "file":
                        value = item["value"]
                        files[value["path"]] = base64.b64decode(value["content"])
                    elif item.get("key") == "deletedFile":
                        files[item["value"]["path"]] = None
                sha = hub.commit(m[1], files, m[2])
                return self._json({"commitUrl": f"/datasets/{m[1]}/commit/{sha}", "commitOid": sha,
                                   "pullRequestUrl": None})
            self._send(404, b'{"error": "no such endpoint"}')

    return Handler


def _etag(data: bytes) -> str:
    return '"' + hashlib.sha256(data).hexdigest() + '"'


class HubServer(Served):
    """The server in a thread of this process: ``endpoint`` is its ``http://127.0.0.1:PORT``."""

    def __init__(self) -> None:
        self.hub = Hub()
        super().__init__(_handler(self.hub))
