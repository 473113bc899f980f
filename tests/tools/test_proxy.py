"""The shaping proxy forwards answers byte for byte (shaped or not) and puts S3/HTTP sources
behind itself for ``dalistream bench --shape``; faults are injected a bounded number of times."""

from __future__ import annotations

import functools
import http.server
import os
import threading
import urllib.error
import urllib.request

import pytest

from dalistream.errors import ConfigError
from dalistream.tools.proxy import ShapingProxy, shaped


@pytest.fixture()
def files(tmp_path):
    data = os.urandom(300_000)
    (tmp_path / "a.bin").write_bytes(data)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", data
    server.shutdown()
    server.server_close()


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as answer:
        return answer.read()


@pytest.mark.slow
def test_shaped_answers_are_exact_and_faults_bounded(files):
    base, data = files
    with ShapingProxy(base, latency_s=0.01, rate=2e6) as proxy:
        assert get(f"{proxy.endpoint}/a.bin") == data
        assert get(f"{proxy.endpoint}/a.bin") == data
    assert proxy.connections == 2 and proxy.injected == 0
    with ShapingProxy(base, status=503, faults=2) as proxy:
        for _ in range(2):
            with pytest.raises(urllib.error.HTTPError) as info:
                get(f"{proxy.endpoint}/a.bin")
            assert info.value.code == 503 and b"SlowDown" in info.value.read()
        assert get(f"{proxy.endpoint}/a.bin") == data
    assert proxy.injected == 2
    with ShapingProxy(base, cut_after=1000, faults=1) as proxy:
        with pytest.raises(Exception):
            get(f"{proxy.endpoint}/a.bin")
        assert get(f"{proxy.endpoint}/a.bin") == data
    assert proxy.injected == 1


def test_shaped_sources_go_through_proxies(files):
    base, data = files
    urls = [f"{base}/a.bin", "/local/x.tar", f"http://user:pw@{base[len('http://'):]}/a.bin"]
    with shaped(urls, {}, "5ms,10MB/s") as (got, options):
        assert got[1] == "/local/x.tar" and options == {}
        assert got[0] != urls[0] and got[2].startswith("http://user:pw@127.0.0.1:")
        assert got[0].rsplit(":", 1)[1] == got[2].rsplit(":", 1)[1]  # one proxy per upstream host
        assert get(got[0]) == data
    with shaped(["s3://b/x.tar"], {"endpoint_url": base}, "5ms,10MB/s") as (got, options):
        assert got == ["s3://b/x.tar"] and options["endpoint_url"] != base
    with pytest.raises(ConfigError, match="endpoint"):
        with shaped(["s3://b/x.tar"], {}, "5ms,10MB/s"):
            pass
    with pytest.raises(ConfigError, match="https"):
        with shaped(["https://host/x.tar"], {}, "5ms,10MB/s"):
            pass


def test_it_counts_requests_by_method_and_answer_body_bytes(files):
    """Kept-alive connections with several requests each: GETs (whole, ranged, of a missing file),
    HEADs (whose answers announce a length but carry no body): exactly the body bytes the client
    received are counted."""
    import http.client

    base, data = files
    received = 0
    with ShapingProxy(base) as proxy:
        port = int(proxy.endpoint.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for method, path, headers in [("HEAD", "/a.bin", {}), ("GET", "/a.bin", {}), ("HEAD", "/a.bin", {}),
                                      ("GET", "/missing", {}), ("GET", "/a.bin", {"Range": "bytes=0-99"})]:
            conn.request(method, path, headers=headers)
            received += len(conn.getresponse().read())
        conn.close()
        assert get(f"{proxy.endpoint}/a.bin") == data
        received += len(data)
        counts = proxy.counts()
    assert counts["HEAD"] == 2 and counts["GET"] == 4 and counts["requests"] == 6
    assert counts["body_bytes"] == received > 3 * len(data)
