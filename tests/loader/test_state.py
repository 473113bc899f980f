"""A garbled loader state is a StateError naming what is wrong, raised by load_state_dict itself:
never a KeyError/AttributeError, never a failure inside a DALI worker, never an epoch that
silently skips its rest. (No pipeline is built: a Loader builds nothing until iterated.)"""

import copy
import json

import pytest

from dalistream import Loader, Stream
from dalistream.errors import StateError
from dalistream.loader.state import sealed

from helpers import key_shards

pytestmark = [pytest.mark.dali]  # Loader imports DALI


@pytest.fixture(scope="module")
def loader(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("state"))
    key_shards(d, [9, 4, 11, 6])
    stream = Stream.open(d, fields={"key": "__key__"}, batch_size=4, workers=2, device="cpu", seed=3,
                         cache_dir=str(d))
    with Loader(stream) as loader:
        yield loader


def garble(state, path, value, seal=True):
    """``state`` with the value at ``path`` replaced (``KeyError``: removed), its digest computed
    again (``seal``), so that the checks after the digest's are what a test meets."""
    state = copy.deepcopy(state)
    *parents, last = path
    target = state
    for key in parents:
        target = target[key]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return sealed(state) if seal and isinstance(state, dict) else state


GARBLED = [  # (where, new value or KeyError for "removed", words in the error)
    (("loader",), KeyError, "'loader'"),
    (("plan",), KeyError, "'plan'"),
    (("version",), KeyError, "version"),
    (("version",), 99, "version 99"),
    (("loader",), [0, 3], "'loader'"),
    (("loader", "step"), KeyError, "step"),
    (("loader", "epoch"), KeyError, "epoch"),
    (("loader", "step"), -1, "step"),
    (("loader", "epoch"), -2, "epoch"),
    (("loader", "step"), "3", "step"),
    (("loader", "step"), 1.5, "step"),
    (("loader", "epoch"), None, "epoch"),
    (("loader", "step"), True, "step"),
    (("plan", "seed"), KeyError, "seed"),
    (("plan", "sources"), KeyError, "sources"),
    (("plan", "batch_size"), "4", "batch_size"),
    (("plan", "nodes"), KeyError, "nodes"),
    (("plan", "nodes"), "2", "nodes"),
    (("plan", "nodes"), 3, "nodes"),
]


@pytest.mark.parametrize("path,value,words", GARBLED, ids=[f"{'.'.join(p)}={v!r}" for p, v, _ in GARBLED])
def test_garbled_states_are_state_errors_naming_the_problem(loader, path, value, words):
    before = (loader.epoch, loader.step)
    with pytest.raises(StateError) as info:
        loader.load_state_dict(garble(loader.state_dict(), path, value))
    assert words in str(info.value)
    assert (loader.epoch, loader.step) == before  # nothing half-loaded


@pytest.mark.parametrize("state", [None, [], "state", json.dumps({"version": 1})])
def test_what_is_not_a_state_at_all(loader, state):
    with pytest.raises(StateError, match="dict"):
        loader.load_state_dict(state)


def test_a_step_past_the_end_of_its_epoch(loader):
    for epoch in (0, 5):
        steps = loader.stream.steps(epoch)
        at_end = garble(garble(loader.state_dict(), ("loader", "epoch"), epoch), ("loader", "step"), steps)
        loader.load_state_dict(at_end)  # a finished epoch: fine, iteration goes on with the next
        assert (loader.epoch, loader.step) == (epoch, steps)
        with pytest.raises(StateError, match=f"past the end of epoch {epoch}, which has {steps} steps"):
            loader.load_state_dict(garble(at_end, ("loader", "step"), steps + 1))
    loader.load_state_dict(garble(loader.state_dict(), ("loader", "step"), 0))


def test_a_json_round_trip_loads(loader):
    state = garble(loader.state_dict(), ("loader", "step"), 1)
    loader.load_state_dict(json.loads(json.dumps(state)))
    assert loader.step == 1
    loader.load_state_dict(garble(state, ("loader", "step"), 0))


def test_a_version_2_state_loads_on_its_layout_and_names_moved_shards(loader):
    state = loader.state_dict()
    state.update(version=2)
    del state["digest"]
    del state["segments"]
    del state["plan"]["shuffle_shards"]
    state["plan"]["sources"] = loader.stream.digest  # version 2: a digest of the URLs
    state["loader"] = {"epoch": 0, "step": 1}
    loader.load_state_dict(state)
    assert (loader.epoch, loader.step, loader.resume) == (0, 1, ())
    state["plan"]["sources"] = "0" * 16
    with pytest.raises(StateError, match="shard URLs differ"):
        loader.load_state_dict(state)


@pytest.mark.parametrize("segments", [[[1, 2]], "1,2,4,3", [[1, 2, 4, 99]], [[4, 1, 2, 1, 3, 1]], [[2, 1, 2, 1, 2, 2]],
                                      [[2, 1, 2, 1, 2]]])
def test_bad_segments_are_refused_by_name(loader, segments):
    state = loader.state_dict()
    state["segments"] = segments
    state = sealed(state)
    with pytest.raises(StateError, match="segment"):
        loader.load_state_dict(state)


def test_shard_names_in_a_state_are_relative_and_without_query_strings():
    """The same shards in another folder, in a bucket, or behind freshly signed URLs have one identity."""
    from dalistream.stream import relative_names

    names = ("a/s-0.tar", "b/s-1.tar")
    assert relative_names(["/data/train/a/s-0.tar", "/data/train/b/s-1.tar"]) == names
    assert relative_names(["s3://bucket/ds/a/s-0.tar", "s3://bucket/ds/b/s-1.tar"]) == names
    assert relative_names(["https://h/ds/a/s-0.tar?X-Amz-Signature=1&Expires=2",
                           "https://h/ds/b/s-1.tar?X-Amz-Signature=3&Expires=4"]) == names
