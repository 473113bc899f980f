"""``hf://datasets/ORG/NAME[@REVISION]/path``: data sets on the Hugging Face Hub (or a mirror).

The endpoint is ``storage_options`` ``endpoint_url``, else ``HF_ENDPOINT``, else
https://huggingface.co; the token ``storage_options`` ``token``, else ``HF_TOKEN``, else the one
``hf auth login`` saved (as ``huggingface_hub`` finds it); none for public data sets. Reads are
ranged GETs of the Hub's ``resolve`` URLs (redirects to its file servers followed by hand, the
token never sent to another host), listings its ``tree`` API, both with the layer's retries.

**One commit per read**: a listing resolves a branch or tag (``@main``, the default) to its
commit once and names every shard at that commit (``hf://datasets/ORG/NAME@<sha>/…``), so an
epoch never mixes two commits; a shard named without a commit is pinned at its first answer
(its version is the commit). Writing (``dalistream write``/``index`` to the Hub) commits through
``huggingface_hub`` (``pip install "dalistream[hf]"``).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence
from urllib.parse import quote, unquote, urlsplit

from ...errors import SourceError
from ..options import RemoteOptions
from ..retry import status_error
from .base import ObjectStore, Answer, Data, ObjectInfo, data_file, range_header
from .http import http_pool, range_answer

CREDENTIALS = "storage_options token, HF_TOKEN, or the token saved by `hf auth login`"


class HubPath:
    """The parts of ``hf://datasets/ORG/NAME[@REVISION]/path``."""

    def __init__(self, url: str) -> None:
        rest = url[len("hf://"):]
        kind, _, rest = rest.partition("/")
        parts = rest.split("/", 2)
        if kind != "datasets" or len(parts) < 2 or not parts[0] or not parts[1]:
            raise SourceError("not a Hub data set URL", url=url, hint="write hf://datasets/ORG/NAME[@REVISION]/path")
        name, _, revision = parts[1].partition("@")
        self.repo = f"{parts[0]}/{name}"
        self.revision = unquote(revision) or "main"
        self.path = parts[2] if len(parts) > 2 else ""

    def url(self, revision: str, path: str) -> str:
        return f"hf://datasets/{self.repo}@{quote(revision, safe='')}/{path}"


class HubStore(ObjectStore):
    """``hf://`` (see module doc)."""

    scheme = "hf"
    credential_source = CREDENTIALS
    environment = ("HF_ENDPOINT", "HF_TOKEN")

    def __init__(self, opts: RemoteOptions) -> None:
        super().__init__(opts)
        self.endpoint = (opts.endpoint_url or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        self._token = opts.get("token") or os.environ.get("HF_TOKEN")

    def _headers(self) -> Dict[str, str]:
        token = self._token
        if token is None and not self.opts.anon:
            try:
                from huggingface_hub import get_token

                token = self._token = get_token() or ""
            except ImportError:
                token = self._token = ""
        return {"Authorization": f"Bearer {token}"} if token and not self.opts.anon else {}

    def _get(self, url: str, shown: str, what: str = "object") -> Any:
        from ..remote import TOTALS  # (a request outside the layer's own calls: counted too)

        TOTALS.add(requests=1)
        answer = http_pool(self.opts).request("GET", url, headers=self._headers(), preload_content=False)
        if answer.status != 200:
            answer.drain_conn()
            raise status_error(answer.status, "", shown, what, CREDENTIALS)
        return answer

    def commit(self, repo: str, revision: str, shown: str) -> str:
        """The commit a branch, tag or commit names now (one request)."""
        if re.fullmatch(r"[0-9a-f]{40}", revision):
            return revision
        answer = self._get(f"{self.endpoint}/api/datasets/{repo}/revision/{quote(revision, safe='')}", shown,
                           "data set revision")
        return json.loads(answer.data)["sha"]

    def pin(self, urls: Sequence[str], commits: Optional[Dict[Any, str]] = None) -> List[str]:
        """``urls`` with each branch or tag replaced by its commit: one request per repo and branch
        not in ``commits`` (which keeps them, for one listing's many calls)."""
        out, commits = [], {} if commits is None else commits
        for url in urls:
            where = HubPath(url)
            key = (where.repo, where.revision)
            if key not in commits:
                commits[key] = self.commit(where.repo, where.revision, url)
            out.append(where.url(commits[key], where.path))
        return out

    def list(self, prefix: str) -> List[ObjectInfo]:
        where = HubPath(prefix)
        sha = self.commit(where.repo, where.revision, prefix)
        folder = where.path[:where.path.rfind("/") + 1] if "/" in where.path else ""
        url: Optional[str] = (f"{self.endpoint}/api/datasets/{where.repo}/tree/{sha}/{quote(folder.rstrip('/'))}"
                              "?recursive=true&expand=false")
        found: List[ObjectInfo] = []
        while url:
            answer = http_pool(self.opts).request("GET", url, headers=self._headers(), preload_content=False)
            if answer.status == 404:  # no such folder: nothing listed
                answer.drain_conn()
                return []
            if answer.status != 200:
                answer.drain_conn()
                raise status_error(answer.status, "", prefix, "folder", CREDENTIALS)
            found += [ObjectInfo(where.url(sha, e["path"]), int(e.get("size", 0)), sha)
                      for e in json.loads(answer.data) if e.get("type") == "file" and e["path"].startswith(where.path)]
            url = _next_page(answer.headers.get("Link", ""))
            url = url if url is None or "://" in url else self.endpoint + url
        return sorted(found, key=lambda o: o.url)

    def _resolve(self, url: str, revision: str) -> str:
        where = HubPath(url)
        return f"{self.endpoint}/datasets/{where.repo}/resolve/{quote(revision, safe='')}/{quote(where.path)}"

    def stat(self, url: str) -> ObjectInfo:
        where = HubPath(url)
        answer = http_pool(self.opts).request("HEAD", self._resolve(url, where.revision), headers=self._headers(),
                                              preload_content=False, redirect=False)
        answer.drain_conn()
        if answer.status >= 400:
            raise status_error(answer.status, "", url, "object", CREDENTIALS)
        size = answer.headers.get("X-Linked-Size") or answer.headers.get("Content-Length")
        return ObjectInfo(url, int(size) if size else None, answer.headers.get("X-Repo-Commit"))

    def open_range(self, url: str, start: int, end: Optional[int], version: Optional[str]) -> Answer:
        where = HubPath(url)
        pool = http_pool(self.opts)
        target = self._resolve(url, version or where.revision)
        headers = self._headers()
        wanted = range_header(start, end)
        if wanted:
            headers["Range"] = wanted
        commit = version
        for _ in range(5):  # the Hub redirects large files to its file servers: followed here
            answer = pool.request("GET", target, headers=headers, preload_content=False, decode_content=False,
                                  redirect=False)
            commit = commit or answer.headers.get("X-Repo-Commit")
            if answer.status not in (301, 302, 303, 307, 308):
                break
            answer.drain_conn()
            location = answer.headers.get("Location", "")
            nxt = location if "://" in location else f"{self.endpoint}{location}"
            if urlsplit(nxt).netloc != urlsplit(target).netloc:
                headers.pop("Authorization", None)  # the token is for the Hub only
            target = nxt
        found = range_answer(answer, url, start, end, None, CREDENTIALS)
        if version is None and commit is None:
            raise SourceError("the Hub did not say which commit it served", url=url,
                              hint="the endpoint is not a Hugging Face Hub (X-Repo-Commit missing)")
        return Answer(found.body, found.size, commit, found.ranged)

    @staticmethod
    def canonical(url: str) -> str:
        """``url`` without its revision: the same file at any commit (how manifest rows match)."""
        where = HubPath(url)
        return f"hf://datasets/{where.repo}/{where.path}"

    def write(self, url: str, data: Data) -> None:
        where = HubPath(url)
        if re.fullmatch(r"[0-9a-f]{40}", where.revision):
            raise SourceError("cannot write at a commit: a write makes a new commit on a branch", url=url,
                              hint="name the branch: hf://datasets/ORG/NAME@main/… (or leave the revision out)")
        try:
            from huggingface_hub import HfApi
        except ImportError:
            from . import missing_extra

            raise missing_extra("huggingface_hub", "hf") from None
        token = self._headers().get("Authorization", "")[len("Bearer "):] or None
        with data_file(data) as f:
            HfApi(endpoint=self.endpoint, token=token).upload_file(
                path_or_fileobj=f, path_in_repo=where.path, repo_id=where.repo, repo_type="dataset",
                revision=where.revision, commit_message=f"dalistream: {where.path}")

    def delete(self, url: str) -> None:
        from huggingface_hub import HfApi
        from huggingface_hub.utils import EntryNotFoundError

        where = HubPath(url)
        token = self._headers().get("Authorization", "")[len("Bearer "):] or None
        try:
            HfApi(endpoint=self.endpoint, token=token).delete_file(
                where.path, repo_id=where.repo, repo_type="dataset", revision=where.revision,
                commit_message=f"dalistream: remove {where.path}")
        except EntryNotFoundError:
            pass

    def classify(self, error: BaseException, url: str, first: bool, what: str) -> Optional[Exception]:
        response = getattr(error, "response", None)
        status = getattr(response, "status_code", None)
        if type(error).__module__.startswith("huggingface_hub") and status:
            return status_error(int(status), "", url, what, CREDENTIALS)
        return None


def _next_page(link: str) -> Optional[str]:
    """The ``rel="next"`` URL of a ``Link`` header, if any."""
    for part in link.split(","):
        if 'rel="next"' in part and "<" in part:
            return part[part.index("<") + 1:part.index(">")]
    return None
