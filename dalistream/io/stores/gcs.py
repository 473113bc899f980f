"""``gs://bucket/name``: Google Cloud Storage through its JSON API, with Application Default
Credentials (``google-auth``: ``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth
application-default login``, the metadata server of a Google Cloud machine).

Like Google's own client, ``STORAGE_EMULATOR_HOST`` points it at an emulator (and then sends no
credentials unless a ``token`` is given); ``storage_options`` may name ``endpoint_url``, ``anon`` (public buckets, no
credentials) and ``token``: a credentials JSON file (service account or authorized user) or an
OAuth2 access token. The version of an object is its generation, pinned by
``ifGenerationMatch`` (a rewritten object is a ``changed`` error, never spliced). Only
``google-auth`` is needed (``pip install "dalistream[gcs]"``): ranged reads, listing and uploads
are plain HTTP requests through urllib3, streamed, with the layer's retries.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict, List, Optional
from urllib.parse import quote

from ...errors import SourceError
from ..options import RemoteOptions
from ..retry import changed, status_error
from .base import ObjectStore, split_bucket, Answer, Data, Empty, ObjectInfo, data_bytes, range_header, total_size
from .http import http_pool

CREDENTIALS = ("Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default "
               "login, the metadata server) or storage_options token")
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


split_gs = split_bucket  # ``("bucket", "name")`` of ``gs://bucket/name``


def _file_credentials(path: str) -> Any:
    """Credentials from a service account or authorized user JSON file."""
    with open(path) as f:
        info = json.load(f)
    if info.get("type") == "service_account":
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info(info, scopes=[SCOPE])
    from google.oauth2.credentials import Credentials

    return Credentials.from_authorized_user_info(info, scopes=[SCOPE])


class GCSStore(ObjectStore):
    """``gs://`` (see module doc)."""

    scheme = "gs"
    credential_source = CREDENTIALS
    environment = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")

    def __init__(self, opts: RemoteOptions) -> None:
        super().__init__(opts)
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")  # read where Google's client reads it
        endpoint = opts.endpoint_url or emulator or "https://storage.googleapis.com"
        self.endpoint = (endpoint if "://" in endpoint else "http://" + endpoint).rstrip("/")
        self.anonymous = opts.anon or (bool(emulator) and not opts.get("token"))  # an emulator checks no credentials
        self._http: Any = None
        self._lock = threading.Lock()

    @property
    def http(self) -> Any:
        """What requests go through: urllib3, with credentials applied unless anonymous."""
        with self._lock:
            if self._http is None:
                pool = http_pool(self.opts)
                self._http = pool if self.anonymous else self._authorized(pool)
            return self._http

    def _authorized(self, pool: Any) -> Any:
        try:
            import google.auth
            from google.auth.transport.urllib3 import AuthorizedHttp
        except ImportError:
            from . import missing_extra

            raise missing_extra("google-auth", "gcs") from None
        token = self.opts.get("token")
        if token and os.path.isfile(token):
            try:
                return AuthorizedHttp(_file_credentials(token), http=pool)
            except (ValueError, KeyError, OSError) as e:  # (the file's content is never shown)
                raise SourceError(f"the credentials file cannot be used ({type(e).__name__})", url=token,
                                  reason="no_credentials", hint="pass a service account or authorized user JSON file"
                                  ) from None
        if token:
            from google.oauth2.credentials import Credentials

            return AuthorizedHttp(Credentials(token), http=pool)  # an access token, used as given
        credentials, _project = google.auth.default(scopes=[SCOPE])
        return AuthorizedHttp(credentials, http=pool)

    def _request(self, method: str, url: str, shown: str, what: str = "object", **kw: Any) -> Any:
        answer = self.http.urlopen(method, url, preload_content=False, decode_content=False, **kw)
        if answer.status in (200, 206):
            return answer
        answer.drain_conn()
        if answer.status == 412:
            raise changed(shown)
        raise status_error(answer.status, "", shown, what, CREDENTIALS)

    def _object_url(self, url: str, media: bool) -> str:
        bucket, name = split_gs(url)
        base = f"{self.endpoint}/download/storage/v1" if media else f"{self.endpoint}/storage/v1"
        return f"{base}/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"

    def list(self, prefix: str) -> List[ObjectInfo]:
        bucket, name = split_gs(prefix)
        found: List[ObjectInfo] = []
        page: Optional[str] = None
        while True:
            query = f"prefix={quote(name, safe='')}&fields=items(name,size,generation),nextPageToken"
            if page:
                query += f"&pageToken={quote(page, safe='')}"
            answer = self._request("GET", f"{self.endpoint}/storage/v1/b/{quote(bucket, safe='')}/o?{query}", prefix,
                                   "bucket")
            listing = json.loads(answer.data or b"{}")
            found += [ObjectInfo(f"gs://{bucket}/{item['name']}", int(item["size"]), str(item.get("generation")))
                      for item in listing.get("items") or []]
            page = listing.get("nextPageToken")
            if not page:
                return sorted(found, key=lambda o: o.url)

    def stat(self, url: str) -> ObjectInfo:
        answer = self._request("GET", self._object_url(url, media=False) + "?fields=size,generation", url)
        meta = json.loads(answer.data)
        return ObjectInfo(url, int(meta["size"]), str(meta.get("generation")))

    def open_range(self, url: str, start: int, end: Optional[int], version: Optional[str]) -> Answer:
        target = self._object_url(url, media=True) + "?alt=media"
        if version:
            target += f"&ifGenerationMatch={version}"
        headers: Dict[str, str] = {"Accept-Encoding": "identity"}
        wanted = range_header(start, end)
        if wanted:
            headers["Range"] = wanted
        answer = self.http.urlopen("GET", target, headers=headers, preload_content=False, decode_content=False)
        if answer.status == 416 and wanted:
            answer.drain_conn()
            return Answer(Empty(), start, version)
        if answer.status not in (200, 206):
            answer.drain_conn()
            if answer.status == 412:
                raise changed(url)
            raise status_error(answer.status, "", url, "object", CREDENTIALS)
        generation = answer.headers.get("x-goog-generation") or version
        if version and generation != version:
            answer.drain_conn()
            raise changed(url)
        size = total_size(answer.headers.get("Content-Range"), start, answer.headers.get("Content-Length"))
        return Answer(answer, size, generation, ranged=answer.status == 206 or not wanted)

    def write(self, url: str, data: Data) -> None:
        bucket, name = split_gs(url)
        target = (f"{self.endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=media"
                  f"&name={quote(name, safe='')}")
        self._request("POST", target, url, body=data_bytes(data),
                      headers={"Content-Type": "application/octet-stream"}).drain_conn()

    def delete(self, url: str) -> None:
        answer = self.http.urlopen("DELETE", self._object_url(url, media=False), preload_content=False)
        answer.drain_conn()
        if answer.status not in (200, 204, 404):
            raise status_error(answer.status, "", url, "object", CREDENTIALS)

    def classify(self, error: BaseException, url: str, first: bool, what: str) -> Optional[Exception]:
        try:
            from google.auth import exceptions as ga
        except ImportError:
            return None
        if isinstance(error, ga.DefaultCredentialsError):
            return SourceError("no usable Google credentials found", url=url, reason="no_credentials",
                               hint="run `gcloud auth application-default login`, set GOOGLE_APPLICATION_CREDENTIALS, "
                                    "or pass storage_options anon=True for a public bucket")
        if isinstance(error, ga.RefreshError):
            return SourceError("Google credentials were refused (the token could not be refreshed)", url=url,
                               reason="denied", hint=f"check the credentials in use: {CREDENTIALS}")
        if isinstance(error, ga.TransportError):
            from ..retry import Retry

            return Retry(type(error).__name__)
        return None
