"""A server that accepts connections and never answers: the user hears of it after a few seconds,
and the read fails in bounded, stated time -- over HTTP and S3 (the same retry loop), for the
first bytes of a shard and for its size (HEAD), never a silent wait of minutes per object."""

import logging
import socket
import threading

import pytest

from dalistream.errors import SourceError
from dalistream.io.options import remote_options
from dalistream.io.remote import open_remote, stat_object


@pytest.fixture
def silent_server():
    """Accepts every connection, reads nothing, answers nothing; closed by the test."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


OPTIONS = {"read_timeout_s": 0.5, "connect_timeout_s": 0.5, "stall_warning_s": 0.2, "backoff_s": 0.01,
           "max_attempts": 4}


def _bounded(fn, seconds=60):
    out = {}
    thread = threading.Thread(target=lambda: out.update(result=_capture(fn)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return out["result"]


def _capture(fn):
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001 -- handed back to the test
        return e


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["http", "s3"])
@pytest.mark.parametrize("call", ["open", "head"])
@pytest.mark.parametrize("limit", ["attempts", "time"])
def test_a_silent_server_is_reported_then_given_up_on(silent_server, caplog, monkeypatch, scheme, call, limit):
    options = dict(OPTIONS, give_up_s=1.2 if limit == "time" else 300.0, max_attempts=100 if limit == "time" else 3)
    if scheme == "s3":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        options["endpoint_url"] = f"http://{silent_server}"
        url = "s3://bucket/shard-0000.tar"
    else:
        url = f"http://{silent_server}/shard-0000.tar?token=secret123"
    opts = remote_options(options)
    run = (lambda: open_remote(url, 0, opts).read(10)) if call == "open" else (lambda: stat_object(url, opts))
    with caplog.at_level(logging.WARNING, logger="dalistream"):
        error = _bounded(run)  # (the hang guard: never a wait of minutes)
    assert isinstance(error, SourceError), error
    assert "giving up after" in str(error) and ("attempts" if limit == "attempts" else "without an answer") in str(error)
    assert "no answer from" in caplog.text and "giving up after about" in caplog.text
    assert "secret123" not in caplog.text + str(error)
