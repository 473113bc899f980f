"""``s3://bucket/key``: Amazon S3 and S3-compatible stores through boto3, with its normal
credential chain and configuration (profiles, ``AWS_*`` variables, ``AWS_ENDPOINT_URL``, instance
roles); ``storage_options`` may name ``endpoint_url``, ``profile``, ``region``, ``anon``
(unsigned requests) or explicit keys. The version of an object is its ETag, pinned by
``If-Match``. boto3's own retries are off: retries are the layer's above."""

from __future__ import annotations

import threading
from typing import Any, List, Optional

from ...errors import ConfigError, SourceError
from ..options import RemoteOptions
from ..retry import status_error
from .base import ObjectStore, split_bucket, Answer, Data, Empty, ObjectInfo, data_file, range_header, total_size

CREDENTIALS = "boto3's credential chain: storage_options, AWS_* variables, profile, instance role"


split_s3 = split_bucket  # ``("bucket", "key")`` of ``s3://bucket/key``


class S3Store(ObjectStore):
    """``s3://`` (see module doc)."""

    scheme = "s3"
    credential_source = CREDENTIALS
    environment = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_REGION",
                   "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")

    def __init__(self, opts: RemoteOptions) -> None:
        super().__init__(opts)
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 client (created on first use)."""
        with self._lock:
            if self._client is None:
                import boto3
                import botocore
                from botocore.config import Config
                from botocore.exceptions import ProfileNotFound

                opts = self.opts
                try:
                    session = boto3.session.Session(
                        profile_name=opts.get("profile"), aws_access_key_id=opts.get("aws_access_key_id"),
                        aws_secret_access_key=opts.get("aws_secret_access_key"),
                        aws_session_token=opts.get("aws_session_token"))
                except ProfileNotFound:
                    raise ConfigError(f"AWS profile {opts.get('profile')!r} is not configured") from None
                config = Config(retries={"total_max_attempts": 1}, connect_timeout=opts.connect_timeout_s,
                                read_timeout=opts.read_timeout_s, max_pool_connections=opts.connections, tcp_keepalive=True,
                                signature_version=botocore.UNSIGNED if opts.anon else None)
                self._client = session.client("s3", endpoint_url=opts.endpoint_url, region_name=opts.get("region"),
                                              config=config)
            return self._client

    def list(self, prefix: str) -> List[ObjectInfo]:
        bucket, key = split_s3(prefix)
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key)
        found = [ObjectInfo(f"s3://{bucket}/{obj['Key']}", int(obj["Size"]), obj.get("ETag"))
                 for page in pages for obj in page.get("Contents", [])]
        return sorted(found, key=lambda o: o.url)

    def stat(self, url: str) -> ObjectInfo:
        bucket, key = split_s3(url)
        answer = self.client.head_object(Bucket=bucket, Key=key)
        return ObjectInfo(url, int(answer["ContentLength"]), answer.get("ETag"))

    def open_range(self, url: str, start: int, end: Optional[int], version: Optional[str]) -> Answer:
        from botocore.exceptions import ClientError

        bucket, key = split_s3(url)
        args: dict = {"Bucket": bucket, "Key": key}
        wanted = range_header(start, end)
        if wanted:
            args["Range"] = wanted
        if version:
            args["IfMatch"] = version
        try:
            answer = self.client.get_object(**args)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "InvalidRange" and wanted:
                return Answer(Empty(), start, version)  # opened exactly at the end (or an empty object)
            raise
        size = total_size(answer.get("ContentRange"), start, str(answer["ContentLength"]))
        return Answer(answer["Body"], size, answer.get("ETag"))

    def write(self, url: str, data: Data) -> None:
        bucket, key = split_s3(url)
        with data_file(data) as f:
            self.client.put_object(Bucket=bucket, Key=key, Body=f)

    def delete(self, url: str) -> None:
        bucket, key = split_s3(url)
        self.client.delete_object(Bucket=bucket, Key=key)  # S3 answers 204 for a missing key too

    def classify(self, error: BaseException, url: str, first: bool, what: str) -> Optional[Exception]:
        from botocore import exceptions as bc

        if isinstance(error, bc.ClientError):
            meta = error.response.get("ResponseMetadata", {})
            code = str(error.response.get("Error", {}).get("Code", ""))
            return status_error(int(meta.get("HTTPStatusCode") or 0), code, url, what, CREDENTIALS)
        if isinstance(error, (bc.NoCredentialsError, bc.PartialCredentialsError)):
            return SourceError("no usable AWS credentials found", url=url, reason="no_credentials",
                               hint="configure a profile, environment variables or an instance role; anon=True for "
                                    "public buckets")
        if isinstance(error, bc.FlexibleChecksumError):
            return SourceError("checksum mismatch: the object arrived corrupted", url=url)
        if isinstance(error, bc.ParamValidationError):
            return SourceError("invalid S3 bucket or key", url=url)
        if isinstance(error, bc.SSLError):
            return SourceError("TLS error talking to the server", url=url, hint="check the endpoint URL and certificates")
        if isinstance(error, bc.EndpointConnectionError) and not isinstance(error, bc.ConnectTimeoutError) and first:
            inner = getattr(error, "kwargs", {}).get("error", error)
            kind = "name resolution failed" if "resolve" in str(inner).lower() else "connection refused"
            return SourceError(f"cannot connect to the server ({kind})", url=url,
                               hint="check the endpoint URL (storage_options endpoint_url / AWS_ENDPOINT_URL) and network")
        if isinstance(error, bc.BotoCoreError):
            from ..retry import Retry

            return Retry(type(error).__name__)
        return None
