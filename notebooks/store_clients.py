"""What each store's client costs: ranged-GET throughput and CPU per MB against the emulators, the
weight of its dependencies and its import time, next to the alternatives a store could use.

``tests/emulators/serve.py`` (a child process) serves one 64 MiB object on every emulator; this
process reads it as ranged GETs of 8 MiB, one after the other on one connection, through each
client, alternating clients, ``--repeats`` times (medians). CPU is this process's (all its
threads; the emulator's own CPU is in the other process). Clients that are not installed are left
out: the alternatives are not dalistream's dependencies, install them beside it to compare
(``pip install --target DIR google-cloud-storage obstore`` and ``--path DIR``)::

    python notebooks/store_clients.py [--repeats 5] [--path DIR] [--json OUT.json]

- ``dalistream``: the store as dalistream reads (``store.open_range``): boto3 for S3, urllib3 with
  google-auth's credentials for GCS, azure-storage-blob for Azure, urllib3 for the Hub and HTTP;
- ``urllib3``: an unsigned GET of the same bytes (the floor: what any client must spend), where the
  emulator serves one without a signature (GCS, the Hub, a web server; moto and Azurite refuse it);
- ``google-cloud-storage``, ``obstore`` (one Rust client for S3, GCS and Azure), ``requests``,
  ``huggingface_hub`` (``HfFileSystem``): the alternatives.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "emulators"))
from bench_stores import serve  # noqa: E402  (serve.py in a child process, its stores once ready)
SIZE, PART = 64 << 20, 8 << 20
NAME = "big.bin"


def read_parts(get: Callable[[int, int], int]) -> None:
    """The object as ranged GETs of PART bytes, one after the other; ``get(start, end)`` returns
    the bytes it received."""
    got = sum(get(start, min(start + PART, SIZE)) for start in range(0, SIZE, PART))
    if got != SIZE:
        raise RuntimeError(f"read {got} bytes of {SIZE}")


def drain(body: Any) -> int:
    n = 0
    while True:
        chunk = body.read(1 << 20)
        if not chunk:
            return n
        n += len(chunk)


def clients(stores: Dict[str, dict]) -> Dict[str, Dict[str, Callable[[], Callable[[int, int], int]]]]:
    """store -> client -> a function making the ranged reader (made once, outside the timing)."""
    out: Dict[str, Dict[str, Callable]] = {}
    for name, store in stores.items():
        os.environ.update(store["env"])
        source = store.get("source") or f"{store['endpoint']}/bench/"  # (a web server's: no listing)
        url = source + NAME
        endpoint = store["endpoint"]

        def ours(url: str = url) -> Callable[[int, int], int]:
            from dalistream.io.stores import store_for

            s = store_for(url)

            def get(start: int, end: int) -> int:
                answer = s.open_range(url, start, end, None)
                try:
                    return drain(answer.body)
                finally:
                    answer.body.close()
            return get

        out[name] = {"dalistream": ours}
        plain = {"gs": f"{endpoint}/download/storage/v1/b/bench/o/"
                 f"bench%2F{NAME}?alt=media", "hf": f"{endpoint}/datasets/org/bench/resolve/main/bench/{NAME}",
                 "http": f"{endpoint}/bench/{NAME}"}.get(name)
        if plain:
            out[name]["urllib3"] = lambda plain=plain: _urllib3(plain)
        if name == "http":
            out[name]["requests"] = lambda plain=plain: _requests(plain)
        if name == "gs":
            out[name]["google-cloud-storage"] = lambda endpoint=endpoint: _gcs_client(endpoint)
        if name in ("s3", "gs", "az"):
            out[name]["obstore"] = lambda name=name, store=store: _obstore(name, store)
        if name == "hf":
            out[name]["huggingface_hub"] = lambda endpoint=endpoint: _hf_fs(endpoint)
    return out


def _urllib3(url: str) -> Callable[[int, int], int]:
    import urllib3

    pool = urllib3.PoolManager()

    def get(start: int, end: int) -> int:
        answer = pool.request("GET", url, headers={"Range": f"bytes={start}-{end - 1}"}, preload_content=False)
        try:
            return drain(answer)
        finally:
            answer.release_conn()
    return get


def _requests(url: str) -> Callable[[int, int], int]:
    import requests

    session = requests.Session()

    def get(start: int, end: int) -> int:
        with session.get(url, headers={"Range": f"bytes={start}-{end - 1}"}, stream=True) as answer:
            return sum(len(c) for c in answer.iter_content(1 << 20))
    return get


def _gcs_client(endpoint: str) -> Callable[[int, int], int]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    blob = storage.Client(project="bench", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": endpoint}).bucket("bench").blob(f"bench/{NAME}")
    return lambda start, end: len(blob.download_as_bytes(start=start, end=end - 1, checksum=None))


def _obstore(name: str, store: dict) -> Callable[[int, int], int]:
    import obstore
    from obstore.store import AzureStore, GCSStore, S3Store

    http = {"allow_http": True}
    if name == "s3":
        s = S3Store("bench", endpoint=store["endpoint"], access_key_id="testing", secret_access_key="testing",
                    region="us-east-1", client_options=http)
    elif name == "gs":
        s = GCSStore("bench", base_url=store["endpoint"], skip_signature=True, client_options=http)
    else:
        conn = dict(p.split("=", 1) for p in store["env"]["AZURE_STORAGE_CONNECTION_STRING"].strip(";").split(";"))
        s = AzureStore("bench", account_name=conn["AccountName"], account_key=conn["AccountKey"],
                       endpoint=conn["BlobEndpoint"], client_options=http)
    return lambda start, end: len(obstore.get_range(s, f"bench/{NAME}", start=start, end=end))


def _hf_fs(endpoint: str) -> Callable[[int, int], int]:
    from huggingface_hub import HfFileSystem

    fs = HfFileSystem(endpoint=endpoint, token=False)
    f = fs.open(f"datasets/org/bench/bench/{NAME}", "rb", block_size=0)

    def get(start: int, end: int) -> int:
        f.seek(start)
        return len(f.read(end - start))
    return get


def measure(made: Dict[str, Dict[str, Callable]], repeats: int) -> List[dict]:
    readers: Dict[tuple, Any] = {}
    for store, by_client in made.items():
        for client, make in by_client.items():
            try:
                readers[(store, client)] = make()
                read_parts(readers[(store, client)])  # warm: connections, credentials
            except Exception as e:  # noqa: BLE001 - a client that cannot reach this emulator is left out, said so
                print(f"{store}/{client}: left out ({type(e).__name__}: {str(e)[:160]})", file=sys.stderr)
                readers.pop((store, client), None)
    runs: Dict[tuple, list] = {key: [] for key in readers}
    for _ in range(repeats):
        for key, get in readers.items():  # alternating
            wall, cpu = time.perf_counter(), time.process_time()
            read_parts(get)
            runs[key].append((time.perf_counter() - wall, time.process_time() - cpu))
    rows = []
    for (store, client), got in runs.items():
        wall = statistics.median(w for w, _ in got)
        cpu = statistics.median(c for _, c in got)
        rows.append({"store": store, "client": client, "mb_per_s": SIZE / wall / 1e6, "cpu_ms_per_mb": cpu * 1e3 / (SIZE / 1e6)})
        print(f"{store:5s} {client:22s} {rows[-1]['mb_per_s']:8.1f} MB/s {rows[-1]['cpu_ms_per_mb']:7.2f} CPU ms/MB",
              file=sys.stderr, flush=True)
    return rows


def closure(package: str, seen: Optional[set] = None) -> set:
    """``package`` and everything it requires (installed, without extras), by distribution name."""
    seen = set() if seen is None else seen
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return seen
    name = dist.metadata["Name"].lower().replace("_", "-")
    if name in seen:
        return seen
    seen.add(name)
    for req in dist.requires or []:
        if "extra ==" in req or "extra==" in req:
            continue
        if ";" in req and "python_version" not in req and "sys_platform" not in req and "platform" not in req:
            continue
        closure(re.split(r"[\s;<>=!~\[(]", req, 1)[0], seen)
    return seen


def size_mb(names: set) -> float:
    total = 0
    for name in names:
        for f in metadata.distribution(name).files or []:
            try:
                total += os.path.getsize(f.locate())
            except OSError:
                pass
    return total / 1e6


def weights(path: str) -> List[dict]:
    base = closure("dalistream")  # what every install has already (boto3 is a core dependency)
    base_without = set(base)
    rows = []
    for client, module in [("boto3", "boto3"), ("google-auth", "google.auth"), ("google-cloud-storage", "google.cloud.storage"),
                           ("azure-storage-blob", "azure.storage.blob"), ("azure-identity", "azure.identity"),
                           ("huggingface_hub", "huggingface_hub"), ("obstore", "obstore"), ("urllib3", "urllib3"),
                           ("requests", "requests")]:
        names = closure(client)
        if not names:
            continue
        env = dict(os.environ, PYTHONPATH=path) if path else None
        times = []
        for _ in range(3):
            done = subprocess.run([sys.executable, "-c", f"import time; t = time.perf_counter(); import {module}; "
                                   "print(time.perf_counter() - t)"], capture_output=True, text=True, env=env)
            times.append(float(done.stdout.strip() or "nan"))
        rows.append({"client": client, "packages": len(names), "installed_mb": round(size_mb(names), 1),
                     "beyond_core_mb": round(size_mb(names - base_without), 1), "import_s": round(statistics.median(times), 3)})
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--path", default="", help="a folder of alternative clients (pip install --target)")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if args.path:
        sys.path.append(args.path)  # after the environment's own packages
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, NAME), "wb") as f:
            f.write(os.urandom(SIZE))
        proc, stores = serve(folder)
        try:
            rows = measure(clients(stores), args.repeats)
        finally:
            proc.terminate()
            proc.wait()
    out = {"ranged_gets": rows, "weights": weights(args.path), "load": [load, os.getloadavg()[0]], "cpus": os.cpu_count()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"ranged GETs of {PART >> 20} MiB over a {SIZE >> 20} MiB object, one connection, medians of {args.repeats} "
          f"(load average {load:.1f} → {out['load'][1]:.1f}, {out['cpus']} CPUs)")
    print("| store | client | MB/s | CPU ms/MB |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['store']} | {r['client']} | {r['mb_per_s']:.0f} | {r['cpu_ms_per_mb']:.2f} |")
    print("| client | packages | installed MB | MB beyond dalistream's core | import s |\n|---|---|---|---|---|")
    for w in out["weights"]:
        print(f"| {w['client']} | {w['packages']} | {w['installed_mb']} | {w['beyond_core_mb']} | {w['import_s']} |")


if __name__ == "__main__":
    main()
