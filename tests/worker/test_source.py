import tempfile

import dill
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dalistream.config import StreamConfig
from dalistream.errors import ManifestError
from dalistream.worker import WorkerSource
from dalistream.worker.batch import rows

from helpers import check_resume, data_set, key_shards


def make(tmp_path, sizes, **kw):
    paths = key_shards(str(tmp_path), sizes)
    options = dict(sources=tuple(paths), fields={"key": "__key__", "label": "cls"}, batch_size=6, workers=2)
    options.update(kw)
    config = StreamConfig(**options)
    return config, paths, list(sizes)


def keys_of(batch, lo=0, hi=None):
    keys, labels, valid = batch
    if isinstance(keys, np.ndarray) and keys.dtype == np.uint8:  # transfer form (from iter()): the keys' blob
        keys = rows(keys, len(valid))
    return [bytes(k).decode() for k, v in zip(keys[lo:hi], valid[lo:hi]) if int(v)]


def test_padded_batch_layout_and_shared_dummies(tmp_path):
    config, paths, counts = make(tmp_path, [10, 10, 10, 10], batch_size=7, workers=3, rank=0, world_size=1)
    source = WorkerSource(config, data_set(paths, counts), 1)
    batch = next(source.epoch_batches(0))
    keys, labels, valid = batch
    assert len(keys) == len(labels) == len(valid) == 7
    assert [int(v) for v in valid] == [0, 0, 0, 1, 1, 0, 0]  # slots 3,2,2: worker 1 owns positions 3..4
    dummies = [k for i, k in enumerate(keys) if i not in (3, 4)]
    assert all(d is dummies[0] and d.size == 0 for d in dummies)  # one shared empty array
    assert labels[0].shape == () and labels[0].dtype == np.int64


def test_exact_covers_every_sample_once_and_pads(tmp_path):
    config, paths, counts = make(tmp_path, [3, 17, 8, 1, 9], policy="exact", shuffle=4)
    keys = []
    steps = set()
    for w in range(2):
        batches = list(WorkerSource(config, data_set(paths, counts), w).epoch_batches(0))
        steps.add(len(batches))
        lo = 0 if w == 0 else 3
        keys += [k for b in batches for k in keys_of(b, lo, lo + 3)]
    assert len(steps) == 1
    assert sorted(keys) == sorted(f"s{s:03d}/{i:05d}" for s, n in enumerate(counts) for i in range(n))


def test_even_yields_full_batches_and_counts_the_drop(tmp_path):
    config, paths, counts = make(tmp_path, [3, 17, 8, 1, 9])  # 38 samples, batch 6: 6 steps, 2 left out
    dropped = []
    for w, lo in ((0, 0), (1, 3)):
        source = WorkerSource(config, data_set(paths, counts), w)
        batches = list(source.epoch_batches(0))
        assert len(batches) == 6 and all(len(keys_of(b, lo, lo + 3)) == 3 for b in batches)
        dropped.append(source._stats.dropped)
    assert dropped == [0, 2]  # the job's last worker counts the tail no one owns


def test_epochs_via_iter_advance_and_differ(tmp_path):
    config, paths, counts = make(tmp_path, [5, 6, 7, 8], shuffle=3, policy="exact")
    source = WorkerSource(config, data_set(paths, counts), 0, start_epoch=4)
    epochs = []
    for _ in range(3):
        epochs.append([k for b in iter(source) for k in keys_of(b, 0, 3)])
    assert source.epoch == 6
    assert epochs[0] != epochs[1] != epochs[2]
    again = WorkerSource(config, data_set(paths, counts), 0, start_epoch=4)
    assert [k for b in iter(again) for k in keys_of(b, 0, 3)] == epochs[0]


def test_dali_probe_in_the_main_process_does_not_start_an_epoch(tmp_path):
    config, paths, counts = make(tmp_path, [5, 6])
    source = WorkerSource(config, data_set(paths, counts), 0).for_dali()
    iter(source)
    assert source._iters == 0
    copy = dill.loads(dill.dumps(source))  # what the spawned worker receives
    copy._probe_pid = -1                    # a different process
    iter(copy)
    assert copy._iters == 1 and copy.epoch == 0


def test_pickles_after_iteration_started(tmp_path):
    config, paths, counts = make(tmp_path, [5, 6])
    source = WorkerSource(config, data_set(paths, counts), 0)
    next(iter(source))
    restored = dill.loads(dill.dumps(source))
    assert restored._gen is None


def test_fixed_policy_cycles_over_own_shards(tmp_path):
    config, paths, counts = make(tmp_path, [2, 3], policy="fixed", batches_per_epoch=10)
    batches = list(WorkerSource(config, data_set(paths), 0).epoch_batches(0))
    assert len(batches) == 10
    keys = [k for b in batches for k in keys_of(b, 0, 3)]
    assert len(keys) == 30 and len(set(keys)) <= 3  # worker 0 owns one shard, read over and over


def test_stale_counts_are_an_error_not_a_desync(tmp_path):
    config, paths, counts = make(tmp_path, [4, 4])
    with pytest.raises(ManifestError, match="holds 4 samples but 40 were counted"):
        list(WorkerSource(config, data_set(paths, [40, 40]), 0).epoch_batches(0))


@pytest.mark.parametrize("shuffle", [0, 5])
@pytest.mark.parametrize("policy", ["even", "exact"])
def test_resume_at_step_k_equals_uninterrupted_run(tmp_path, shuffle, policy):
    config, paths, counts = make(tmp_path, [13, 4, 22, 9, 15, 6], shuffle=shuffle, policy=policy, seed=3)

    def run_from(k):
        source = WorkerSource(config, data_set(paths, counts), 1, start_epoch=2, start_step=k)
        return [keys_of(b) for b in iter(source)]

    steps = WorkerSource(config, data_set(paths, counts), 1).plans(2)[0].steps
    check_resume(run_from, [1, steps // 2, steps - 1, steps])


@pytest.mark.parametrize("policy", ["even", "exact", "fixed"])
def test_resume_at_step_k_equals_uninterrupted_run_interleaved(tmp_path, policy):
    extra = {"batches_per_epoch": 9, "manifest": str(tmp_path / "m.json")} if policy == "fixed" else {}
    config, paths, counts = make(tmp_path, [13, 4, 22, 9, 15, 6], policy=policy, seed=3, interleave=True, **extra)
    if policy == "fixed":  # interleaved 'fixed' needs counts: a manifest
        from dalistream.manifest import build_manifest, write_manifest

        write_manifest(build_manifest(paths), config.manifest)

    def run_from(k):
        source = WorkerSource(config, data_set(paths, counts), 1, start_epoch=2, start_step=k)
        return [keys_of(b) for b in iter(source)]

    plans = WorkerSource(config, data_set(paths, counts), 1).plans(2)
    assert len(plans) == 3 and all(p.slot == 1 for p in plans)  # one column per slot position
    check_resume(run_from, [1, plans[0].steps // 2, plans[0].steps - 1, plans[0].steps])


def test_resume_mid_shard_with_manifest_offsets_never_reads_the_consumed_part(tmp_path):
    from dalistream.manifest import build_manifest

    config, paths, counts = make(tmp_path, [30, 30], batch_size=2, workers=1, policy="exact")
    infos = build_manifest(paths, offsets=True)
    offsets = [i.offsets for i in infos]
    full = [keys_of(b) for b in WorkerSource(config, data_set(paths, counts, offsets), 0).epoch_batches(0)]
    first_shard = paths[WorkerSource(config, data_set(paths, counts), 0).plans(0)[0].shards[0]]
    with open(first_shard, "r+b") as f:  # destroy the first sample's header: only a seek gets past it
        f.write(b"\xff" * 512)
    k = 5  # 10 samples consumed: resume inside the first shard
    resumed = [keys_of(b) for b in WorkerSource(config, data_set(paths, counts, offsets), 0, start_step=k).epoch_batches(0, k)]
    assert resumed == full[k:]
    with pytest.raises(Exception, match="not a tar|checksum"):  # without offsets the reader meets the damage
        list(WorkerSource(config, data_set(paths, counts), 0, start_step=k).epoch_batches(0, k))


def test_io_wait_counts_the_time_before_a_stream_s_first_bytes(tmp_path):
    """A stream whose first chunk arrives late (a slow pipe, a remote's first byte) is I/O wait:
    it is spent opening the stream (the gzip check peeks at the first chunk), not in tar reads."""
    paths = key_shards(str(tmp_path), [3, 4])
    late = [f"pipe:sleep 0.4; cat {paths[0]}", f"pipe:sleep 0.4; gzip -c {paths[1]}"]
    config = StreamConfig(sources=tuple(late), fields={"key": "__key__"}, batch_size=1, workers=1, policy="exact",
                          shuffle_shards=False)
    source = WorkerSource(config, data_set(late, [3, 4]), 0)
    batches = list(source.epoch_batches(0))
    stats = source._stats.as_dict()
    assert len(batches) == 7 and stats["samples"] == 7
    assert stats["io_wait_s"] >= 0.8 and stats["read_s"] >= stats["io_wait_s"]


def test_profile_switch_writes_each_worker_s_profile_at_the_epoch_s_end(tmp_path, monkeypatch):
    import pstats

    config, paths, counts = make(tmp_path / "data", [5, 6])
    out = tmp_path / "profile"
    monkeypatch.setenv("DALISTREAM_PROFILE", str(out))
    source = WorkerSource(config, data_set(paths, counts), 1)
    monkeypatch.delenv("DALISTREAM_PROFILE")  # read when the source is made, not in the worker
    copy = dill.loads(dill.dumps(source))
    batches = list(iter(copy))
    assert len(batches) == 1  # 11 samples, batches of 6: one step
    functions = {name for _, _, name in pstats.Stats(str(out / "worker-0-1.pstats")).stats}
    assert {"pack", "epoch_batches"} <= functions
    assert not (out / "worker-0-0.pstats").exists()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 12), min_size=3, max_size=8), R=st.integers(1, 3), W=st.integers(1, 3),
       extra=st.integers(0, 5), policy=st.sampled_from(["even", "exact"]), epoch=st.integers(0, 3),
       data=st.data())
def test_interleaved_resume_at_any_step_on_any_layout(sizes, R, W, extra, policy, epoch, data):
    """Property: for any layout, a worker resumed at step k of an interleaved epoch yields the
    uninterrupted run's batches from step k on."""
    assume(sum(sizes) >= R * (W + extra))  # (Stream.open refuses a batch larger than the data)
    with tempfile.TemporaryDirectory() as d:
        paths = key_shards(d, sizes)
        config = StreamConfig(sources=tuple(paths), fields={"key": "__key__"}, batch_size=W + extra, workers=W,
                              world_size=R, policy=policy, seed=epoch, interleave=True)
        rank, w = data.draw(st.integers(0, R - 1)), data.draw(st.integers(0, W - 1))

        def run_from(k):
            source = WorkerSource(config.replace(rank=rank), data_set(paths, sizes), w, start_epoch=epoch, start_step=k)
            out = []
            for keys, valid in iter(source):  # the transfer form: the keys' blob, then valid (alone: not packed)
                out.append([bytes(k).decode() for k, v in zip(rows(keys, len(valid)), valid) if int(v)])
            return out

        full = run_from(0)
        assert full and sum(map(len, full)) > 0
        k = data.draw(st.integers(0, len(full)))
        assert run_from(k) == full[k:]
