"""A shaping TCP proxy on loopback: a far object store, simulated.

:class:`ShapingProxy` listens on 127.0.0.1 and forwards every connection to one plain-HTTP
upstream (a moto or MinIO S3 endpoint, an HTTP file server). Each answer is held back until
``latency_s`` after the request went out (latency to first byte) and then sent at no more than
``rate`` bytes per second per connection, as a single TCP stream from a far region behaves.
For tests it can also inject faults, a bounded number of times: cut a connection once
``cut_after`` bytes of answers went through it, or answer the first request of a connection
with ``status`` (503: an S3 SlowDown error) instead of forwarding it. It counts what it forwards,
message by message (HTTP/1.1 framing by ``Content-Length``): requests by method and the bytes of
answer bodies (``counts()``: a HEAD's answer has none), so a test can tell what was read from
the store.

It runs in threads of the calling process, as a context manager::

    with ShapingProxy("http://127.0.0.1:9000", latency_s=0.04, rate=3e6) as proxy:
        options = {"endpoint_url": proxy.endpoint}    # boto3 → proxy → moto

``dalistream bench --shape 40ms,3MB/s`` puts S3/HTTP sources behind one (:func:`parse_shape`).
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter, deque
import socket
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigError
from ..io.stores import is_ranged, scheme_of

_PIECE = 16 << 10  # bytes sent between rate checks
_SLOWDOWN = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
             b"<Message>Reduce your request rate.</Message></Error>")


def parse_shape(text: str) -> Tuple[float, float]:
    """``"40ms,3MB/s"`` → ``(0.04, 3e6)``: latency to first byte (s, ms) and bytes per second
    per connection (B/s, kB/s, MB/s, GB/s; decimal units)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*(ms|s)\s*,\s*([\d.]+)\s*([kMG]?)B/s\s*", text)
    if not match:
        raise ConfigError(f"--shape {text!r}: write LATENCY,RATE, e.g. 40ms,3MB/s")
    latency = float(match[1]) / (1000 if match[2] == "ms" else 1)
    rate = float(match[3]) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[match[4]]
    if rate <= 0:
        raise ConfigError(f"--shape {text!r}: the rate must be positive")
    return latency, rate


class Framing:
    """Follows one direction of an HTTP/1.1 connection as its bytes pass: calls ``on_head(head)``
    at each message's head, which returns the length of its body (``None``: to the close of the
    connection); :meth:`feed` returns how many of the bytes given were body bytes."""

    def __init__(self, on_head: Any) -> None:
        self.on_head = on_head
        self.head = b""
        self.left = 0
        self.to_close = False

    def feed(self, data: bytes) -> int:
        body = 0
        while data:
            if self.to_close:
                return body + len(data)
            if self.left:
                n = min(self.left, len(data))
                self.left, body, data = self.left - n, body + n, data[n:]
                continue
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return body
            head, data, self.head = self.head[:end + 4], self.head[end + 4:], b""
            length = self.on_head(head)
            self.to_close, self.left = length is None, length or 0
        return body


def _header(head: bytes, name: bytes) -> Optional[bytes]:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


class ShapingProxy:
    """A loopback TCP proxy in front of ``upstream`` (``http://host:port``); see the module doc.

    ``endpoint`` is the proxy's ``http://127.0.0.1:PORT``. ``connections`` counts accepted
    connections, ``injected`` the faults injected so far, ``peak_open`` the most connections open
    at once, ``peak_waiting`` the most requests waiting for their answer's first byte at once
    (requests in flight together, however the client pools its connections).
    """

    def __init__(self, upstream: str, *, latency_s: float = 0.0, rate: Optional[float] = None, cut_after: int = 0,
                 status: int = 0, faults: int = 3) -> None:
        parts = urlsplit(upstream if "://" in upstream else f"http://{upstream}")
        if parts.scheme != "http" or not parts.port:
            raise ConfigError(f"the shaping proxy forwards to plain http://host:port endpoints, not {upstream!r}")
        self.upstream = (parts.hostname or "127.0.0.1", parts.port)
        self.latency_s, self.rate = latency_s, rate
        self.cut_after, self.status, self.left = cut_after, status, faults
        self.injected = self.connections = self.open = self.peak_open = self.waiting = self.peak_waiting = 0
        self.requests: Counter = Counter()  # by method
        self.body_bytes = 0  # bytes of answer bodies forwarded
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="dalistream-proxy", daemon=True)

    def __enter__(self) -> "ShapingProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(5)
        self.listener.close()

    def counts(self) -> Dict[str, int]:
        """What was forwarded so far: ``requests`` (all), ``GET``, ``HEAD``, … (by method) and
        ``body_bytes`` (of the answers: what the store sent of its objects and listings)."""
        with self.lock:
            return {"requests": sum(self.requests.values()), **self.requests, "body_bytes": self.body_bytes}

    def _framings(self) -> Tuple[Framing, Framing]:
        """The observers of one connection's requests and answers."""
        methods: deque = deque()

        def request(head: bytes) -> int:
            method = head.split(b" ", 1)[0].decode("latin-1")
            methods.append(method)
            with self.lock:
                self.requests[method] += 1
            if _header(head, b"transfer-encoding"):
                return None  # type: ignore[return-value]  # (chunked uploads: counted to the close)
            return int(_header(head, b"content-length") or 0)

        def answer(head: bytes) -> Optional[int]:
            status = int(head.split(b" ", 2)[1]) if head.count(b" ") >= 1 else 0
            if 100 <= status < 200:
                return 0  # (100 Continue: the real answer follows)
            method = methods.popleft() if methods else "GET"
            if method == "HEAD" or status in (204, 304):
                return 0
            length = _header(head, b"content-length")
            return int(length) if length is not None and not _header(head, b"transfer-encoding") else None

        return Framing(request), Framing(answer)

    def _wait(self, change: int) -> None:
        with self.lock:
            self.waiting += change
            self.peak_waiting = max(self.peak_waiting, self.waiting)

    def _fault(self) -> bool:
        with self.lock:
            if self.left <= 0:
                return False
            self.left -= 1
            self.injected += 1
            return True

    def _serve(self) -> None:
        while not self.stop_event.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        upstream = None
        asked: list = [None]
        with self.lock:
            self.open += 1
            self.peak_open = max(self.peak_open, self.open)
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = client.recv(65536)
                if not data:
                    return
                head += data
            if self.status and head.startswith(b"GET ") and self._fault():
                client.sendall(b"HTTP/1.1 %d Slow Down\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n"
                               b"Connection: close\r\n\r\n%s" % (self.status, len(_SLOWDOWN), _SLOWDOWN))
                return
            upstream = socket.create_connection(self.upstream)
            asked[0] = time.monotonic()  # when the request now being answered went out (None: answer started)
            self._wait(1)
            requests, answers = self._framings()
            requests.feed(head)
            upstream.sendall(head)
            threading.Thread(target=self._requests, args=(client, upstream, asked, requests), daemon=True).start()
            self._answers(client, upstream, asked, answers)
        except OSError:
            return
        finally:
            with self.lock:
                self.open -= 1
            if asked[0] is not None:  # (a request the connection's end left unanswered)
                self._wait(-1)
            for s in (client, upstream):
                if s is not None:
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    s.close()

    def _requests(self, client: socket.socket, upstream: socket.socket, asked: list, framing: Framing) -> None:
        """Client → upstream: forward requests, noting when each went out."""
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                if asked[0] is None:
                    asked[0] = time.monotonic()
                    self._wait(1)
                framing.feed(data)
                upstream.sendall(data)
        except OSError:
            pass

    def _answers(self, client: socket.socket, upstream: socket.socket, asked: list, framing: Framing) -> None:
        """Upstream → client: delay each answer's first byte, cap the rate, inject cuts."""
        sent = 0
        began, paced = time.monotonic(), 0
        while not self.stop_event.is_set():
            data = upstream.recv(65536)
            if not data:
                return
            body = framing.feed(data)
            with self.lock:
                self.body_bytes += body
            if asked[0] is not None:  # the first bytes of a new answer
                wait = asked[0] + self.latency_s - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                asked[0] = None
                self._wait(-1)
                began, paced = time.monotonic(), 0
            if self.cut_after and sent + len(data) >= self.cut_after and self._fault():
                client.sendall(data[: self.cut_after - sent])
                return
            for i in range(0, len(data), _PIECE):
                piece = data[i:i + _PIECE]
                if self.rate:
                    wait = began + paced / self.rate - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    paced += len(piece)
                client.sendall(piece)
            sent += len(data)


@contextlib.contextmanager
def shaped(urls: Sequence[str], options: Dict[str, Any], shape: str) -> Iterator[Tuple[List[str], Dict[str, Any]]]:
    """``(urls, options)`` that reach the same data through shaping proxies (``shape`` as in
    :func:`parse_shape`): an object store (``s3://``, ``gs://``, ``hf://``) through one in front of
    ``options["endpoint_url"]``, each
    ``http://`` host through its own. Local shards are left alone; ``https://`` and S3 without a
    plain-http endpoint (real AWS) cannot be shaped here."""
    latency, rate = parse_shape(shape)
    with contextlib.ExitStack() as stack:
        proxies: Dict[str, ShapingProxy] = {}

        def through(upstream: str) -> str:
            if upstream not in proxies:
                proxies[upstream] = stack.enter_context(ShapingProxy(upstream, latency_s=latency, rate=rate))
            return proxies[upstream].endpoint

        options = dict(options)
        if any(is_ranged(u) and scheme_of(u) not in ("http", "https") for u in urls):  # an object store's endpoint
            if not str(options.get("endpoint_url") or "").startswith("http://"):
                raise ConfigError("--shape with object store sources needs a plain http:// endpoint (--endpoint-url)",
                                  hint="shape an emulator's endpoint (moto, MinIO, a GCS emulator, a Hub mirror); "
                                       "TLS endpoints cannot be proxied here")
            options["endpoint_url"] = through(options["endpoint_url"])
        out = []
        for url in urls:
            if url.startswith("https://"):
                raise ConfigError("--shape cannot proxy https:// sources", url=url)
            if url.startswith("http://"):
                parts = urlsplit(url)
                host = parts.netloc.rpartition("@")[2]
                endpoint = through(f"http://{host}")
                url = urlunsplit(parts._replace(netloc=parts.netloc[: -len(host)] + endpoint[len("http://"):]))
            out.append(url)
        yield out, options
