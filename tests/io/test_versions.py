"""The versions a process states (dalistream.io.versions): once per object per version_check_s
however many streams want it at once; stated ahead in parallel; a statement never trusted longer
than version_check_s from when it was asked (a replaced object is seen); a failed one not kept.
The "store" is a function that counts its calls and can be slowed, changed or broken."""

import threading
import time

import pytest

from dalistream.io import versions


class Store:
    def __init__(self, delay=0.0):
        self.version, self.delay, self.calls, self.broken = "v1", delay, [], False
        self.lock = threading.Lock()
        self.in_flight = self.peak = 0

    def state(self, key):
        def run():
            with self.lock:
                self.calls.append(key)
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            try:
                time.sleep(self.delay)
                if self.broken:
                    raise OSError("connection reset")
                return self.version, 100
            finally:
                with self.lock:
                    self.in_flight -= 1
        return run


@pytest.fixture(autouse=True)
def fresh_book():
    versions.forget()
    yield
    versions.forget()


def test_many_streams_at_once_state_an_object_once():
    store = Store(delay=0.2)
    got = []
    threads = [threading.Thread(target=lambda: got.append(versions.stated("a", 10, store.state("a"))))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [("v1", 100)] * 8 and store.calls == ["a"]


def test_a_statement_is_trusted_for_the_ttl_only_so_a_replaced_object_is_seen():
    store = Store()
    assert versions.stated("a", 0.3, store.state("a")) == ("v1", 100)
    store.version = "v2"  # the object is replaced
    assert versions.stated("a", 0.3, store.state("a")) == ("v1", 100)  # within the ttl: as stated
    time.sleep(0.35)
    assert versions.stated("a", 0.3, store.state("a")) == ("v2", 100)  # after it: stated again
    assert len(store.calls) == 2
    for _ in range(3):  # version_check_s=0: stated before every read
        versions.stated("a", 0, store.state("a"))
    assert len(store.calls) == 5


def test_objects_are_stated_ahead_in_parallel_and_streams_wait_for_that_statement_alone():
    store = Store(delay=0.3)
    keys = [f"k{i}" for i in range(12)]
    t0 = time.monotonic()
    versions.ahead([(k, store.state(k)) for k in keys], 10)
    got = [versions.stated(k, 10, store.state(k)) for k in keys]  # opened one after the other
    elapsed = time.monotonic() - t0
    assert got == [("v1", 100)] * 12 and sorted(store.calls) == sorted(keys)  # each once
    assert store.peak > 1  # in parallel: one after the other would take 12 x 0.3 s
    assert elapsed < 12 * 0.3
    versions.ahead([(k, store.state(k)) for k in keys], 10)  # fresh: nothing asked again
    assert len(store.calls) == 12


def test_a_statement_ahead_keeps_the_last_one_until_it_expires():
    store = Store()
    versions.stated("a", 0.6, store.state("a"))
    time.sleep(0.35)  # older than half the ttl: stated again ahead
    store.delay, store.version = 0.5, "v2"
    versions.ahead([("a", store.state("a"))], 0.6)
    t0 = time.monotonic()
    assert versions.stated("a", 0.6, store.state("a")) == ("v1", 100)  # still within its ttl: no wait
    assert time.monotonic() - t0 < 0.2
    time.sleep(0.3)  # the last statement expired: wait for the one ahead
    assert versions.stated("a", 0.6, store.state("a")) == ("v2", 100)
    assert len(store.calls) == 2


def test_a_failed_statement_is_not_kept():
    store = Store()
    store.broken = True
    with pytest.raises(OSError):
        versions.stated("a", 10, store.state("a"))
    versions.ahead([("b", store.state("b"))], 10)  # failing in the background: the stream meets it
    with pytest.raises(OSError):
        versions.stated("b", 10, store.state("b"))
    store.broken = False
    assert versions.stated("a", 10, store.state("a")) == ("v1", 100)
    assert versions.stated("b", 10, store.state("b")) == ("v1", 100)
