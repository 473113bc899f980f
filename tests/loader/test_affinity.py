"""Node affinity through the real loader (DALI on the CPU): several ranks run one after the other
in this process, each told its rank and world size and, as torchrun or SLURM would, its node
(``LOCAL_WORLD_SIZE``/``GROUP_RANK``, ``SLURM_NTASKS_PER_NODE``/``SLURM_NODEID``). Every sample
once per epoch under ``exact``; each node reads only its own shards, the same every epoch; an
epoch saved on one node count goes on on another with every sample once; what cannot run is
refused by name before any worker starts."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from dalistream import Loader, Stream
from dalistream.errors import ConfigError
from dalistream.plan.affinity import cache_kept, node_owner

from helpers import key_shard_folder, shard_keys, uneven_sizes

pytestmark = [pytest.mark.dali]

SIZES = uneven_sizes(12, seed=8, low=4, high=26)
ALL = shard_keys(SIZES)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return key_shard_folder(tmp_path_factory, "affinity", SIZES)


def torchrun(rank, per_node):
    return {"LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(rank // per_node), "LOCAL_RANK": str(rank % per_node)}


def slurm(rank, per_node):
    return {"SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_NODEID": str(rank // per_node)}


def open_rank(folder, rank, world, per_node, *, launcher=torchrun, workers=2, batch=3, **kw):
    kw.setdefault("seed", 5)
    kw.setdefault("policy", "exact")
    return Stream.open(folder, fields={"key": "__key__", "url": "__url__"}, batch_size=batch, workers=workers,
                       rank=rank, world_size=world, device="cpu", cache_dir=kw.pop("cache_dir", folder),
                       affinity="node", env=launcher(rank, per_node), **kw)


def shard_of(url):
    return int(os.path.basename(url).split("-")[1].split(".")[0])


def run_ranks(folder, world, per_node, *, epochs=1, state=None, steps=None, **kw):
    """Every rank of a layout, one after the other (from rank 0's ``state``); ``steps`` batches
    each (None: ``epochs`` whole epochs). Returns ({(rank, epoch): [(key, shard), …]}, the batches
    each rank yielded, rank 0's state and stats after)."""
    got, batches, saved, stats = {}, [], None, None
    for rank in range(world):
        with Loader(open_rank(folder, rank, world, per_node, **kw)) as loader:
            if state is not None:
                loader.load_state_dict(state)
            n = 0
            for _ in range(epochs):
                epoch, length = loader.epoch, len(loader)
                for i, batch in enumerate(loader):
                    got.setdefault((rank, epoch), []).extend(zip(batch["key"], map(shard_of, batch["url"])))
                    n += 1
                    if steps is not None and i + 1 == steps:
                        break
                else:
                    assert i + 1 == length  # len() was what the epoch yielded
            batches.append(n)
            if rank == 0:
                saved, stats = loader.state_dict(), loader.stats()
    return got, batches, saved, stats


@pytest.mark.parametrize("interleave,shuffle", [(True, None), (False, 4)])
def test_every_sample_once_each_node_on_its_own_shards_every_epoch(shards, interleave, shuffle):
    world, per_node = 4, 2
    got, batches, _, stats = run_ranks(shards, world, per_node, epochs=2, interleave=interleave, shuffle=shuffle)
    assert len(set(batches)) == 1  # equal steps on every rank
    owner = node_owner(SIZES, world // per_node, 5)
    for epoch in range(2):
        keys = [k for rank in range(world) for k, _ in got[(rank, epoch)]]
        assert sorted(keys) == ALL  # every sample once
        for node in range(world // per_node):
            read = {s for rank in range(node * per_node, (node + 1) * per_node) for _, s in got[(rank, epoch)]}
            assert read == {s for s in range(len(SIZES)) if owner[s] == node}  # its own shards, all of them
    orders = [[k for k, _ in got[(0, e)]] for e in range(2)]
    assert orders[0] != orders[1]  # the same shards, shuffled anew
    assert stats["affinity"] == {"nodes": 2, "node": 0, "ranks_per_node": 2, "shards": int((owner == 0).sum()),
                                 "samples": int(np.asarray(SIZES)[owner == 0].sum()), "from_nodes": None,
                                 "cache_kept": None}


def test_slurm_nodes_and_even(shards):
    """Nodes from SLURM; even: no sample twice, fewer than a node's step plus a shard left out per node."""
    world, per_node, batch = 3, 1, 4
    got, batches, _, _ = run_ranks(shards, world, per_node, launcher=slurm, policy="even", batch=batch)
    keys = [k for rank in range(world) for k, _ in got[(rank, 0)]]
    assert len(keys) == len(set(keys)) and set(keys) <= set(ALL)
    assert len(set(batches)) == 1 and len(keys) == batches[0] * world * batch
    assert len(ALL) - len(keys) < world * (per_node * batch + max(SIZES))
    owner = node_owner(SIZES, world, 5)
    assert all(owner[s] == rank for rank in range(world) for _, s in got[(rank, 0)])


def test_each_node_reads_only_its_own_shards(shards, tmp_path):
    """Each node's ranks read from a copy of the data set from which, once the streams are open
    (listed and counted), every other node's shard is deleted: with affinity both epochs run
    through, every sample once; without it the first rank fails on a missing shard (so the copies
    do tell)."""
    world, per_node = 4, 2
    folders = [shutil.copytree(shards, tmp_path / f"node{n}", ignore=shutil.ignore_patterns("manifests", "members",
                                                                                           "offsets"))
               for n in range(2)]
    streams = [open_rank(str(folders[rank // per_node]), rank, world, per_node, cache_dir=str(tmp_path))
               for rank in range(world)]
    plain = Stream.open(str(folders[0]), fields={"key": "__key__"}, batch_size=3, workers=2, rank=0, world_size=world,
                        device="cpu", seed=5, policy="exact", cache_dir=str(tmp_path))
    owner = node_owner(SIZES, 2, 5)
    for s in range(len(SIZES)):
        os.remove(folders[1 - owner[s]] / f"s-{s:04d}.tar")
    keys = {0: [], 1: []}
    for stream in streams:
        with Loader(stream) as loader:
            for epoch in range(2):
                keys[epoch] += [k for batch in loader for k in batch["key"]]
    assert sorted(keys[0]) == sorted(keys[1]) == ALL
    with Loader(plain) as loader, pytest.raises(Exception, match="s-00"):
        for _ in loader:
            pass


@pytest.mark.parametrize("interleave,shuffle", [(True, None), (False, 3)])
def test_an_epoch_goes_on_on_another_node_count_with_every_sample_once(shards, interleave, shuffle):
    """2 nodes x 2 ranks for 2 steps, then 3 nodes x 1 rank for 2 steps, then 1 rank without
    affinity for the rest: every sample of the epoch once; the state records each segment's node
    count; the loader says how much of its node's cache the move keeps."""
    order = {"interleave": interleave, "shuffle": shuffle}
    a, _, state, _ = run_ranks(shards, 4, 2, steps=2, **order)
    assert state["plan"]["nodes"] == 2 and state["loader"]["step"] == 2 and state["segments"] == []
    b, _, state, stats = run_ranks(shards, 3, 1, state=state, steps=2, batch=4, workers=1, **order)
    assert state["segments"] == [[4, 2, 3, 2, 2, int(interleave)]] and state["plan"]["nodes"] == 3
    kept = cache_kept(SIZES, 2, 3, 5)
    assert stats["affinity"]["from_nodes"] == 2 and stats["affinity"]["cache_kept"] == kept[0]
    owner = node_owner(SIZES, 3, 5)
    assert all(owner[s] == rank for rank in range(3) for _, s in b[(rank, 0)])  # the new count's shards
    rest = []
    with Loader(Stream.open(shards, fields={"key": "__key__"}, batch_size=5, workers=2, rank=0, world_size=1,
                            device="cpu", seed=5, policy="exact", cache_dir=shards, **order)) as loader:
        loader.load_state_dict(state)
        assert loader.resume == ((4, 2, 3, 2, 2, int(interleave)), (3, 1, 4, 2, 3, int(interleave)))
        rest = [k for batch in loader for k in batch["key"]]
    keys = [k for part in (a, b) for ks in part.values() for k, _ in ks] + rest
    assert sorted(keys) == ALL


def test_the_same_node_count_goes_on_at_its_step(shards):
    _, _, state, _ = run_ranks(shards, 2, 1, steps=3)
    with Loader(open_rank(shards, 1, 2, 1)) as loader:
        loader.load_state_dict(state)
        assert (loader.step, loader.resume) == (3, ())
        assert loader.stats()["affinity"]["cache_kept"] is None
    with Loader(open_rank(shards, 0, 2, 2)) as loader:  # the same ranks on one node: another plan
        loader.load_state_dict(state)
        assert (loader.step, loader.resume) == (0, ((2, 2, 3, 3, 2, 0),))  # (exact: one span per worker)
        assert loader.stats()["affinity"]["from_nodes"] == 2


def test_fixed_with_a_manifest_runs_its_batches_each_node_on_its_shards(shards, tmp_path):
    from dalistream import cli

    manifest = str(tmp_path / "manifest.json")
    assert cli.main(["index", shards, "-o", manifest]) == 0
    owner = node_owner(SIZES, 2, 5)
    for rank in range(4):
        with Loader(open_rank(shards, rank, 4, 2, policy="fixed", batches_per_epoch=4, manifest=manifest)) as loader:
            batches = list(loader)
        assert len(batches) == 4 and all(len(b["key"]) == 3 for b in batches)
        assert {int(owner[shard_of(u)]) for b in batches for u in b["url"]} == {rank // 2}


def test_what_affinity_cannot_run_is_refused_by_name(shards, tmp_path):
    with pytest.raises(ConfigError, match="not supported for a mix"):
        Stream.open({"a": (shards, 1.0)}, fields={"key": "__key__"}, batch_size=2, device="cpu", affinity="node",
                    rank=0, world_size=1, env={}, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="needs per-shard sample counts"):
        open_rank(shards, 0, 2, 1, policy="fixed", batches_per_epoch=3, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="not whole nodes of 3"):  # uneven ranks per node
        open_rank(shards, 0, 4, 3)
    with pytest.raises(ConfigError, match="not whole nodes of 3 ranks"):
        open_rank(shards, 0, 4, 1, ranks_per_node=3)
    with pytest.raises(ConfigError, match="runs on node 1"):  # the launcher places ranks otherwise
        open_rank(shards, 0, 4, 2, launcher=lambda r, n: {"LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"})
    with pytest.raises(ConfigError, match="without affinity='node'"):
        Stream.open(shards, fields={"key": "__key__"}, batch_size=2, device="cpu", ranks_per_node=2, rank=0,
                    world_size=2, env={}, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="affinity must be one of"):
        Stream.open(shards, fields={"key": "__key__"}, batch_size=2, device="cpu", affinity="rack", env={},
                    cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="12 shards cannot give each of 16 nodes"):
        open_rank(shards, 0, 16, 1, batch=1, workers=1)
    with pytest.raises(ConfigError, match="smallest of 2 nodes holds"):
        open_rank(shards, 0, 2, 1, batch=120, workers=1, policy="even")


def test_without_a_launcher_every_rank_is_one_node(shards, caplog):
    stream = open_rank(shards, 1, 2, 1, launcher=lambda r, n: {})
    assert stream.config.ranks_per_node is None and stream.config.nodes.count == 1
    assert "taken as one node" in caplog.text
    with Loader(stream) as loader:  # one node: the plain plan
        assert len(loader) == -(-len(ALL) // 6)


def test_the_cli_reads_with_affinity(shards):
    keys, owner = [], node_owner(SIZES, 2, 5)
    for rank in range(2):
        env = {**os.environ, "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank)}
        proc = subprocess.run([sys.executable, "-m", "dalistream", "keys", shards, "--affinity", "node", "--rank",
                               str(rank), "--world-size", "2", "--policy", "exact", "--seed", "5", "-B", "4", "--json"],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        mine = [k for line in lines if "keys" in line for k in line["keys"]]
        assert {int(owner[int(k[1:4])]) for k in mine} == {rank}  # key s<shard>/<i>: its node's shards only
        assert lines[-1]["stats"]["affinity"]["node"] == rank
        keys += mine
    assert sorted(keys) == ALL
