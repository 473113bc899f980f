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
