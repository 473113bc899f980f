"""Through the real loader (DALI, CPU): under ``exact`` every rank yields exactly ``len()`` batches
in every epoch, fresh, after a resume and after an elastic resume, for the layouts where
``0 < N mod (R·B) < R`` (the last step cannot reach every rank: those ranks yield an empty
batch) and their neighbours; every sample is delivered once over all ranks."""

import pytest

from dalistream import Loader, Stream
from dalistream.loader.state import sealed

from helpers import key_shards, shard_keys

pytestmark = [pytest.mark.dali]

ISSUE = [(2, 1, 16, 33), (2, 1, 16, 1025), (2, 1, 8, 17), (2, 2, 4, 9), (3, 2, 4, 13), (3, 3, 8, 26)]
NEIGHBOURS = [(2, 1, 16, 34), (2, 2, 4, 10), (3, 2, 4, 14), (3, 3, 8, 27), (4, 1, 2, 9), (4, 2, 3, 5), (2, 1, 1, 1),
              (3, 1, 1, 2)]


def sizes_of(n):
    """``n`` samples in up to 3 uneven shards."""
    return [size for size in (n // 3, n // 2, n - n // 3 - n // 2) if size]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}

    def folder(n):
        if n not in made:
            made[n] = (str(tmp_path_factory.mktemp(f"n{n}")), sizes_of(n))
            key_shards(made[n][0], made[n][1])
        return made[n]
    return folder


def open_rank(folder, R, rank, W, B, interleave=False):
    stream = Stream.open(folder, fields={"key": "__key__"}, batch_size=B, workers=W, rank=rank, world_size=R,
                         device="cpu", policy="exact", interleave=interleave, seed=1, cache_dir=folder)
    return Loader(stream)


def epoch_keys(loader):
    """The batches of one iteration (keys), checking the number against len() first."""
    expected = len(loader)
    batches = [list(b["key"]) for b in loader]
    assert len(batches) == expected, f"{len(batches)} batches yielded, len() said {expected}"
    return batches


def check_epoch(per_rank, keys, R, B, where):
    steps = {len(b) for b in per_rank}
    assert len(steps) == 1, f"{where}: ranks yielded {[len(b) for b in per_rank]} batches"
    flat = [k for batches in per_rank for batch in batches for k in batch]
    assert sorted(flat) == keys, f"{where}: not every sample once"
    (s,) = steps
    last = len(keys) - (s - 1) * R * B
    for r, batches in enumerate(per_rank):
        assert all(len(b) == B for b in batches[:-1]), where
        assert (len(batches[-1]) == 0) == (r >= last), f"{where}: rank {r}'s last batch: {batches[-1]}"


def run_case(folders, R, W, B, N, interleave=False, epochs=2):
    folder, sizes = folders(N)
    keys = shard_keys(sizes)
    loaders = [open_rank(folder, R, r, W, B, interleave) for r in range(R)]
    try:
        for epoch in range(epochs):
            per_rank = []
            for loader in loaders:
                loader.set_epoch(epoch)
                per_rank.append(epoch_keys(loader))
            check_epoch(per_rank, keys, R, B, f"R={R} W={W} B={B} N={N} epoch {epoch}")
    finally:
        for loader in loaders:
            loader.close()


@pytest.mark.parametrize("R,W,B,N", ISSUE[:2])
def test_the_issue_cases(folders, R, W, B, N):
    run_case(folders, R, W, B, N)


@pytest.mark.slow
@pytest.mark.parametrize("R,W,B,N", ISSUE[2:] + NEIGHBOURS)
def test_the_issue_cases_and_their_neighbours(folders, R, W, B, N):
    run_case(folders, R, W, B, N, epochs=1)


@pytest.mark.slow
@pytest.mark.parametrize("R,W,B,N", [(2, 2, 2, 6), (3, 1, 2, 8), (2, 1, 16, 33)])
def test_interleaved_columns_too(folders, R, W, B, N):
    """Read interleaved, the last step's samples go to columns 0 … k-1: ranks first."""
    run_case(folders, R, W, B, N, interleave=True, epochs=1)


@pytest.mark.parametrize("R,W,B,N,step", [(2, 2, 4, 9, 1), (3, 3, 8, 26, 1), (2, 1, 8, 17, 1), (2, 1, 16, 1025, 20)])
def test_after_a_resume_on_the_same_layout(folders, R, W, B, N, step):
    folder, sizes = folders(N)
    with open_rank(folder, R, 0, W, B) as loader:
        state = loader.state_dict()
    state = sealed({**state, "loader": {"epoch": 0, "step": step}})
    per_rank = []
    for r in range(R):
        with open_rank(folder, R, r, W, B) as loader:
            loader.load_state_dict(state)
            per_rank.append(epoch_keys(loader))
            assert loader.epoch == 1 and len(loader) == loader.stream.steps(1)
    steps = {len(b) for b in per_rank}
    assert steps == {-(-N // (R * B)) - step}
    last = N - (-(-N // (R * B)) - 1) * R * B
    assert [len(b[-1]) == 0 for b in per_rank] == [r >= last for r in range(R)]


@pytest.mark.slow
@pytest.mark.parametrize("was,now,N,ran", [((2, 1, 4), (3, 2, 4), 26, 2), ((3, 2, 4), (2, 1, 8), 13, 1),
                                           ((2, 2, 4), (3, 3, 3), 20, 1)])
def test_after_an_elastic_resume(folders, was, now, N, ran):
    """A state of one layout, resumed on another: every rank of the new one yields len() batches,
    and the two runs together deliver every sample once."""
    folder, sizes = folders(N)
    R0, W0, B0 = was
    first = []
    for r in range(R0):
        with open_rank(folder, R0, r, W0, B0) as loader:
            it = iter(loader)
            first += [k for _, batch in zip(range(ran), it) for k in batch["key"]]
            if r == 0:
                state = loader.state_dict()
    R, W, B = now
    per_rank = []
    for r in range(R):
        with open_rank(folder, R, r, W, B) as loader:
            loader.load_state_dict(state)
            per_rank.append(epoch_keys(loader))
    assert len({len(b) for b in per_rank}) == 1, [len(b) for b in per_rank]
    rest = [k for batches in per_rank for batch in batches for k in batch]
    assert sorted(first + rest) == shard_keys(folders(N)[1])
    assert all(len(b) == B for batches in per_rank for b in batches[:-1])
