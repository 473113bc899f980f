"""``az://container/path`` (and ``abfs://container/path``, ``abfs://container@ACCOUNT.dfs.core.windows.net/path``):
Azure Blob Storage through ``azure-storage-blob`` (``pip install "dalistream[azure]"``).

Credentials, first found: ``storage_options`` ``connection_string``, else
``AZURE_STORAGE_CONNECTION_STRING``; else the account (``account_name``, the ``abfs://`` host, or
``AZURE_STORAGE_ACCOUNT_NAME``) with ``account_key`` or ``sas_token`` from ``storage_options``,
``anon`` for public containers, or ``DefaultAzureCredential`` (``azure-identity``: environment,
workload and managed identity, Azure CLI login). ``endpoint_url`` replaces the account's blob
endpoint. The version of a blob is its ETag, pinned by ``If-Match``. The SDK's own retries are off
(retries are the layer's above); a range is fetched in requests of up to ``part_bytes`` (one per
part the layer above asks for), and a cut transfer resumes from the last whole request.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional, Tuple

from ...errors import SourceError
from ..options import RemoteOptions
from ..retry import Retry, changed, status_error
from .base import ObjectStore, Answer, Data, Empty, ObjectInfo, data_file, total_size

CREDENTIALS = ("storage_options connection_string / account_key / sas_token, AZURE_STORAGE_CONNECTION_STRING, "
               "or DefaultAzureCredential (environment, managed identity, Azure CLI login)")


def split_az(url: str) -> Tuple[Optional[str], str, str]:
    """``(account or None, container, path)`` of an ``az://`` or ``abfs://`` URL."""
    scheme, _, rest = url.partition("://")
    head, _, path = rest.partition("/")
    container, _, host = head.partition("@")
    if not container:
        raise SourceError(f"{scheme}:// URL has no container", url=url, hint=f"write {scheme}://container/path")
    return (host.split(".", 1)[0] if host else None), container, path


class _Chunks:
    """A download's chunks as a body with ``read(n)``."""

    def __init__(self, chunks: Any) -> None:
        self._chunks = chunks
        self._view = memoryview(b"")

    def read(self, n: int = -1) -> bytes:
        if not self._view:
            chunk = next(self._chunks, b"")
            if not chunk:
                return b""
            self._view = memoryview(chunk)
        n = len(self._view) if n < 0 else n
        data, self._view = bytes(self._view[:n]), self._view[n:]
        return data

    def close(self) -> None:
        self._chunks = iter(())
        self._view = memoryview(b"")


class AzureStore(ObjectStore):
    """``az://`` and ``abfs://`` (see module doc)."""

    scheme = "az"
    credential_source = CREDENTIALS
    environment = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME")

    def __init__(self, opts: RemoteOptions) -> None:
        super().__init__(opts)
        # read where the SDK's users set them
        self._connection_string = opts.get("connection_string") or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        self._account = opts.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
        self._services: Dict[Optional[str], Any] = {}
        self._lock = threading.Lock()

    def _service(self, account: Optional[str]) -> Any:
        with self._lock:
            service = self._services.get(account)
            if service is None:
                service = self._services[account] = self._connect(account)
            return service

    def _connect(self, account: Optional[str]) -> Any:
        try:
            from azure.storage.blob import BlobServiceClient
        except ImportError:
            from . import missing_extra

            raise missing_extra("azure-storage-blob", "azure") from None
        opts = self.opts
        # One GET per range the layer above asks for (a part, within its read-ahead budget): the SDK
        # cuts a download into requests of max_chunk_get_size and pays its pipeline per request
        # (at 64 kB requests that was most of the CPU a megabyte of Azure cost)
        chunk = max(opts.part_bytes, opts.chunk_bytes, 64 << 10)
        common = dict(retry_total=0, max_single_get_size=chunk, max_chunk_get_size=chunk,
                      connection_timeout=opts.connect_timeout_s, read_timeout=opts.read_timeout_s)
        if self._connection_string and not account:
            try:
                return BlobServiceClient.from_connection_string(self._connection_string, **common)
            except ValueError:  # (its text may quote the string: never shown)
                raise SourceError("the Azure connection string cannot be used", reason="no_credentials",
                                  hint="check AZURE_STORAGE_CONNECTION_STRING / storage_options connection_string"
                                  ) from None
        account = account or self._account
        if not account and not opts.endpoint_url:
            raise SourceError("no Azure storage account named", reason="no_credentials",
                              hint="set AZURE_STORAGE_CONNECTION_STRING, or storage_options account_name (or "
                                   "AZURE_STORAGE_ACCOUNT_NAME), or write abfs://container@ACCOUNT.dfs.core.windows.net/…")
        url = opts.endpoint_url or f"https://{account}.blob.core.windows.net"
        credential: Any = None
        if opts.get("account_key"):
            credential = {"account_name": account, "account_key": opts.get("account_key")}
        elif opts.get("sas_token"):
            credential = opts.get("sas_token")
        elif not opts.anon:
            try:
                from azure.identity import DefaultAzureCredential
            except ImportError:
                from . import missing_extra

                raise missing_extra("azure-identity", "azure") from None
            credential = DefaultAzureCredential()
        return BlobServiceClient(url, credential=credential, **common)

    def _blob(self, url: str) -> Any:
        account, container, path = split_az(url)
        return self._service(account).get_blob_client(container, path)

    def list(self, prefix: str) -> List[ObjectInfo]:
        account, container, path = split_az(prefix)
        head = prefix[:len(prefix) - len(path)]
        blobs = self._service(account).get_container_client(container).list_blobs(name_starts_with=path or None)
        return sorted((ObjectInfo(head + b.name, int(b.size), b.etag) for b in blobs), key=lambda o: o.url)

    def stat(self, url: str) -> ObjectInfo:
        props = self._blob(url).get_blob_properties()
        return ObjectInfo(url, int(props.size), props.etag)

    def open_range(self, url: str, start: int, end: Optional[int], version: Optional[str]) -> Answer:
        from azure.core import MatchConditions
        from azure.core.exceptions import HttpResponseError

        kwargs: Dict[str, Any] = {"max_concurrency": 1}
        if version:
            kwargs.update(etag=version, match_condition=MatchConditions.IfNotModified)
        length = None if end is None else max(0, end - start)
        if length == 0:
            return Answer(Empty(), None, version)
        try:
            download = self._blob(url).download_blob(offset=start, length=length, **kwargs)
        except HttpResponseError as e:
            if e.status_code == 416:
                return Answer(Empty(), start, version)
            raise
        props = download.properties
        size = total_size(getattr(props, "content_range", None), start, None) or int(props.size)
        return Answer(_Chunks(iter(download.chunks())), size, props.etag)

    def write(self, url: str, data: Data) -> None:
        with data_file(data) as f:
            self._blob(url).upload_blob(f, overwrite=True)

    def delete(self, url: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._blob(url).delete_blob()
        except ResourceNotFoundError:
            pass

    def classify(self, error: BaseException, url: str, first: bool, what: str) -> Optional[Exception]:
        try:
            from azure.core import exceptions as ae
        except ImportError:
            return None
        if isinstance(error, ae.ResourceModifiedError):
            return changed(url)
        if isinstance(error, ae.ClientAuthenticationError) and getattr(error, "status_code", None) is None:
            return SourceError("no usable Azure credentials found", url=url, reason="no_credentials",
                               hint=f"configure one of: {CREDENTIALS}")
        if isinstance(error, ae.HttpResponseError) and error.status_code:
            return status_error(int(error.status_code), str(getattr(error, "error_code", "") or ""), url, what,
                                CREDENTIALS)
        if isinstance(error, ae.ServiceRequestError) and first:
            return SourceError("cannot connect to the Azure endpoint", url=url,
                               hint="check the endpoint (connection string BlobEndpoint, storage_options endpoint_url)")
        if isinstance(error, (ae.ServiceRequestError, ae.ServiceResponseError, ae.IncompleteReadError,
                              ae.DecodeError)):
            return Retry(type(error).__name__)
        if isinstance(error, ae.AzureError):
            return SourceError(f"Azure request failed ({type(error).__name__})", url=url)
        return None
