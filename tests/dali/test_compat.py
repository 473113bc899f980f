"""One test per shim of ``dalistream.dali.compat``: each use of DALI's or torch's internals still
does what dalistream relies on, against the installed versions."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from dalistream.dali import compat


def test_versions_are_the_tested_ones_and_a_mismatch_warns(monkeypatch):
    import nvidia.dali

    assert nvidia.dali.__version__.startswith(compat.DALI_TESTED)
    monkeypatch.setattr(compat, "_checked", [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.check_versions()                    # the installed versions: silent
    monkeypatch.setattr(compat, "_checked", [])
    monkeypatch.setattr(nvidia.dali, "__version__", "9.9.0")
    with pytest.warns(RuntimeWarning, match="tested with DALI 2.4"):
        compat.check_versions()
    compat.check_versions()                        # once per process


def test_do_not_convert_marks_as_dali_does():
    from nvidia.dali._conditionals import _autograph

    def f():
        return 1

    assert not _autograph.is_autograph_artifact(f)
    assert _autograph.is_autograph_artifact(compat.do_not_convert(f))


def _two_branch_pipeline(select):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=4, num_threads=1, device_id=None, enable_conditionals=True)
    def pipe():
        flag = fn.external_source(source=lambda: [np.array(i % 2, np.int32) for i in range(4)], batch=True,
                                  dtype=types.INT32)
        return select(flag)

    return pipe()


def test_converted_turns_an_if_on_data_into_a_dali_conditional():
    from nvidia.dali import fn, types

    @compat.converted
    def pick(flag):
        out = fn.constant(idata=[7], dtype=types.INT32)
        if flag == 1:
            out = fn.constant(idata=[9], dtype=types.INT32)
        return out

    @compat.do_not_convert  # called from unconverted code: the shim converts `pick` on its own
    def select(flag):
        return pick(flag)

    p = _two_branch_pipeline(select)
    p.build()
    (out,) = p.run()
    assert [int(np.array(out.at(i))[0]) for i in range(4)] == [7, 9, 7, 9]


def _parallel_pipeline():
    from nvidia.dali import fn, pipeline_def

    class Source:
        def __iter__(self):
            return self

        def __next__(self):
            return [np.zeros(1, np.uint8)] * 2

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=2, py_start_method="fork")
    def pipe():  # one stateful source per worker, as dalistream's
        return tuple(fn.external_source(source=Source(), batch=True, parallel=True, cycle="quiet") for _ in range(2))

    return pipe()


def test_worker_processes_shutdown_and_observer():
    p = _parallel_pipeline()
    assert compat.worker_processes(p) == []        # before build: no pool
    p.build()
    p.run()
    processes = compat.worker_processes(p)
    assert len(processes) == 2 and all(proc.is_alive() for proc in processes)
    observer = p._py_pool.pool._observer           # what forget_observer reaches into
    assert observer is not None and observer.thread is not None
    compat.shutdown(p)
    for proc in processes:
        proc.join(5)
    assert all(proc.exitcode is not None for proc in processes)
    compat.forget_observer(p)                      # as the watchdog calls it, after a shutdown
    assert observer.thread is None


def test_cuda_queries_answer_without_a_gpu():
    from dalistream.dali import device

    count = device.gpu_count()
    assert isinstance(count, int) and count >= 0
    assert compat.cuda_driver_state() in (None, False, True)
    assert isinstance(compat.cuda_initialized(), bool)
    if count == 0:
        assert compat.cuda_initialized() is False   # so CPU pipelines may fork


def test_torch_utils_feed_a_tensor():
    from nvidia.dali.backend import TensorCPU

    utils = compat.torch_utils()
    source = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = torch.empty(2, 3, dtype=utils.to_torch_type[TensorCPU(source).dtype])
    utils.feed_ndarray(TensorCPU(source), out)
    assert out.tolist() == source.tolist()
    tensor = TensorCPU(source)
    shared = utils.to_torch_tensor(tensor, copy=False)  # DLPack: the CPU tensor's own memory
    assert shared.data_ptr() == tensor.data_ptr() and shared.tolist() == source.tolist()


def test_only_reference_sees_every_kind_of_holder():
    pool = [torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3)]
    kept = pool[1]                 # another Python reference
    view = pool[2][1:]             # a view shares the storage
    array = pool[3].numpy()        # so does a NumPy array
    found = [compat.only_reference(t) for t in pool]
    assert found == [True, False, False, False]
    del kept, view, array
    assert [compat.only_reference(t) for t in pool] == [True, True, True, True]


def test_main_hidden_from_spawn_restores_the_main_module(tmp_path):
    script = (
        "import sys\n"
        "from dalistream.dali.compat import main_hidden_from_spawn\n"
        "main = sys.modules['__main__']\n"
        "before = (main.__spec__, main.__file__)\n"
        "with main_hidden_from_spawn():\n"
        "    assert main.__spec__ is None and not hasattr(main, '__file__')\n"
        "assert (main.__spec__, main.__file__) == before\n"
        "with main_hidden_from_spawn(False):\n"
        "    assert main.__file__ == before[1]\n"
        "print('ok')\n"
    )
    path = tmp_path / "main.py"   # a script file: its __main__ has a __file__, as a user's has
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_upstream_follows_op_inputs_and_argument_inputs():
    from nvidia.dali import fn, pipeline_def, types

    found = {}

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def graph():
        a, b, c = fn.external_source(source=lambda: ([np.zeros(1, np.uint8)],) * 3, num_outputs=3, batch=False)
        angle = fn.cast(b, dtype=types.FLOAT)                # reaches the output only as an argument input
        out = fn.rotate(fn.reshape(a, shape=[1, 1, 1]), angle=angle, fill_value=0)
        unrelated = c + 1
        found.update(up=compat.upstream([out]), nodes=(a, b, c, angle, out, unrelated))
        return out

    graph()
    a, b, c, angle, out, unrelated = found["nodes"]
    assert {id(a), id(b), id(angle), id(out)} <= found["up"]
    assert id(c) not in found["up"] and id(unrelated) not in found["up"]
    assert compat.upstream([]) == set()


class _Shipping:
    """A parallel source shipping rows of 2, 0 and 5 bytes as one blob (``blob``, with their
    lengths: dalistream's transfer form) or as they are, then ``valid``."""

    def __init__(self, blob):
        self.blob = blob

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        from dalistream.worker.batch import pack

        self.i += 1
        if self.i > 3:
            raise StopIteration
        plain = ([np.full(n, self.i, np.uint8) for n in (2, 0, 5)], np.ones(3, np.uint8))
        return pack(plain, _bytes_only(), (0,), 0, 3) if self.blob else plain


def _bytes_only():
    """The transfer form of a stream of one byte field: its blob, then ``valid``."""
    from dalistream.config import StreamConfig
    from dalistream.worker.batch import transfer

    return transfer(StreamConfig(sources=("x",), fields={"data": "bin"}, batch_size=3).fields)


def test_on_receive_rewrites_only_its_own_source_and_tensor_list_keeps_the_rows():
    from nvidia.dali import fn, pipeline_def

    from dalistream.worker.batch import pack, row_bounds

    calls = []
    placeholder = compat.empty_rows(3)

    def receive(outputs):
        calls.append(type(outputs[0]).__name__)
        outputs[0] = compat.tensor_list(placeholder, *row_bounds(outputs[0], 3))
        return outputs

    @pipeline_def(batch_size=3, num_threads=1, device_id=None, py_num_workers=2, py_start_method="fork")
    def graph():
        blob_source, plain_source = _Shipping(True), _Shipping(False)
        compat.on_receive(blob_source, receive)
        compat.on_receive(blob_source, receive)  # the hook is installed once, a source registered again
        assert compat.receivable()
        a, va = fn.external_source(blob_source, num_outputs=2, batch=True, parallel=True, cycle="raise")
        b, vb = fn.external_source(plain_source, num_outputs=2, batch=True, parallel=True, cycle="raise")
        return a, b, va, vb

    pipe = graph()
    pipe.build()
    try:
        for i in (1, 2, 3):
            a, b, _, _ = pipe.run()
            for out in (a, b):
                assert [np.asarray(out[k]).tolist() for k in range(3)] == [[i, i], [], [i] * 5]
    finally:
        compat.shutdown(pipe)
    assert calls and set(calls) == {"ndarray"}  # only the registered source's batches, as shipped

    for lengths in ([3, 0, 4], [0, 0, 0], [0, 5, 0], [2, 2, 2]):
        rows = [np.arange(sum(lengths[:k]), sum(lengths[:k + 1]), dtype=np.uint8) for k in range(3)]
        blob = pack((rows, np.ones(3, np.uint8)), _bytes_only(), (0,), 0, 3)[0]
        tl = compat.tensor_list(placeholder, *row_bounds(blob, 3))
        assert [np.asarray(tl[k]).tolist() for k in range(3)] == [r.tolist() for r in rows]
        for k in range(3):  # the rows themselves, no copy; an empty row the placeholder's
            if lengths[k]:
                assert tl[k].data_ptr() == blob.__array_interface__["data"][0] + 12 + sum(lengths[:k])
        assert all(t is compat.empty_rows(1)[0] for t in placeholder)  # left untouched


def test_on_receive_refuses_a_dali_without_the_names_it_hooks(monkeypatch):
    monkeypatch.setattr(compat, "receivable", lambda: False)
    with pytest.raises(RuntimeError, match="schedule_and_receive"):
        compat.on_receive(_Shipping(True), lambda outputs: outputs)


# -- the consumer's CUDA stream in run(stream) ----------------------------------------------------

class FakeStream:
    """What torch.cuda.current_stream returns, as DALI reads it (``cuda_stream``: the handle)."""

    def __init__(self, device: int, handle: int) -> None:
        self.device, self.cuda_stream = device, handle


def fake_cuda_context(monkeypatch) -> dict:
    """torch.cuda's current device and streams on this CPU-only torch: ``current_stream(d)`` is a
    stream of device d, ``torch.cuda.device(d)`` makes d current for the block."""
    import contextlib

    state = {"current": 0, "asked": []}

    def current_stream(device=None):
        state["asked"].append(device)
        return FakeStream(device, 0x5000 + int(device))

    @contextlib.contextmanager
    def device(index):
        before, state["current"] = state["current"], int(index)
        try:
            yield
        finally:
            state["current"] = before

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "device", device)
    return state


class GpuPipeStandIn:
    """A stand-in for a built GPU pipeline on DALI's dynamic executor: ``run`` records what it was
    given, the current CUDA device meanwhile and the thread it ran on; ``_py_pool`` lists one live
    worker process, as a pipeline with parallel sources has, so ``watched_run`` uses its thread."""

    def __init__(self, state: dict, device_id: int = 1, dynamic: bool = True, workers: bool = True) -> None:
        import types

        self.device_id, self.exec_dynamic, self.state, self.calls = device_id, dynamic, state, []
        live = types.SimpleNamespace(exitcode=None, pid=0)
        self._py_pool = types.SimpleNamespace(pool=types.SimpleNamespace(_processes=[live] if workers else []))

    def run(self, *args):
        import threading

        self.calls.append((args, self.state["current"], threading.current_thread().name))
        return ("outputs",)


def test_consumer_stream_is_torch_current_stream_of_the_pipeline_gpu(monkeypatch):
    from nvidia.dali import types

    state = fake_cuda_context(monkeypatch)
    stream = compat.consumer_stream(GpuPipeStandIn(state, device_id=1))
    assert state["asked"] == [1] and stream.device == 1
    assert types._raw_cuda_stream_ptr(stream).value == 0x5001  # the handle DALI's run(stream) takes
    assert compat.consumer_stream(GpuPipeStandIn(state, dynamic=False)) is None  # DALI 2.4: dynamic executor only
    assert state["asked"] == [1]


def test_a_cpu_pipeline_gets_no_stream_and_runs_as_before():
    """Without a GPU nothing changes: no stream, ``pipe.run()`` host-synchronous, torch's CUDA untouched."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, exec_dynamic=True)
    def graph():
        return fn.random.uniform(range=[0.0, 1.0], shape=[3])

    pipe = graph()
    pipe.build()
    assert compat.exec_dynamic(pipe) and compat.consumer_stream(pipe) is None
    (out,) = compat.run_batch(pipe, None)
    assert out.as_array().shape == (2, 3)
    assert not torch.cuda.is_initialized()


def test_run_batch_gives_the_stream_with_the_pipeline_gpu_current(monkeypatch):
    """DALI reads the device of the legacy default stream (handle 0, torch's default) from the calling
    thread's current device: the pipeline's GPU is made current for the call, and restored."""
    state = fake_cuda_context(monkeypatch)
    pipe = GpuPipeStandIn(state, device_id=3, workers=False)
    stream = FakeStream(3, 0)
    assert compat.run_batch(pipe, stream) == ("outputs",)
    assert compat.run_batch(pipe, None) == ("outputs",)
    assert [(args, device) for args, device, _ in pipe.calls] == [((stream,), 3), ((), 0)]
    assert state["current"] == 0


def test_watched_run_hands_the_stream_to_its_run_thread(monkeypatch):
    """The stream is taken on the consumer's thread (torch's current stream is per thread) and given
    to DALI on the watchdog's run thread, with the pipeline's GPU current there."""
    from dalistream.dali import watchdog

    state = fake_cuda_context(monkeypatch)
    pipe = GpuPipeStandIn(state, device_id=1)
    stream = compat.consumer_stream(pipe)
    try:
        assert watchdog.watched_run(pipe, stream) == ("outputs",)
        assert watchdog.watched_run(pipe) == ("outputs",)
    finally:
        assert watchdog._runners.pop(pipe).stop(5.0)
    assert [(args, device, thread) for args, device, thread in pipe.calls] == [
        ((stream,), 1, "dalistream-run"), ((), 0, "dalistream-run")]


def test_workers_die_with_parent_wraps_dali_worker_entry_once():
    import os
    import pickle
    import threading

    from nvidia.dali._multiproc import pool, worker

    compat.workers_die_with_parent()
    compat.workers_die_with_parent()  # once per process: never wrapped twice
    assert isinstance(pool.worker, compat._ParentWatched) and pool.worker.target is worker.worker
    # spawn pickles the target in the thread that starts the process: the parent's pid, and
    # whether that thread is the main one (the only one the death signal may follow)
    restored = pickle.loads(pickle.dumps(pool.worker))
    assert restored.target is worker.worker and restored.parent == os.getpid() and restored.from_main
    elsewhere = []
    thread = threading.Thread(target=lambda: elsewhere.append(pickle.loads(pickle.dumps(pool.worker))))
    thread.start()
    thread.join()
    assert elsewhere[0].parent == os.getpid() and not elsewhere[0].from_main


DIES_WITH_PARENT = """
import sys, time
import numpy as np
from nvidia.dali import fn, pipeline_def
from dalistream.dali import compat

class Source:
    def __iter__(self):
        return self

    def __next__(self):
        return [np.zeros(1, np.uint8)] * 2

@pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=2, py_start_method=sys.argv[1])
def pipe():
    return tuple(fn.external_source(source=Source(), batch=True, parallel=True, cycle="quiet") for _ in range(2))

if __name__ == "__main__":
    compat.workers_die_with_parent()
    p = pipe()
    p.build()
    p.run()
    print(*[w.pid for w in compat.worker_processes(p)], flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dali_workers_end_with_a_parent_killed_by_sigkill(tmp_path, method):
    import os
    import signal
    import time

    from dalistream.lifetime import alive

    from helpers import REPO

    script = tmp_path / "pipe.py"
    script.write_text(DIES_WITH_PARENT)
    proc = subprocess.Popen([sys.executable, str(script), method], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "PYTHONPATH": REPO})
    workers = []
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) == 2 and all(alive(p) for p in workers), proc.stderr.read()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 5
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in workers)
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in workers:
            if alive(p):
                os.kill(p, signal.SIGKILL)


# -- the pool's queues: QueueCondition across real processes -------------------------------------

def _light_queue(capacity=8):
    """A queue of DALI's worker pool as DALI's pool makes one once :func:`compat.light_queues` ran
    (fork: the consumers inherit its shared memory)."""
    import multiprocessing

    from nvidia.dali._multiproc import pool

    compat.light_queues()
    compat.light_queues()  # once per process: never wrapped twice
    assert isinstance(pool.ShmQueue, compat._LightQueues) and not isinstance(pool.ShmQueue.make, compat._LightQueues)
    ctx = multiprocessing.get_context("fork")
    queue = pool.ShmQueue(ctx, capacity=capacity)
    assert isinstance(queue.cv_not_empty, compat.QueueCondition)
    return ctx, queue


def _message(i):
    from nvidia.dali._multiproc.messages import ShmMessageDesc

    return ShmMessageDesc(-1, i, 0, 0, 0)


def _consume(queue, out, ready=None):
    """A consumer process: every message's chunk id to ``out`` until the queue is closed."""
    if ready is not None:
        ready.set()
    while True:
        got = queue.get()
        if got is None:
            out.put(None)
            return
        for msg in got:
            out.put(msg.shm_chunk_id)


def _finish(processes, timeout=30):
    """Join ``processes``; the ones still running after ``timeout`` are killed and the test fails."""
    import time

    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [p for p in processes if p.exitcode is None]
    for p in hung:
        p.kill()
        p.join(5)
    assert not hung, f"{len(hung)} of {len(processes)} processes hung"
    return [p.exitcode for p in processes]


def _put_within(queue, msgs, timeout=10):
    """``queue.put(msgs)`` on a helper thread: ``"put"``, ``"full"`` (DALI's queue refuses more than
    its capacity), or ``"hung"`` when it did not return within ``timeout`` seconds."""
    import threading

    said = []

    def put():
        try:
            queue.put(msgs)
            said.append("put")
        except RuntimeError as e:
            said.append("full" if "full" in str(e) else repr(e))

    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    thread.join(timeout)
    return said[0] if said else "hung"


@pytest.mark.slow
@pytest.mark.parametrize("consumers,items,burst", [(1, 400, 1), (3, 600, 1), (4, 600, 5), (6, 300, 8)])
def test_queue_condition_hands_every_item_to_exactly_one_of_several_consumers(consumers, items, burst):
    import queue as std_queue
    import time

    ctx, queue = _light_queue(capacity=16)
    out = ctx.Queue()
    procs = [ctx.Process(target=_consume, args=(queue, out), daemon=True) for _ in range(consumers)]
    for p in procs:
        p.start()
    sent = 0
    deadline = time.monotonic() + 60
    while sent < items and time.monotonic() < deadline:
        n = min(burst, items - sent)
        said = _put_within(queue, [_message(sent + k) for k in range(n)])
        assert said in ("put", "full")
        if said == "put":
            sent += n
        else:  # the consumers are behind
            time.sleep(0.001)
    got = []
    ended = 0
    while ended < consumers and time.monotonic() < deadline:
        if len(got) == sent:
            queue.close()  # every consumer, asleep or not, ends (close wakes one, each wakes the next)
        try:
            item = out.get(timeout=1)
        except std_queue.Empty:
            continue
        if item is None:
            ended += 1
        else:
            got.append(item)
    assert _finish(procs) == [0] * consumers
    assert sent == items and sorted(got) == list(range(items))


@pytest.mark.slow
@pytest.mark.parametrize("consumers", [1, 2, 5])
def test_queue_condition_close_wakes_every_waiting_consumer(consumers):
    import time

    ctx, queue = _light_queue()
    out = ctx.Queue()
    readies = [ctx.Event() for _ in range(consumers)]
    procs = [ctx.Process(target=_consume, args=(queue, out, r), daemon=True) for r in readies]
    for p in procs:
        p.start()
    assert all(r.wait(30) for r in readies)
    time.sleep(0.2)  # let them reach the wait (if one is late, close() is seen without waiting: same outcome)
    queue.close()
    assert _finish(procs) == [0] * consumers
    assert [out.get(timeout=5) for _ in range(consumers)] == [None] * consumers


@pytest.mark.slow
@pytest.mark.parametrize("live_before", [False, True])
@pytest.mark.parametrize("dead", [1, 3])
def test_queue_condition_a_waiter_that_died_neither_hangs_a_put_nor_loses_an_item(dead, live_before):
    """multiprocessing's Condition.notify waits for the woken process to say so: a waiter killed
    asleep (the out-of-memory killer) hangs the next put for ever, holding the queue's lock."""
    import os
    import signal
    import time

    ctx, queue = _light_queue()
    out = ctx.Queue()
    live = []

    def start_live():
        ready = ctx.Event()
        live.append(ctx.Process(target=_consume, args=(queue, out, ready), daemon=True))
        live[-1].start()
        assert ready.wait(30)

    if live_before:
        start_live()
    ready = [ctx.Event() for _ in range(dead)]
    doomed = [ctx.Process(target=_consume, args=(queue, out, r), daemon=True) for r in ready]
    for p in doomed:
        p.start()
    assert all(r.wait(30) for r in ready)
    time.sleep(0.3)  # asleep in get()
    for p in doomed:
        os.kill(p.pid, signal.SIGKILL)
    assert [code for code in _finish(doomed)] == [-signal.SIGKILL] * dead
    for i in range(3):
        assert _put_within(queue, [_message(i)]) == "put", "put hung on the dead waiters"
        if i == 0 and not live_before:
            start_live()
    assert sorted(out.get(timeout=30) for _ in range(3)) == [0, 1, 2]
    queue.close()
    assert _finish(live) == [0]


def test_queue_condition_wait_times_out_and_leaves_no_stale_wake_up():
    import multiprocessing
    import threading
    import time

    ctx = multiprocessing.get_context("fork")
    lock = ctx.Lock()
    cv = compat.QueueCondition(ctx, lock)
    with cv:
        assert cv.wait(0.05) is False
        cv.notify()  # nobody waits: nothing is kept for later
        assert cv.wait(0.05) is False
    woken = []

    def waiter():
        with cv:
            woken.append(cv.wait(30))

    threads = [threading.Thread(target=waiter, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()

    def until(condition):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with cv:
                if condition():
                    return True
            time.sleep(0.001)
        return False

    assert until(lambda: cv._sleeping.get_value() == 3)  # all three asleep
    with cv:
        cv.notify(2)
    assert until(lambda: len(woken) == 2)
    with cv:
        assert woken == [True, True] and cv._sleeping.get_value() == 1
        cv.notify(5)  # more than wait: one wakes, nothing left over
    for t in threads:
        t.join(30)
    assert woken == [True] * 3 and cv._sleeping.get_value() == 0 and cv._wake.get_value() == 0


LIGHT_PIPELINE = """
import sys
import numpy as np
from nvidia.dali import fn, pipeline_def
from nvidia.dali._multiproc import pool
from dalistream.config import StreamConfig
from dalistream.dali import compat
from dalistream.dali.watchdog import spawn_without_main
from lightsource import Counting

W = 3

@pipeline_def(batch_size=4, num_threads=1, device_id=None, py_num_workers=W, py_start_method=sys.argv[1],
              prefetch_queue_depth=int(sys.argv[3]))
def pipe():
    return tuple(fn.external_source(source=Counting(w), batch=True, parallel=True, cycle="quiet",
                                    prefetch_queue_depth=int(sys.argv[3])) for w in range(W))

if __name__ == "__main__":
    p = pipe()
    with spawn_without_main(StreamConfig(sources=("-",), fields={"x": "bin"}, batch_size=4), sys.argv[1]):
        p.build()
    procs = p._py_pool.pool
    queues = [procs._result_queue] + [c.dedicated_task_queue for c in procs._workers_contexts]
    assert len(queues) == W + 1 and all(isinstance(q.cv_not_empty, compat.QueueCondition) for q in queues)
    for i in range(int(sys.argv[2])):
        for w, out in enumerate(p.run()):
            got = [np.asarray(out[k]).tolist() for k in range(4)]
            assert got == [[w, i % 251, k] * (k + 1) for k in range(4)], (i, w, got)
    compat.shutdown(p)
    print("ok", flush=True)
"""

LIGHT_SOURCE = """
import numpy as np

class Counting:
    def __init__(self, w):
        self.w, self.i = w, 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = [np.array([self.w, self.i % 251, k] * (k + 1), np.uint8) for k in range(4)]
        self.i += 1
        return batch
"""


@pytest.mark.slow
@pytest.mark.parametrize("method,prefetch", [("fork", 1), ("fork", 3), ("spawn", 2)])
def test_dali_pools_run_many_batches_on_light_queues(tmp_path, method, prefetch):
    """A pipeline whose workers are started as dalistream starts them (its queues then wake their
    waiters with a QueueCondition) runs many batches of three parallel sources, every batch whole
    and in order; it never hangs (the run is killed after its timeout)."""
    import os

    from helpers import REPO

    (tmp_path / "lightsource.py").write_text(LIGHT_SOURCE)
    script = tmp_path / "pipe.py"
    script.write_text(LIGHT_PIPELINE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, str(tmp_path)])}
    try:
        done = subprocess.run([sys.executable, str(script), method, "600", str(prefetch)], capture_output=True,
                              text=True, timeout=240, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("the pipeline hung")
    assert done.returncode == 0 and done.stdout.split() == ["ok"], done.stderr[-3000:]
