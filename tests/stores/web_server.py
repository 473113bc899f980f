"""A web server on 127.0.0.1 for the ``http(s)://`` store's tests, answering as a static file
server (nginx, a CDN) does: ``GET``/``HEAD`` of files held in memory with ``Range`` (206, 416),
``ETag`` and ``Last-Modified``, ``If-Range`` (a changed file comes back whole, 200), and, while
``auth`` is set, HTTP basic authentication (401 otherwise). ``put`` replaces a file (a new ETag).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import re
import threading
import time
from email.utils import formatdate
from typing import Dict, List, Optional, Tuple
from urllib.parse import unquote, urlsplit


class Served:
    """A server in a thread of this process (a context manager): ``endpoint`` is its
    ``http://127.0.0.1:PORT``."""

    def __init__(self, handler: type) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class WebServer(Served):
    """The web server (see the module doc)."""

    def __init__(self, auth: Optional[Tuple[str, str]] = None) -> None:
        self.files: Dict[str, Tuple[bytes, str, str]] = {}  # path -> (data, ETag, Last-Modified)
        self.auth = auth
        self.requests: List[str] = []
        self.lock = threading.Lock()
        super().__init__(_handler(self))

    def put(self, path: str, data: bytes) -> None:
        """Serve ``data`` at ``/path`` (replacing what was there: a new ETag)."""
        with self.lock:
            version = len(self.files) + time.monotonic_ns()
            etag = '"' + hashlib.sha256(data + str(version).encode()).hexdigest()[:32] + '"'
            self.files["/" + path.lstrip("/")] = (data, etag, formatdate(usegmt=True))


class FileHandler(http.server.BaseHTTPRequestHandler):
    """What a file server's answers share (the Hub server's too): quiet, HTTP/1.1, ranges."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: Optional[Dict[str, str]] = None,
              head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _ranged(self, data: bytes, headers: Dict[str, str], head: bool) -> None:
        """``data`` as the request's ``Range`` asks (206, or 416 past its end), else whole (200)."""
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if not wanted:
            return self._send(200, data, headers, head)
        start = int(wanted[1])
        end = min(len(data), int(wanted[2]) + 1) if wanted[2] else len(data)
        if start >= len(data):
            return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        self._send(206, data[start:end], headers, head)


def _handler(web: WebServer):
    class Handler(FileHandler):
        def do_HEAD(self) -> None:
            self.do_GET(head=True)

        def do_GET(self, head: bool = False) -> None:
            web.requests.append(f"{self.command} {self.path}")
            if web.auth is not None:
                expected = "Basic " + base64.b64encode(":".join(web.auth).encode()).decode()
                if self.headers.get("Authorization") != expected:
                    return self._send(401, b"unauthorized", {"WWW-Authenticate": 'Basic realm="shards"'}, head)
            with web.lock:
                found = web.files.get(unquote(urlsplit(self.path).path))
            if found is None:
                return self._send(404, b"not found", None, head)
            data, etag, modified = found
            headers = {"ETag": etag, "Last-Modified": modified, "Accept-Ranges": "bytes"}
            if_range = self.headers.get("If-Range")
            if if_range is not None and if_range != etag:
                return self._send(200, data, headers, head)  # the file changed: all of it
            self._ranged(data, headers, head)

    return Handler
