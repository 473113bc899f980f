"""Every store's emulator on 127.0.0.1, holding one local folder, for benchmarks and trying the
stores by hand (the tests start their own: tests/stores/conftest.py)::

    python tests/emulators/serve.py FOLDER [--prefix bench] [--manifest-only 50000]

uploads FOLDER's files under PREFIX/ to moto (S3), gcp-storage-emulator (GCS), Azurite (Azure;
``npm ci`` in tests/emulators first), the test Hub server and a web server (``http://``: ranges
and ETags, no listing), prints one JSON line per store with its ``source`` (a web server's: the
shards named one by one, ``sources``), its ``endpoint`` and the environment that reaches it, then
``{"ready": true}``, and serves until interrupted or terminated. ``--manifest-only N`` puts only
a counts-only manifest of N shards under PREFIX/ (start-up at scale: the shards themselves are
never read; the web server's source is then a brace pattern naming them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from urllib.parse import quote

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "stores"))  # hub_server.py, web_server.py

AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
BUCKET = "bench"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _files(folder: str, manifest_only: int) -> dict:
    if manifest_only:
        rows = [{"url": f"part-{i:06d}.tar", "samples": 10 + i % 7, "bytes": 40960} for i in range(manifest_only)]
        return {"dalistream-manifest.json": json.dumps({"format": "dalistream-manifest", "version": 1,
                                                        "shards": rows}).encode()}
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))
            if os.path.isfile(os.path.join(folder, name))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default="")
    parser.add_argument("--prefix", default="bench")
    parser.add_argument("--manifest-only", type=int, default=0)
    args = parser.parse_args()
    files = _files(args.folder, args.manifest_only)
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    out = []

    import boto3
    from moto.server import ThreadedMotoServer

    port = _free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}")
    s3.create_bucket(Bucket=BUCKET)
    for name, data in files.items():
        s3.put_object(Bucket=BUCKET, Key=f"{args.prefix}/{name}", Body=data)
    out.append({"store": "s3", "source": f"s3://{BUCKET}/{args.prefix}/", "endpoint": f"http://127.0.0.1:{port}",
                "env": {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}})

    from gcp_storage_emulator.server import create_server

    port = _free_port()
    gcs = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    gcs.start()
    for name, data in files.items():
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name="
            f"{quote(f'{args.prefix}/{name}', safe='')}", data=data, method="POST")
        urllib.request.urlopen(request).read()
    out.append({"store": "gs", "source": f"gs://{BUCKET}/{args.prefix}/", "endpoint": f"http://127.0.0.1:{port}",
                "env": {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}})

    azurite = None
    binary = os.environ.get("DALISTREAM_AZURITE") or os.path.join(HERE, "node_modules", ".bin", "azurite-blob")
    if os.path.exists(binary):
        from azure.storage.blob import BlobServiceClient

        azurite = subprocess.Popen([binary, "--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence",
                                    "--skipApiVersionCheck", "--loose", "--silent"], stdout=subprocess.PIPE, text=True)
        endpoint = None
        while endpoint is None:
            line = azurite.stdout.readline()
            found = re.search(r"listens on (http://127\.0\.0\.1:\d+)", line)
            endpoint = found.group(1) if found else None
            if not line:
                sys.exit("Azurite did not start")
        connection = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
                      f"BlobEndpoint={endpoint}/devstoreaccount1;")
        container = BlobServiceClient.from_connection_string(connection).get_container_client(BUCKET)
        container.create_container()
        for name, data in files.items():
            container.upload_blob(f"{args.prefix}/{name}", data, overwrite=True)
        out.append({"store": "az", "source": f"az://{BUCKET}/{args.prefix}/", "endpoint": endpoint,
                    "env": {"AZURE_STORAGE_CONNECTION_STRING": connection}})

    from hub_server import HubServer

    hub = HubServer().__enter__()
    hub.hub.commit("org/bench", {f"{args.prefix}/{name}": data for name, data in files.items()})
    out.append({"store": "hf", "source": f"hf://datasets/org/bench/{args.prefix}/", "endpoint": hub.endpoint,
                "env": {"HF_ENDPOINT": hub.endpoint}})

    from web_server import WebServer

    web = WebServer().__enter__()
    for name, data in files.items():
        web.put(f"{args.prefix}/{name}", data)
    shards = [f"{web.endpoint}/{args.prefix}/{name}" for name in files if name.endswith((".tar", ".tgz", ".tar.gz"))]
    if args.manifest_only:
        shards = [f"{web.endpoint}/{args.prefix}/part-{{000000..{args.manifest_only - 1:06d}}}.tar"]
    out.append({"store": "http", "source": shards[0] if args.manifest_only else None, "sources": shards,
                "endpoint": web.endpoint, "env": {}})

    for line in out:
        print(json.dumps(line), flush=True)
    print(json.dumps({"ready": True}), flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    try:
        while not stop:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        moto.stop()
        gcs.stop()
        web.__exit__(None, None, None)
        if azurite is not None:
            azurite.terminate()
            azurite.wait()


if __name__ == "__main__":
    main()
