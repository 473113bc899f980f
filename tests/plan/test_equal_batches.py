"""Equal batches on every rank under ``exact``, as pure plan checks over an exhaustive small grid
(R 1–4, W 1–3, B W–16, N 1–80, spans and interleaved columns), fresh, resumed at a step and after
an elastic resume: every rank runs the same number of steps, every step but the last is full, and
the last step's ``k`` samples reach ``min(k, R)`` ranks (a rank's last batch is only padding only
when fewer samples than ranks are left for it: the loader then yields it empty)."""

import itertools

import numpy as np
import pytest

from dalistream.plan import Layout, Schedule, epoch_layout, steps_per_epoch
from dalistream.plan.affinity import AffinePlan

EXACT = Schedule(3, "exact")
LAYOUTS = [Layout(R, W, B) for R in range(1, 5) for W in range(1, 4) for B in range(W, 17)]


def counts_of(n: int, rng) -> np.ndarray:
    """``n`` samples over 1–6 shards, some of them empty."""
    shards = int(rng.integers(1, 7))
    cuts = np.sort(rng.integers(0, n + 1, shards - 1))
    return np.diff(np.concatenate([[0], cuts, [n]])).astype(np.int64)


def per_step(sizes: np.ndarray, layout: Layout, steps: int, columns: bool) -> np.ndarray:
    """Real samples in each rank's batch at each step: ``(R, steps)``. A worker (or column) that
    owns ``n`` samples delivers ``min(slot, what is left)`` at each step, as the worker does."""
    t = np.arange(steps, dtype=np.int64)
    if columns:  # column q = position·R + rank: one sample per step
        have = (sizes[:, None] > t[None, :]).astype(np.int64)  # (R·B, steps)
        return have.reshape(layout.batch_size, layout.world_size, steps).sum(axis=0)
    slots = np.tile(np.asarray(layout.slots, dtype=np.int64), layout.world_size)
    got = np.clip(sizes[:, None] - t[None, :] * slots[:, None], 0, slots[:, None])
    return got.reshape(layout.world_size, layout.workers, steps).sum(axis=1)


def check(real: np.ndarray, layout: Layout, steps: int, total: int, where: str) -> None:
    R, B = layout.world_size, layout.batch_size
    assert real.shape == (R, steps), where
    assert int(real.sum()) == total, f"{where}: {int(real.sum())} samples delivered of {total}"
    if steps == 0:
        return
    assert (real[:, :-1] == B).all(), f"{where}: a batch before the last is not full: {real.tolist()}"
    k = total - (steps - 1) * R * B
    reached = int((real[:, -1] > 0).sum())
    assert reached == min(k, R), (f"{where}: the last step's {k} samples reach {reached} of {R} ranks "
                                  f"(a rank's batch only padding where it could hold a sample): {real[:, -1].tolist()}")


def columns_sizes(counts, layout: Layout, schedule: Schedule, epoch: int) -> np.ndarray:
    return np.diff(epoch_layout(counts, layout.column_layout, schedule, epoch).bounds)


@pytest.mark.slow
@pytest.mark.parametrize("columns", [False, True], ids=["spans", "interleaved"])
def test_every_rank_runs_the_same_steps_and_no_batch_is_only_padding_where_a_sample_could_be(columns):
    rng = np.random.default_rng(0)
    for layout, n in itertools.product(LAYOUTS, range(1, 81)):
        counts = counts_of(n, rng)
        planned = layout.planned(columns)
        steps = {steps_per_epoch(counts, planned, EXACT, 1, r) for r in range(layout.world_size)}
        assert steps == {-(-n // (layout.world_size * layout.batch_size))}
        (s,) = steps
        plan = epoch_layout(counts, planned, EXACT, 1)
        assert plan.steps == s
        check(per_step(np.diff(plan.bounds), layout, s, columns), layout, s, n, f"{layout}, N={n}")
        # resumed at a random step on the same layout: the rest of the same batches
        step = int(rng.integers(0, s + 1))
        assert AffinePlan(counts, planned, None, EXACT, 1, columns=False).steps - step == s - step


@pytest.mark.slow
@pytest.mark.parametrize("columns", [False, True], ids=["spans", "interleaved"])
def test_after_an_elastic_resume_too(columns):
    rng = np.random.default_rng(1)
    for layout, n in itertools.product(LAYOUTS, range(1, 81, 3)):
        counts = counts_of(n, rng)
        was = LAYOUTS[int(rng.integers(len(LAYOUTS)))]
        ran = int(rng.integers(0, steps_per_epoch(counts, was.planned(columns), EXACT, 0, 0) + 1))
        past = was.planned(columns)
        segments = [(past.world_size, past.workers, past.batch_size, ran)] if ran else []
        shuffle = int(rng.choice([0, 0, 5]))
        plan = AffinePlan(counts, layout.planned(columns), None, EXACT, 0, columns=False, shuffle=shuffle, segments=segments)
        left = plan.sequence.total
        if columns:
            sizes = np.array([plan.plans(q, 0)[0].samples for q in range(layout.world_size * layout.batch_size)])
        else:
            sizes = np.array([plan.plans(r, w)[0].samples for r in range(layout.world_size) for w in range(layout.workers)])
        check(per_step(sizes, layout, plan.steps, columns), layout, plan.steps, left,
              f"{was} ran {ran} steps, then {layout}, N={n}")


def test_the_issue_cases():
    """(R, W, B, N) where ``0 < N mod (R·B) < R``: the last step cannot reach every rank."""
    for R, W, B, N in [(2, 1, 16, 33), (2, 1, 16, 1025), (2, 1, 8, 17), (2, 2, 4, 9), (3, 2, 4, 13), (3, 3, 8, 26)]:
        layout = Layout(R, W, B)
        for columns in (False, True):
            plan = epoch_layout([N], layout.planned(columns), EXACT, 0)
            real = per_step(np.diff(plan.bounds), layout, plan.steps, columns)
            check(real, layout, plan.steps, N, f"{layout}, N={N}")
            k = N % (R * B)
            assert (real[:k, -1] > 0).all() and (real[k:, -1] == 0).all()  # ranks 0 … k-1 get the last samples
