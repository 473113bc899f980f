"""The data-wait warning on a short run (fewer batches than a window: judged when the epoch's
iteration ends) and what it tells the user to change (the option that adds DALI threads)."""

import logging

import pytest

from dalistream.loader import progress
from dalistream.loader.progress import FEW, WINDOW, Watch


class Counters:
    """A rank's worker counters growing by ``per_batch`` of each as batches are made."""

    def __init__(self, **per_batch):
        self.per_batch, self.batches = per_batch, 0

    def __call__(self):
        fields = ("io_wait_s", "read_s", "batch_s", "wall_s")
        return {"workers": [{k: self.per_batch.get(k, 0.0) * self.batches for k in fields}]}


@pytest.fixture
def no_min_window(monkeypatch):
    monkeypatch.setattr(progress, "MIN_WINDOW_S", 0.0)


def run_epoch(watch, counters, batches, wait, step):
    """One epoch's iteration as the loader reports it: started, each batch taken and stepped, ended."""
    watch.started()
    watch.epoch(0, 1, 0, 0, batches)
    for i in range(batches):
        counters.batches += 1
        watch.took(wait, 8, i + 1)
        watch.stepped(step)
    watch.ended()


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if "waited for data" in r.getMessage()]


# idle workers with batches ready, and a graph that decodes: the decode stage
@pytest.mark.parametrize("batches", [FEW + 1, 12, 20, WINDOW - 1])
def test_a_run_shorter_than_a_window_is_warned_naming_the_threads_option(no_min_window, caplog, batches):
    counters = Counters(read_s=0.01, wall_s=0.1)
    watch = Watch(counters=counters, decodes=lambda: True)
    with caplog.at_level(logging.WARNING, logger="dalistream.loader.progress"):
        run_epoch(watch, counters, batches, wait=0.09, step=0.01)
    said = warnings(caplog)
    assert len(said) == 1, said
    assert "likely stage: decode" in said[0] and "num_threads" in said[0] and f"last {batches - 1} batches" in said[0]


@pytest.mark.parametrize("batches,wait,step", [(20, 0.01, 0.09), (FEW, 0.09, 0.01), (3, 0.09, 0.01)])
def test_a_short_run_is_not_warned_when_it_does_not_wait_or_is_too_short_to_judge(no_min_window, caplog, batches,
                                                                                    wait, step):
    counters = Counters(read_s=0.01, wall_s=0.1)
    watch = Watch(counters=counters, decodes=lambda: True)
    with caplog.at_level(logging.WARNING, logger="dalistream.loader.progress"):
        run_epoch(watch, counters, batches, wait, step)  # FEW batches: the first is the workers' start
    assert not warnings(caplog) and not watch.warned


def test_short_epochs_are_warned_once(no_min_window, caplog):
    counters = Counters(read_s=0.09, wall_s=0.1)  # busy workers: the tar/worker stage
    watch = Watch(counters=counters, decodes=lambda: False)
    with caplog.at_level(logging.WARNING, logger="dalistream.loader.progress"):
        for _ in range(5):
            run_epoch(watch, counters, 20, wait=0.09, step=0.01)
    said = warnings(caplog)
    assert len(said) == 1 and "likely stage: tar/worker" in said[0] and "workers=" in said[0]
