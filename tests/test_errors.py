"""The error hierarchy: classes to catch by kind, fields that say where, translation of what DALI
reports back into the same classes, and no credentials in errors, logs, repr() or state_dict()."""

import logging
import os
import pickle

import pytest

import dalistream
from dalistream import errors
from dalistream.config import StreamConfig
from dalistream.errors import (ConfigError, DalistreamError, ManifestError, SampleError, ShardFormatError, SourceError,
                               StateError, WorkerError, redact)
from dalistream.worker import ErrorPolicy, skip_totals
from dalistream.worker import WorkerSource

from helpers import data_set, key_shards, write_tar

from dalistream.dali import diagnose
SECRET = "SECRETVALUE"
SECRET_OPTIONS = {"aws_access_key_id": "AKIDSECRETVALUE", "aws_secret_access_key": SECRET,
                  "aws_session_token": "TOKEN" + SECRET, "endpoint_url": f"http://minio:{SECRET}@127.0.0.1:9"}


def test_one_hierarchy_caught_by_kind():
    for cls in (ConfigError, SourceError, ShardFormatError, SampleError, ManifestError, StateError, WorkerError):
        assert issubclass(cls, DalistreamError)
        assert getattr(dalistream, cls.__name__) is cls
    assert issubclass(ConfigError, ValueError)  # bad arguments are also ValueErrors
    with pytest.raises(DalistreamError):
        raise SampleError("x")


def test_errors_name_the_place_and_what_to_do():
    e = ShardFormatError("truncated tar", url="/d/a.tar", member="k/1.jpg", hint="re-write the shard",
                         reason="truncated").at(rank=3, worker=1)
    assert str(e) == "truncated tar [shard /d/a.tar, member 'k/1.jpg', rank 3, worker 1]. re-write the shard"
    assert (e.url, e.member, e.rank, e.worker, e.reason) == ("/d/a.tar", "k/1.jpg", 3, 1, "truncated")
    assert e.at(rank=5).rank == 3  # the first place recorded wins
    assert SampleError("x").reason == "bad_sample" and ShardFormatError("x").reason == "bad_tar"


def test_errors_survive_pickling_with_their_fields():
    e = SampleError("member too large", url="s3://b/x.tar", member="k.jpg", rank=1, worker=2, hint="h",
                    reason="too_large")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is SampleError and str(back) == str(e) and back.reason == "too_large"
    assert DalistreamError.from_fields(e.fields()).fields() == e.fields()
    assert type(DalistreamError.from_fields({"type": "NoSuchError", "message": "m"})) is WorkerError


@pytest.mark.parametrize("url,shown", [
    ("https://user:password@host/x.tar", "https://***@host/x.tar"),
    ("s3://b/x.tar?X-Amz-Signature=abc&X-Amz-Credential=def&part=1", "s3://b/x.tar?X-Amz-Signature=***&X-Amz-Credential=***&part=1"),
    ("http://h/x.tar?token=t0k&sig=s1g", "http://h/x.tar?token=***&sig=***"),
    ("/local/path/a.tar", "/local/path/a.tar"),
])
def test_urls_are_redacted(url, shown):
    assert redact(url) == shown
    e = SourceError(f"cannot open {url}", url=url, hint=f"try {url}")
    for secret in ("password", "abc", "def", "t0k", "s1g"):
        if secret in url:
            assert secret not in str(e) + repr(e) + repr(e.fields())


def test_config_stream_and_state_never_show_credentials(tmp_path):
    paths = key_shards(str(tmp_path), [3, 4])
    stream = dalistream.Stream.open(paths, fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu",
                                    storage_options=SECRET_OPTIONS, cache_dir=str(tmp_path / "cache"))
    loader = dalistream.Loader(stream)  # builds nothing until iterated
    try:
        shown = repr(stream.config) + repr(stream) + repr(loader) + repr(loader.state_dict())
        assert SECRET not in shown and "***" in shown
    finally:
        loader.close()
    config = StreamConfig(sources=(f"https://me:{SECRET}@host/a.tar", f"s3://b/a.tar?X-Amz-Signature={SECRET}"),
                          fields={"key": "__key__"}, batch_size=2)
    stream = dalistream.Stream(config, data_set(config.sources, (1, 1)))
    assert SECRET not in repr(config) + repr(stream) + repr(stream.data)
    assert config.sources[0].endswith("@host/a.tar")  # the real URL is kept for reading


def test_errors_and_warnings_from_bad_data_carry_no_credentials(tmp_path, caplog):
    good = write_tar(str(tmp_path / "a.tar"), [("k0.cls", b"1"), ("k1.cls", b"cat"), ("k2.cls", b"2")])
    config = StreamConfig(sources=(good,), fields={"label": "cls"}, batch_size=1, workers=1, on_error="skip",
                          storage_options=SECRET_OPTIONS)
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        batches = list(WorkerSource(config, data_set([good], [3]), 0).epoch_batches(0))
    assert len(batches) == 3 and "not an integer" in caplog.text and SECRET not in caplog.text
    config = config.replace(on_error="raise")
    with pytest.raises(SampleError) as info:
        list(WorkerSource(config, data_set([good], [3]), 0).epoch_batches(0))
    assert SECRET not in str(info.value) + repr(info.value.fields())


@pytest.mark.s3
def test_s3_404_is_a_source_error_without_credentials(tmp_path, caplog):
    pytest.importorskip("moto")
    pytest.importorskip("boto3")
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        options = dict(SECRET_OPTIONS, endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1", max_attempts=1)
        import boto3

        boto3.client("s3", endpoint_url=options["endpoint_url"], aws_access_key_id="a", aws_secret_access_key="b",
                     region_name="us-east-1").create_bucket(Bucket="bkt")
        with caplog.at_level(logging.DEBUG, logger="dalistream"):  # (botocore's own DEBUG log shows tokens)
            with pytest.raises(SourceError) as info:
                dalistream.Stream.open("s3://bkt/missing-0000.tar", fields={"key": "__key__"}, batch_size=1,
                                       workers=1, device="cpu", storage_options=options,
                                       cache_dir=str(tmp_path / "cache"))
        text = str(info.value) + repr(info.value) + "".join(getattr(info.value, "__notes__", []))
        assert "s3://bkt/missing-0000.tar" in text
        ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("dalistream"))
        assert SECRET not in text and SECRET not in ours
    finally:
        server.stop()


def test_sample_keys_are_strings_never_paths(tmp_path, monkeypatch):
    """Keys like ``../../x`` or ``/abs/x`` come out verbatim and nothing is written anywhere:
    dalistream never joins a key to a directory (keys are only dict keys and output bytes)."""
    monkeypatch.chdir(tmp_path)
    names = ["../../escape", "/abs/olute", "a/../../b", "ok"]
    path = write_tar(str(tmp_path / "k.tar"), [(f"{n}.cls", b"1") for n in names])
    before = set(os.listdir(tmp_path)) | set(os.listdir(tmp_path.parent))
    config = StreamConfig(sources=(path,), fields={"key": "__key__"}, batch_size=4, workers=1)
    (batch,) = list(WorkerSource(config, data_set([path], [4]), 0).epoch_batches(0))
    assert sorted(bytes(k).decode() for k in batch[0]) == sorted(names)
    assert set(os.listdir(tmp_path)) | set(os.listdir(tmp_path.parent)) == before
    assert not os.path.exists("/abs")


def test_error_policy_counts_by_kind_and_reason_and_warns_once_per_shard(caplog):
    policy = ErrorPolicy("skip")
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        for _ in range(3):
            policy.handle(SampleError("bad", url="/a.tar", reason="bad_image"), "samples")
        policy.handle(ShardFormatError("cut", url="/a.tar", reason="truncated"), "shards")
        policy.handle(ShardFormatError("cut", url="/b.tar", reason="truncated"), "shards")
        policy.count("samples", "missing_field")
    assert policy.skipped["samples"] == 4 and policy.skipped["shards"] == 2
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2  # one per shard
    assert skip_totals(policy.skipped) == {
        "skipped_samples": 4, "skipped_shards": 2,
        "skipped": {"samples": {"bad_image": 3, "missing_field": 1}, "shards": {"truncated": 2}}}
    calls = []

    def only_images(error):
        calls.append(error.reason)
        if error.reason != "bad_image":
            raise error

    policy = ErrorPolicy(only_images)
    policy.handle(SampleError("bad", reason="bad_image"), "samples")
    with pytest.raises(SampleError):
        policy.handle(SampleError("bad", reason="too_large"), "samples")
    assert calls == ["bad_image", "too_large"] and dict(policy.skipped) == {"samples:bad_image": 1}


# -- what DALI hands back, translated ----------------------------------------------------------------

def _dali_worker_text(last_lines):
    return ("\n\nException traceback received from worker thread:\n\nTraceback (most recent call last):\n"
            '  File "/x/dalistream/source.py", line 1, in _decoded\n' + last_lines + "\n")


def test_translate_rebuilds_the_worker_error_with_its_fields_and_traceback():
    original = SampleError("cannot decode field 'label'", url="/d/a.tar", member="k.cls", rank=1, worker=2,
                           reason="bad_value", hint="fix it")
    text = _dali_worker_text(f"dalistream.errors.SampleError: {original}\n{errors.FIELDS_NOTE}"
                             + __import__("json").dumps(original.fields()))
    out = diagnose.translate(Exception(text), rank=1)
    assert type(out) is SampleError and out.fields() == original.fields() and str(out) == str(original)
    assert "Traceback (most recent call last)" in out.worker_traceback and errors.FIELDS_NOTE not in out.worker_traceback
    assert not any("DALI worker process" in note for note in getattr(out, "__notes__", ()))  # one message
    logger = logging.getLogger(diagnose.__name__)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        debug = diagnose.translate(Exception(text), rank=1)
    finally:
        logger.setLevel(level)
    assert any("DALI worker process" in note for note in debug.__notes__)  # the traceback under DEBUG


def test_translate_other_worker_exceptions_and_dali_failures():
    out = diagnose.translate(Exception(_dali_worker_text("ZeroDivisionError: division by zero")), rank=0)
    assert type(out) is WorkerError and "ZeroDivisionError: division by zero" in str(out) and out.rank == 0
    assert any("DALI worker process" in note for note in out.__notes__)  # a bug: its traceback is the message
    out = diagnose.translate(RuntimeError("Worker data receiving interrupted"), rank=2)
    assert type(out) is WorkerError and "stopped" in str(out) and "rank 2" in str(out)
    decoder = ("Critical error in pipeline:\nError in CPU operator `nvidia.dali.fn.decoders.image`,\n"
               "encountered:\n\nnvImageCodec failure: '#4'\nCurrent pipeline object is no longer valid.")
    out = diagnose.translate(RuntimeError(decoder), rank=0)
    assert type(out) is SampleError and out.reason == "bad_image"
    assert "fn.decoders.image" in str(out) and "#4" in str(out) and "DALI does not say which sample" in str(out)
    already = ShardFormatError("cut", url="/a.tar")
    assert diagnose.translate(already, rank=4) is already and already.rank == 4


# -- credentials inside pipe: commands -----------------------------------------------------------------

PIPE_SECRETS = [  # (command, what must stay readable)
    (f"pipe:curl -fsS -u robot:{SECRET} http://h/a.tar", "http://h/a.tar"),
    (f"pipe:curl -s --user 'robot:{SECRET}' https://h/b.tar", "https://h/b.tar"),
    (f"pipe:curl --user=robot:{SECRET} https://h/b.tar", "https://h/b.tar"),
    (f'pipe:curl -H "Authorization: Bearer {SECRET}" https://h/c.tar', "https://h/c.tar"),
    (f"pipe:curl -H 'X-Amz-Security-Token: {SECRET}' -H 'Accept: */*' https://h/c.tar", "Accept: */*"),
    (f"pipe:curl -H Authorization:{SECRET} https://h/c.tar", "https://h/c.tar"),
    (f"pipe:curl -H 'PRIVATE-TOKEN: {SECRET}' https://gitlab/x.tar", "https://gitlab/x.tar"),
    (f"pipe:curl --oauth2-bearer {SECRET} https://h/d.tar", "https://h/d.tar"),
    (f"pipe:ssh deploy:{SECRET}@10.0.0.7 cat /d/e.tar", "@10.0.0.7 cat /d/e.tar"),
    (f"pipe:curl https://robot:{SECRET}@h/f.tar", "@h/f.tar"),
    (f"pipe:AWS_SECRET_ACCESS_KEY={SECRET} AWS_SESSION_TOKEN={SECRET} aws s3 cp s3://b/g.tar -", "s3://b/g.tar"),
    (f"pipe:env HF_TOKEN={SECRET} MY_API_KEY={SECRET} DB_PASSWORD={SECRET} fetch g.tar", "fetch g.tar"),
    (f"pipe:openssl enc -d -pass pass:x --password {SECRET} -in h.tar.enc", "-in h.tar.enc"),
]


@pytest.mark.parametrize("command,kept", PIPE_SECRETS)
def test_pipe_commands_are_redacted(command, kept):
    shown = redact(command)
    assert SECRET not in shown and "***" in shown and kept in shown
    e = SourceError(f"pipe command exited with status 1: {command}", url=command, hint=f"run `{command[5:]}`")
    assert SECRET not in str(e) + repr(e) + repr(e.fields()) + repr(pickle.loads(pickle.dumps(e)))


def test_ordinary_text_is_left_alone():
    for text in ("/d/train-0001.tar", "user@example.com wrote key=value at 12:30", "pipe:cat a.tar | zcat -f",
                 "s3://bucket/prefix/part-0001.tar", "member 'k/001.jpg' appears twice"):
        assert redact(text) == text


def test_a_failing_pipe_command_with_a_credential_is_reported_redacted(tmp_path, caplog):
    good = write_tar(str(tmp_path / "a.tar"), [("k0.cls", b"1"), ("k1.cls", b"2")])
    failing = f"pipe:env API_TOKEN={SECRET} sh -c 'exit 3' --user robot:{SECRET}"
    config = StreamConfig(sources=(good, failing), fields={"label": "cls"}, batch_size=1, workers=1, on_error="skip",
                          policy="exact", shuffle_shards=False)
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        batches = list(WorkerSource(config, data_set([good, failing], [2, 2]), 0).epoch_batches(0))
    assert sum(int(b[-1][0]) for b in batches) == 2 and "exited with status 3" in caplog.text and SECRET not in caplog.text
    assert SECRET not in repr(config)
    with pytest.raises(SourceError) as info:
        list(WorkerSource(config.replace(on_error="raise"), data_set([good, failing], [2, 2]), 0).epoch_batches(0))
    assert "status 3" in str(info.value) and SECRET not in str(info.value) + repr(info.value.fields())
    translated = diagnose.translate(Exception(_dali_worker_text(f"OSError: cannot run {failing}")), rank=0)
    assert SECRET not in str(translated) + translated.worker_traceback + "".join(translated.__notes__)


@pytest.mark.parametrize("url,member,word", [
    ("/d/a.tar", None, "shard"), ("s3://b/train-0001.tar.gz", None, "shard"), ("https://h/x.tgz?sig=***", None, "shard"),
    ("pipe:curl -s https://h/x", None, "shard"), ("https://h/get?id=3", "k.jpg", "shard"),
    ("s3://b/data/", None, "prefix"), ("/data/shards/", None, "prefix"),
    ("/data/list.csv", None, "at"), ("s3://b/data/dalistream-manifest.json", None, "at"), ("/data/images", None, "at")])
def test_an_errors_place_is_called_a_shard_only_when_it_is_one(url, member, word):
    assert f"[{word} {url}" in str(SourceError("x", url=url, member=member))


@pytest.mark.parametrize("source,place", [
    ("http://127.0.0.1:9/data/", "prefix http://127.0.0.1:9/data/"), ("/no/such/folder/", "prefix /no/such/folder/"),
    ("s3://no-such-bucket/train/", "prefix s3://no-such-bucket/train/"),
    ("s3://no-such-bucket/train", "prefix s3://no-such-bucket/train/")])  # listed as the folder it names
def test_listing_a_prefix_names_it_a_prefix_not_a_shard(source, place, moto_endpoint):
    from dalistream.sources import expand_sources

    with pytest.raises(SourceError) as caught:
        expand_sources([source], {"endpoint_url": moto_endpoint})
    assert f"[{place}]" in str(caught.value) and "[shard" not in str(caught.value)
