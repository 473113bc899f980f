"""Secrets never printed: every query parameter that can carry one, in errors, ``plan`` output and
cache files; and the S3/HTTP client libraries' own DEBUG logs (botocore's signed requests, urllib3's
request lines), redacted by the record factory dalistream installs -- run against a real S3 server
(moto) and a real HTTP server with the real libraries."""

import io
import logging
import os
import subprocess
import sys
import tarfile

import pytest

import dalistream
from dalistream.errors import SourceError, redact, redact_client_logs

from helpers import REPO, key_shards, served_folder

SECRET = "s3cr3tValue42"


@pytest.mark.parametrize("name", ["key", "Key", "token", "access_token", "sig", "Signature", "X-Amz-Signature",
                                  "X-Amz-Credential", "X-Amz-Security-Token", "X-Goog-Signature", "password",
                                  "api_key", "apikey", "auth", "jwt", "client_secret", "AWSAccessKeyId", "code", "sas"])
def test_every_query_parameter_that_can_carry_a_secret_is_redacted(name):
    for url in (f"https://host/a.tar?{name}={SECRET}", f"https://host/a.tar?x=1&{name}={SECRET}&y=2",
                f"pipe:curl -s 'https://host/a.tar?{name}={SECRET}'"):
        assert SECRET not in redact(url), url
    assert redact("https://host/a.tar?monkey=1&keyframe=2&v=3") == "https://host/a.tar?monkey=1&keyframe=2&v=3"


@pytest.fixture
def served(tmp_path):
    (path,) = key_shards(str(tmp_path / "www"), [4])
    with served_folder(str(tmp_path / "www")) as base:
        yield f"{base}/{os.path.basename(path)}"


def test_a_signed_url_appears_nowhere_dalistream_prints(served, tmp_path, caplog):
    url = f"{served}?X-Amz-Signature={SECRET}&key={SECRET}"
    missing = f"{served[:-4]}-gone.tar?key={SECRET}"
    with pytest.raises(SourceError) as e:
        dalistream.Stream.open(missing, fields={"key": "__key__"}, batch_size=1, workers=1,
                               cache_dir=str(tmp_path / "c"))
    assert SECRET not in str(e.value) and SECRET not in repr(e.value) and SECRET not in (e.value.url or "")
    with caplog.at_level(logging.DEBUG):
        stream = dalistream.Stream.open(url, fields={"key": "__key__"}, batch_size=1, workers=1,
                                        cache_dir=str(tmp_path / "c"))
    assert stream.counts == (4,)
    assert SECRET not in repr(stream) and SECRET not in caplog.text
    for folder, _, files in os.walk(tmp_path / "c"):  # the scan cache
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                assert SECRET.encode() not in f.read(), name
    plan = subprocess.run([sys.executable, "-m", "dalistream", "plan", url, "--json"], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO,
                                                          DALISTREAM_CACHE=str(tmp_path / "c2")))
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert SECRET not in plan.stdout + plan.stderr


@pytest.mark.s3
def test_client_libraries_debug_logs_are_redacted(moto_endpoint, caplog):
    """botocore at DEBUG prints each signed request (the Authorization header with the access key
    id, presigned query strings), urllib3 its request lines: with dalistream's record factory
    installed, none of it reaches a handler unredacted, whatever the logging configuration."""
    import boto3
    import urllib3

    os.environ["AWS_ACCESS_KEY_ID"] = "AKIA" + SECRET.upper()
    redact_client_logs()
    redact_client_logs()  # idempotent: one factory
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    with caplog.at_level(logging.DEBUG):
        for name in ("botocore", "urllib3", "boto3"):
            logging.getLogger(name).setLevel(logging.DEBUG)
        client.create_bucket(Bucket="secrets")
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            info = tarfile.TarInfo("a.cls")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
        client.put_object(Bucket="secrets", Key="a.tar", Body=data.getvalue())
        signed = client.generate_presigned_url("get_object", Params={"Bucket": "secrets", "Key": "a.tar"})
        assert "Signature=" in signed
        signature = signed.split("Signature=")[1].split("&")[0]
        urllib3.PoolManager().request("GET", signed)
    from dalistream.errors import CLIENT_LOGGERS

    # what the client libraries logged (moto's own server, werkzeug, is the test's, not the client's)
    text = "\n".join(r.getMessage() for r in caplog.records if r.name.split(".")[0] in CLIENT_LOGGERS)
    assert "Authorization" in text or "authorization" in text.lower()  # the libraries did log their requests
    assert SECRET.upper() not in text and SECRET not in text
    assert signature not in text
    for name in ("botocore", "urllib3", "boto3"):
        logging.getLogger(name).setLevel(logging.NOTSET)
