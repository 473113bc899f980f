"""Network clients, created lazily once per process and configuration (never at import time):
boto3 for ``s3://``, urllib3 for ``http(s)://``. Retries are never the client's: see :mod:`.retry`."""

from __future__ import annotations

import base64
import os
import threading
from dataclasses import fields
from typing import Any, Dict, Tuple
from urllib.parse import unquote, urlsplit, urlunsplit

from ..errors import ConfigError, SourceError
from .options import RemoteOptions

_clients: Dict[tuple, Any] = {}
_clients_lock = threading.Lock()


def s3_client(opts: RemoteOptions) -> Any:
    """The boto3 S3 client for ``opts`` (cached per process; boto3's own retries off)."""
    key = ("s3", os.getpid()) + tuple(getattr(opts, f.name) for f in fields(opts))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            import boto3
            import botocore
            from botocore.config import Config
            from botocore.exceptions import ProfileNotFound

            try:
                session = boto3.session.Session(
                    profile_name=opts.profile, aws_access_key_id=opts.aws_access_key_id,
                    aws_secret_access_key=opts.aws_secret_access_key, aws_session_token=opts.aws_session_token)
            except ProfileNotFound:
                raise ConfigError(f"AWS profile {opts.profile!r} is not configured") from None
            config = Config(retries={"total_max_attempts": 1}, connect_timeout=opts.connect_timeout_s,
                            read_timeout=opts.read_timeout_s, max_pool_connections=32, tcp_keepalive=True,
                            signature_version=botocore.UNSIGNED if opts.anon else None)
            client = _clients[key] = session.client("s3", endpoint_url=opts.endpoint_url,
                                                    region_name=opts.region, config=config)
        return client


def http_pool(opts: RemoteOptions) -> Any:
    """The urllib3 pool manager for ``opts`` (cached per process; retries are ours)."""
    key = ("http", os.getpid(), opts.connect_timeout_s, opts.read_timeout_s)
    with _clients_lock:
        pool = _clients.get(key)
        if pool is None:
            import urllib3

            pool = _clients[key] = urllib3.PoolManager(
                num_pools=16, maxsize=16, timeout=urllib3.Timeout(connect=opts.connect_timeout_s, read=opts.read_timeout_s),
                retries=urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=5))
        return pool


def split_s3(url: str) -> Tuple[str, str]:
    """``("bucket", "key")`` of ``s3://bucket/key``."""
    bucket, _, key = url[len("s3://"):].partition("/")
    if not bucket:
        raise SourceError("S3 URL has no bucket", url=url, hint="write s3://bucket/key")
    return bucket, key


def http_parts(url: str) -> Tuple[str, Dict[str, str]]:
    """The URL without user info, and the headers (basic auth from the user info, if any)."""
    parts = urlsplit(url)
    headers: Dict[str, str] = {}
    if parts.username is not None:
        userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(userinfo.encode()).decode()
        url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return url, headers
