"""Real DALI pipelines (CPU): ownership, equal steps, exactly-once, epochs, resume, shutdown."""

import itertools
import os
import time

import pytest
import torch

import dalistream
from dalistream import Loader, Stream
from dalistream.loader.state import sealed
from dalistream.dali.pipeline import built
from dalistream.errors import ConfigError, StateError

from helpers import check_resume, key_shard_folder, shard_keys, uneven_sizes

pytestmark = [pytest.mark.dali]

B = 7  # divisible by none of W = 2, 3, 4
SIZES = uneven_sizes(13, seed=1, low=2, high=24)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return key_shard_folder(tmp_path_factory, "keys", SIZES)


def all_keys():
    return set(shard_keys(SIZES))


def open_stream(shards, rank, world, workers, **kw):
    kw.setdefault("seed", 11)
    return Stream.open(shards, fields={"key": "__key__", "label": "cls"}, batch_size=kw.pop("batch_size", B),
                       workers=workers, rank=rank, world_size=world, device="cpu", **kw)


def run_epochs(stream, epochs):
    with Loader(stream) as loader:
        out = []
        for _ in range(epochs):
            assert len(loader) == stream.steps(loader.epoch)
            out.append([batch["key"] for batch in loader])
        return out


@pytest.mark.parametrize("R,W", [p if p == (2, 3) else pytest.param(*p, marks=pytest.mark.slow)
                                 for p in itertools.product([1, 2, 3], [1, 2, 3, 4])])
def test_even_policy_matrix(shards, R, W):
    per_rank = [run_epochs(open_stream(shards, r, R, W, shuffle=5), 3) for r in range(R)]
    for epoch in range(3):
        batches = [per_rank[r][epoch] for r in range(R)]
        assert len({len(b) for b in batches}) == 1, "every rank yields the same number of batches"
        assert all(len(batch) == B for b in batches for batch in b), "only full batches"
        keys = [k for b in batches for batch in b for k in batch]
        assert len(keys) == len(set(keys)), "no sample twice in an epoch across ranks"
        assert set(keys) <= all_keys()
    orders = [[k for batch in per_rank[0][e] for k in batch] for e in range(3)]
    assert orders[0] != orders[1] != orders[2]


@pytest.mark.parametrize("R,W", [p if p == (2, 3) else pytest.param(*p, marks=pytest.mark.slow)
                                 for p in itertools.product([1, 2, 3], [1, 2, 3, 4])])
def test_exact_policy_matrix(shards, R, W):
    keys = []
    for r in range(R):
        (epoch,) = run_epochs(open_stream(shards, r, R, W, policy="exact", shuffle=3), 1)
        keys += [k for batch in epoch for k in batch]
    assert sorted(keys) == sorted(all_keys())


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["exact", "even"])
def test_forked_and_spawned_workers_deliver_the_same_batches(shards, policy):
    """CPU pipelines fork their workers by default; spawned ones (GPU, or CUDA already up) get the
    sources by pickling: both deliver the same batches, resumed mid-epoch too."""
    runs = {}
    for method in ("fork", "spawn"):
        stream = open_stream(shards, 1, 2, 2, shuffle=5, policy=policy, start_method=method)
        with Loader(stream) as loader:
            assert loader._pipe is None
            epochs = [[b["key"] for b in loader] for _ in range(2)]
            assert built(loader._pipe).start_method == method
            loader.load_state_dict(sealed({**loader.state_dict(), "loader": {"epoch": 0, "step": 2}}))
            resumed = [b["key"] for b in loader]
        runs[method] = epochs, resumed
    assert runs["fork"] == runs["spawn"]
    assert runs["fork"][1] == runs["fork"][0][0][2:]


@pytest.mark.slow
def test_same_seed_same_order_other_seed_other_order(shards):
    a = run_epochs(open_stream(shards, 0, 1, 2, shuffle=4), 1)
    b = run_epochs(open_stream(shards, 0, 1, 2, shuffle=4), 1)
    c = run_epochs(open_stream(shards, 0, 1, 2, shuffle=4, seed=12), 1)
    assert a == b and a != c


def test_set_epoch_matches_a_run_through(shards):
    through = run_epochs(open_stream(shards, 0, 1, 2, shuffle=4), 3)
    with Loader(open_stream(shards, 0, 1, 2, shuffle=4)) as loader:
        loader.set_epoch(2)
        assert [b["key"] for b in loader] == through[2]
        loader.set_epoch(0)
        assert [b["key"] for b in loader] == through[0]


def test_state_dict_save_load_compare(shards):
    stream = open_stream(shards, 1, 2, 3, shuffle=6, policy="exact")

    def run_from(k):
        with Loader(stream) as first:
            first.set_epoch(1)
            it = iter(first)
            for _ in range(k):
                next(it)
            state = first.state_dict()
        with Loader(stream) as second:
            second.load_state_dict(state)
            return [b["key"] for b in second]

    steps = stream.steps(1)
    check_resume(run_from, [1, steps - 1])


@pytest.mark.parametrize("interleave", [False, True])
def test_state_from_another_layout_continues_unless_refused(shards, interleave):
    with Loader(open_stream(shards, 0, 1, 2, interleave=interleave)) as a:
        state = a.state_dict()
    state["loader"]["step"] = 3
    state = sealed(state)  # (its digest again: an edited state is refused)
    with Loader(open_stream(shards, 0, 1, 3, interleave=interleave)) as b:
        with pytest.raises(StateError, match="layout"):
            b.load_state_dict(state, allow_layout_change=False)
        b.load_state_dict(state)
        if interleave:  # the plan splits the epoch over batch positions: other workers, the same plan
            assert (b.epoch, b.step, b.resume) == (0, 3, ())
            continue_at = b.stream.steps(0) - 3
        else:
            assert (b.epoch, b.step, b.resume) == (0, 0, ((1, 2, B, 3),))
            continue_at = b.stream.steps(0, b.resume)
            assert continue_at < b.stream.steps(0)
        assert len(b) == continue_at
    with Loader(open_stream(shards, 0, 2, 2, interleave=interleave)) as c:  # other ranks: a segment in both
        c.load_state_dict(state)
        planned = (B, 1, 1) if interleave else (1, 2, B)  # the saved layout's plan: 1 rank
        assert (c.epoch, c.step, c.resume) == (0, 0, (planned + (3,),))


def test_batches_are_torch_tensors_and_stats_count(shards):
    with Loader(open_stream(shards, 0, 1, 2)) as loader:
        batch = next(iter(loader))
        assert batch["label"].dtype == torch.int64 and batch["label"].shape == (B,)
        assert isinstance(batch["key"][0], str)
        list(loader)
        stats = loader.stats()
        assert len(stats["workers"]) == 2 and stats["samples"] >= B


@pytest.mark.slow
def test_stats_say_where_time_goes(shards):
    with Loader(open_stream(shards, 0, 1, 2)) as loader:
        n = 0
        for _ in loader:
            time.sleep(0.05)  # the training step
            n += 1
        stats = loader.stats(wait_s=10)
    loop = stats["loader"]
    assert loop["batches"] == n > 2
    assert loop["step_s"] >= 0.05 * n and loop["wait_s"] > 0
    for w in stats["workers"]:
        assert 0 <= w["io_wait_s"] <= w["read_s"] and w["batch_s"] > 0
        assert w["read_s"] + w["batch_s"] <= w["wall_s"]


def _children():
    me = os.getpid()
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.add(int(pid))
            except OSError:
                pass
    return out


def test_close_leaves_no_worker_processes(shards):
    before = _children()
    loader = Loader(open_stream(shards, 0, 1, 3))
    next(iter(loader))
    assert len(_children() - before) >= 3
    loader.close()
    assert _children() - before == set()


def test_configuration_errors_are_clear(shards):
    with pytest.raises(ConfigError, match="13 shards cannot be split over 4 ranks x 4 workers"):
        open_stream(shards, 0, 4, 4, policy="fixed", batches_per_epoch=2)  # whole shards: no counts
    assert open_stream(shards, 3, 4, 4).steps(0) >= 1  # with counts, 13 shards are cut among 16 workers
    with pytest.raises(ConfigError, match="smaller than workers"):
        open_stream(shards, 0, 1, 4, batch_size=3)


def test_rank_and_world_from_environment(shards):
    stream = Stream.open(shards, fields={"key": "__key__"}, batch_size=4, workers=1, device="cpu",
                         env={"RANK": "1", "WORLD_SIZE": "2"})
    assert (stream.config.rank, stream.config.world_size) == (1, 2)
    assert dalistream.Stream.open(shards, fields={"key": "__key__"}, batch_size=4, workers=1, device="cpu",
                                  env={}).config.world_size == 1


@pytest.mark.parametrize("env,expected", [
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, (5, 8, 1)),
    ({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, (2, 4, 0)),
    ({"SLURM_NTASKS": "1"}, (0, 1, None)),
])
def test_rank_world_and_gpu_from_slurm_when_torchrun_says_nothing(shards, env, expected):
    from dalistream.stream import local_device, resolve_layout

    assert (*resolve_layout(None, None, env), local_device(env)) == expected
    with pytest.raises(ConfigError, match="SLURM_PROCID"):
        resolve_layout(None, None, {"SLURM_PROCID": "x", "SLURM_NTASKS": "8"})


@pytest.mark.parametrize("dynamic", [True, False])
def test_batches_kept_by_the_user_are_never_overwritten(shards, dynamic):
    """Under DALI's dynamic executor (the default) a batch is DALI's own output memory, which DALI
    does not reuse while it is referenced; off it, a copy into buffers recycled once nothing refers
    to them (at most 3 per output)."""
    stream = open_stream(shards, 0, 1, 2, shuffle=5)
    with Loader(stream, exec_dynamic=dynamic) as loader:
        kept = [(batch["key"], batch["label"]) for batch in loader]
        reused = {batch["label"].data_ptr() for batch in loader}  # next epoch: buffers released each step
    for keys, labels in kept:
        expected = [(int(k[1:4]) * 1000 + int(k[5:])) % 7 for k in keys]
        assert labels.tolist() == expected
    if not dynamic:
        assert len(reused) <= 3


@pytest.mark.parametrize("workers", [1, 2])
def test_the_converter_is_imported_while_the_first_batch_is_computed(shards, tmp_path, workers):
    """DALI's torch helpers, which the loader turns outputs into tensors with, are imported (the
    first time, in a fresh process) while the loader waits for the first batch, not once it has
    come: the import (``nvidia.dali.plugin.pytorch``) happens within the wait for the batch
    (``watched_run``), before any output is converted (``to_torch``)."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "first.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, traceback
        stacks = []

        class Seen:
            def find_spec(self, name, path, target=None):
                if name == "nvidia.dali.plugin.pytorch":
                    stacks.append([frame.name for frame in traceback.extract_stack()])
                return None

        sys.meta_path.insert(0, Seen())
        import dalistream
        stream = dalistream.Stream.open({shards!r}, fields={{"key": "__key__"}}, batch_size=4, workers={workers},
                                        device="cpu", cache_dir={str(tmp_path / "cache")!r})
        with dalistream.Loader(stream) as loader:
            batch = next(iter(loader))
        assert len(batch["key"]) == 4
        print(len(stacks), "watched_run" in stacks[0], "to_torch" in stacks[0])
        """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "True", "False"]
