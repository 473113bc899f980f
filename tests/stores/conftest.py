"""Real servers on 127.0.0.1 for every store, started and stopped here: moto (S3),
``gcp-storage-emulator`` (GCS), Azurite (Azure Blob, from ``tests/emulators``' npm lock file) and
a small Hub server (``hub_server.py``: the resolve, tree and revision endpoints).

Each is wrapped in a :class:`Backend`: the same data set under ``ROOT/ds/`` on every store, its
storage options, a way to put objects there with the server's own means (never dalistream's),
the options that reach the same server through another endpoint (a fault-injecting proxy) and
options holding a wrong credential.

An emulator that cannot be started here is a skip naming why, except where ``.ci/run`` sets
``DALISTREAM_EMULATORS=required``: then it is a failure.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # hub_server.py

from helpers import PEER_DATA, free_port  # noqa: E402

REQUIRED = os.environ.get("DALISTREAM_EMULATORS") == "required"
BUCKET = "store-suite"  # (moto keeps one state per process: a bucket of its own)
SECRET = "wrongSecretDoNotPrint77"


def unavailable(reason: str) -> None:
    """Skip (locally) or fail (in CI, where every emulator must run) for a missing emulator."""
    if REQUIRED:
        pytest.fail(f"emulator required by DALISTREAM_EMULATORS=required: {reason}")
    pytest.skip(reason)


class Backend:
    """One store with the data set under ``root`` (``SCHEME://…/ds``).

    ``listable`` and ``writable``: what the store can do (a web server neither); ``remote``:
    reached over a connection (not local files); ``credential``: read with a credential a test can
    make wrong. ``via(endpoint)`` is the same store reached through another endpoint (a
    fault-injecting or shaping proxy); ``wrong_credential()`` the same store with a wrong secret."""

    listable = writable = remote = credential = True

    def __init__(self, name: str, root: str, options: Dict[str, Any], endpoint: Optional[str],
                 put: Callable[[str, bytes], None], through: Optional[Callable[[str], Dict[str, Any]]] = None,
                 wrong: Optional[Callable[[], Any]] = None, env: Optional[Dict[str, str]] = None,
                 secret: str = SECRET, reroot: Optional[Callable[[str], str]] = None,
                 wrong_root: Optional[str] = None) -> None:
        self.name, self.root, self.options, self.endpoint = name, root, options, endpoint
        self._put, self.through, self.wrong = put, through, wrong
        self.env = env or {}
        self.secret = secret  # the wrong credential's secret part, which nothing may print
        self._reroot, self._wrong_root = reroot, wrong_root

    def url(self, key: str) -> str:
        return f"{self.root}/{key}"

    def listed(self, key: str) -> str:
        """The URL a listing gives for ``key`` (the Hub's names the commit listed)."""
        return self.url(key)

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``root/key`` with the server's own client."""
        self._put(key, data)

    def via(self, endpoint: str) -> "Backend":
        """This store reached through ``endpoint`` (a proxy in front of :attr:`endpoint`)."""
        other = copy.copy(self)
        other.options = self.through(endpoint)
        if self._reroot is not None:
            other.root = self._reroot(endpoint)
        return other

    @contextlib.contextmanager
    def wrong_credential(self) -> Iterator["Backend"]:
        """This store with a wrong credential (whose secret part is :attr:`secret`)."""
        with self.wrong() as options:
            other = copy.copy(self)
            other.options = options
            if self._wrong_root is not None:
                other.root = self._wrong_root
            yield other

    def __repr__(self) -> str:
        return self.name


@pytest.fixture(scope="session")
def local_set(tmp_path_factory) -> Dict[str, Any]:
    """The data set every store holds under ``ds/``: synthetic image shards, webdataset shards
    and a real peer shard (gzip), plus an object that is not a shard."""
    import numpy as np
    import webdataset as wds

    from dalistream.tools.synth import SynthSpec, write_dataset

    folder = str(tmp_path_factory.mktemp("store-set"))
    write_dataset(folder, SynthSpec(shards=4, samples_per_shard=12, uneven=True, seed=4, prefix="train"))
    rng = np.random.default_rng(3)
    with wds.TarWriter(os.path.join(folder, "wds-00000.tar")) as sink:
        for i in range(9):
            sink.write({"__key__": f"w/{i:03d}", "bin": rng.bytes(int(rng.integers(2000, 40000))), "cls": b"1"})
    shutil.copy(os.path.join(PEER_DATA, "sample.tgz"), os.path.join(folder, "sample.tgz"))
    names = sorted(os.listdir(folder))
    return {"folder": folder, "names": names}


def _fill(backend: Backend, local_set: Dict[str, Any]) -> Backend:
    for name in local_set["names"]:
        with open(os.path.join(local_set["folder"], name), "rb") as f:
            backend.put(f"ds/{name}", f.read())
    backend.put("ds/README.txt", b"not a shard")
    shard = open(os.path.join(local_set["folder"], "train-00000.tar"), "rb").read()
    backend.put("nested/a/x-00000.tar", shard)
    backend.put("nested/b/y-00000.tar", shard)
    return backend


# -- S3: moto ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def s3_backend(moto_endpoint, local_set) -> Iterator[Backend]:
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.create_bucket(Bucket=BUCKET)

    def set_auth(count: str) -> None:
        request = urllib.request.Request(f"{moto_endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).read()

    @contextlib.contextmanager
    def wrong() -> Iterator[Dict[str, Any]]:
        set_auth("0")  # moto now checks signatures: a wrong key gets a real 403
        try:
            yield {"endpoint_url": moto_endpoint, "aws_access_key_id": "AKIDWRONG", "aws_secret_access_key": SECRET}
        finally:
            set_auth("inf")

    backend = Backend("s3", f"s3://{BUCKET}", {"endpoint_url": moto_endpoint}, moto_endpoint,
                      lambda key, data: client.put_object(Bucket=BUCKET, Key=key, Body=data),
                      lambda endpoint: {"endpoint_url": endpoint}, wrong,
                      env={"AWS_ENDPOINT_URL": moto_endpoint})
    yield _fill(backend, local_set)


# -- GCS: gcp-storage-emulator -----------------------------------------------------------------

class _GCSFaithful:
    """What the stub emulator leaves out of Google Cloud Storage and the store relies on, added
    around its handlers: the ``x-goog-generation`` header of a download, ``ifGenerationMatch``
    (412 when the object changed), and, while ``token`` is set, bearer authentication (401)."""

    def __init__(self) -> None:
        self.token: Optional[str] = None

    def install(self) -> Callable[[], None]:
        from http import HTTPStatus

        from gcp_storage_emulator import server
        from gcp_storage_emulator.handlers import objects

        original_handle, original_download = server.Router.handle, objects.download
        faithful = self

        def handle(router, method):
            auth = router._request_handler.headers.get("Authorization")
            if faithful.token is not None and auth != f"Bearer {faithful.token}":
                handler = router._request_handler
                handler.send_response(401)
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            return original_handle(router, method)

        def download(request, response, storage, *args, **kwargs):
            try:
                obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            except Exception:  # noqa: BLE001 - the original answers 404
                return original_download(request, response, storage, *args, **kwargs)
            wanted = request.query.get("ifGenerationMatch")
            if wanted and wanted[0] != obj["generation"]:
                response.status = HTTPStatus.PRECONDITION_FAILED
                return
            response["x-goog-generation"] = obj["generation"]
            return original_download(request, response, storage, *args, **kwargs)

        routes = tuple((regex, dict(handlers)) for regex, handlers in server.HANDLERS)
        saved = server.HANDLERS
        for _, handlers in routes:
            for method, fn in handlers.items():
                if fn is original_download:
                    handlers[method] = download
        server.HANDLERS = routes
        server.Router.handle = handle
        objects.download = download

        def uninstall() -> None:
            server.HANDLERS = saved
            server.Router.handle = original_handle
            objects.download = original_download

        return uninstall


@pytest.fixture(scope="module")
def gcs_backend(local_set) -> Iterator[Backend]:
    try:
        from gcp_storage_emulator.server import create_server
    except ImportError:
        unavailable("gcp-storage-emulator is not installed (pip install -e '.[test]')")
    import logging

    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    port = free_port()
    faithful = _GCSFaithful()
    uninstall = faithful.install()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"

    def put(key: str, data: bytes) -> None:
        from urllib.parse import quote

        request = urllib.request.Request(
            f"{endpoint}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={quote(key, safe='')}", data=data,
            method="POST", headers={"Content-Type": "application/octet-stream"})
        if faithful.token:
            request.add_header("Authorization", f"Bearer {faithful.token}")
        urllib.request.urlopen(request, timeout=30).read()

    @contextlib.contextmanager
    def wrong() -> Iterator[Dict[str, Any]]:
        faithful.token = "the-right-token"
        try:
            yield {"endpoint_url": endpoint, "token": SECRET}
        finally:
            faithful.token = None

    backend = Backend("gs", f"gs://{BUCKET}", {"endpoint_url": endpoint, "anon": True}, endpoint, put,
                      lambda other: {"endpoint_url": other, "anon": True}, wrong,
                      env={"STORAGE_EMULATOR_HOST": endpoint})
    try:
        yield _fill(backend, local_set)
    finally:
        server.stop()
        uninstall()


# -- Azure Blob: Azurite (npm, pinned in tests/emulators/package-lock.json) ---------------------

AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_command() -> List[str]:
    """The Azurite blob server: ``DALISTREAM_AZURITE`` (set by .ci/run after ``npm ci``), else
    tests/emulators/node_modules' copy."""
    found = os.environ.get("DALISTREAM_AZURITE") or os.path.join(os.path.dirname(HERE), "emulators", "node_modules",
                                                                   ".bin", "azurite-blob")
    if not os.path.exists(found):
        unavailable(f"Azurite is not installed ({found}): run `npm ci` in tests/emulators")
    if shutil.which("node") is None:
        unavailable("Azurite needs node, which is not installed")
    return [found]


def azure_connection(endpoint: str, key: str = AZURITE_KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={key};"
            f"BlobEndpoint={endpoint}/devstoreaccount1;")


@pytest.fixture(scope="module")
def azure_backend(local_set, tmp_path_factory) -> Iterator[Backend]:
    import base64
    import re

    try:
        from azure.storage.blob import BlobServiceClient
    except ImportError:
        unavailable("azure-storage-blob is not installed (pip install -e '.[test]')")
    command = azurite_command() + ["--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence",
                                   "--skipApiVersionCheck", "--loose"]
    log = str(tmp_path_factory.mktemp("azurite") / "azurite.log")
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, endpoint = time.monotonic() + 60, None
        while endpoint is None:
            text = open(log).read()
            found = re.search(r"listens on (http://127\.0\.0\.1:\d+)", text)
            if found:
                endpoint = found.group(1)
            elif proc.poll() is not None or time.monotonic() > deadline:
                unavailable(f"Azurite did not start: {text[-500:]}")
            else:
                time.sleep(0.1)
        connection = azure_connection(endpoint)
        container = BlobServiceClient.from_connection_string(connection).get_container_client(BUCKET)
        container.create_container()
        secret = base64.b64encode(SECRET.encode()).decode()

        @contextlib.contextmanager
        def wrong() -> Iterator[Dict[str, Any]]:
            yield {"connection_string": azure_connection(endpoint, secret)}

        backend = Backend("az", f"az://{BUCKET}", {"connection_string": connection}, endpoint,
                          lambda key, data: container.upload_blob(key, data, overwrite=True),
                          lambda other: {"connection_string": azure_connection(other)}, wrong,
                          env={"AZURE_STORAGE_CONNECTION_STRING": connection}, secret=secret)
        yield _fill(backend, local_set)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the Hugging Face Hub: a small server speaking its API (hub_server.py) ----------------------

HUB_REPO = "org/shards"


@pytest.fixture(scope="module")
def hub_backend(local_set) -> Iterator[Backend]:
    from hub_server import HubServer

    with HubServer() as server:
        hub = server.hub
        hub.token = "hub-test-token"

        @contextlib.contextmanager
        def wrong() -> Iterator[Dict[str, Any]]:
            yield {"endpoint_url": server.endpoint, "token": SECRET}

        backend = Backend("hf", f"hf://datasets/{HUB_REPO}", {"endpoint_url": server.endpoint, "token": hub.token},
                          server.endpoint, lambda key, data: hub.commit(HUB_REPO, {key: data}),
                          lambda other: {"endpoint_url": other, "token": hub.token}, wrong,
                          env={"HF_ENDPOINT": server.endpoint, "HF_TOKEN": hub.token})
        backend.listed = lambda key: f"hf://datasets/{HUB_REPO}@{hub.branches[(HUB_REPO, 'main')]}/{key}"
        backend.server = server
        yield _fill(backend, local_set)


# -- a web server (http://): web_server.py, basic authentication always on ----------------------

@pytest.fixture(scope="module")
def http_backend(local_set) -> Iterator[Backend]:
    from web_server import WebServer

    with WebServer(auth=("reader", "right-password")) as server:
        host = server.endpoint[len("http://"):]

        @contextlib.contextmanager
        def wrong() -> Iterator[Dict[str, Any]]:
            yield {}

        backend = Backend("http", f"http://reader:right-password@{host}", {}, server.endpoint, server.put,
                          lambda other: {}, wrong, wrong_root=f"http://reader:{SECRET}@{host}",
                          reroot=lambda other: f"http://reader:right-password@{other[len('http://'):]}")
        backend.listable = backend.writable = False
        backend.server = server
        yield _fill(backend, local_set)


# -- local files ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_backend(local_set, tmp_path_factory) -> Iterator[Backend]:
    root = str(tmp_path_factory.mktemp("local-store"))

    def put(key: str, data: bytes) -> None:  # as a writer does: a new file renamed into place
        path = os.path.join(root, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".new", "wb") as f:
            f.write(data)
        os.replace(path + ".new", path)

    backend = Backend("local", root, {}, None, put)
    backend.remote = backend.credential = False
    yield _fill(backend, local_set)


FIXTURES = {"s3": "s3_backend", "gs": "gcs_backend", "az": "azure_backend", "hf": "hub_backend",
            "http": "http_backend", "local": "local_backend"}


@pytest.fixture(params=list(FIXTURES))
def backend(request) -> Backend:
    """Each store in turn (the shared suite runs once per store)."""
    return request.getfixturevalue(FIXTURES[request.param])
