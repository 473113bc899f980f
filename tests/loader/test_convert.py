import sys

import numpy as np
import pytest
import torch

from dalistream.loader import BufferPool


def test_a_released_buffer_is_reused():
    pool = BufferPool()
    first = pool.get("image", (4, 3), torch.float32)
    ptr = first.data_ptr()
    del first
    assert pool.get("image", (4, 3), torch.float32).data_ptr() == ptr


def test_buffers_still_referenced_are_never_reused():
    pool = BufferPool(keep=8)
    held = pool.get("x", (4, 3), torch.float32)            # the loop still holds the batch
    owner = pool.get("x", (4, 3), torch.float32)
    view = owner[1:]                                       # a view keeps the storage
    taken = {held.data_ptr(), owner.data_ptr()}
    del owner
    owner = pool.get("x", (4, 3), torch.float32)
    alias = owner.numpy()                                  # so does a NumPy alias
    taken.add(owner.data_ptr())
    del owner
    owner = pool.get("x", (4, 3), torch.float32).requires_grad_(False)
    loss = torch.nn.Linear(3, 1)(owner).sum()              # autograd saves the input for backward
    taken.add(owner.data_ptr())
    del owner
    assert len(taken) == 4
    assert pool.get("x", (4, 3), torch.float32).data_ptr() not in taken
    assert view.shape == (3, 3) and alias.shape == (4, 3) and loss.requires_grad


def test_other_shapes_get_their_own_buffer():
    pool = BufferPool()
    a = pool.get("x", (2,), torch.int64)
    del a
    assert pool.get("x", (3,), torch.int64).shape == (3,)
    assert pool.get("y", (3,), torch.float32).dtype == torch.float32
    np.testing.assert_equal(len(pool.pools["x"]), 2)


@pytest.mark.dali
@pytest.mark.parametrize("dynamic", [True, False])
def test_cpu_outputs_reach_torch_without_a_copy_under_the_dynamic_executor(dynamic):
    """The dynamic executor's outputs stay valid while referenced: torch gets DALI's memory
    (DLPack), and the batches DALI makes after it leave it as it was; the other executor reuses
    its buffers, so its outputs are copied into the pool's."""
    from nvidia.dali import fn, pipeline_def

    from dalistream.dali import compat
    from dalistream.loader.convert import to_torch

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, exec_dynamic=dynamic, prefetch_queue_depth=2)
    def graph():
        return fn.random.uniform(range=[0.0, 1.0], shape=[64, 3])

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    dali_ptr, expected = out.as_tensor().data_ptr(), out.as_array().copy()
    batch = to_torch([("x", "tensor")], [out], BufferPool(), zero_copy=compat.exec_dynamic(pipe))
    del out
    later = [pipe.run()[0].as_array() for _ in range(4)]
    assert compat.exec_dynamic(pipe) is dynamic
    assert (batch["x"].data_ptr() == dali_ptr) is dynamic
    assert tuple(batch["x"].shape) == (2, 64, 3) and not batch["x"].is_cuda
    np.testing.assert_array_equal(batch["x"].numpy(), expected)
    assert not any(np.array_equal(a, expected) for a in later)  # (the later batches are other numbers)


@pytest.mark.dali
def test_a_cpu_batch_that_outlives_close_stays_valid_and_the_process_exits_cleanly(tmp_path):
    """A batch is DALI's memory (the dynamic executor): kept past ``close()`` (pipeline and workers
    gone) it reads the same, and the interpreter exits cleanly with it still alive."""
    import json
    import subprocess
    import sys
    import textwrap

    from dalistream.tools.synth import SynthSpec, write_dataset

    write_dataset(str(tmp_path), SynthSpec(shards=2, samples_per_shard=16, seed=5))
    code = textwrap.dedent(f"""
        import json
        from dalistream.pipelines import classification_train
        loader = classification_train.loader({str(tmp_path)!r}, batch_size=8, size=32, workers=2, device="cpu")
        batch = next(iter(loader))
        before = batch["image"].double().sum().item()
        loader.close()
        after = batch["image"].double().sum().item()
        print(json.dumps({{"before": before, "after": after, "shape": list(batch["image"].shape)}}))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == seen["after"] and seen["shape"] == [8, 3, 32, 32]


@pytest.mark.dali
def test_images_of_different_sizes_come_as_a_list_and_it_is_said_once(tmp_path, caplog):
    """Without a resize, decoded images of different sizes cannot stack: the output comes as a list
    of tensors, and a warning says so once (with the shapes), instead of a silent change of type."""
    import io as _io
    import logging

    from PIL import Image

    import dalistream
    from dalistream import ops
    from dalistream.loader import convert

    from helpers import write_tar

    members = []
    for i, size in enumerate([(8, 6), (5, 9), (8, 6), (7, 7)]):
        buf = _io.BytesIO()
        Image.new("RGB", size, (i * 40, 0, 0)).save(buf, format="PNG")
        members += [(f"k{i}.png", buf.getvalue()), (f"k{i}.cls", b"1")]
    path = write_tar(str(tmp_path / "img.tar"), members)

    @dalistream.pipeline_def
    def decoded(stream):
        data = dalistream.read(stream)
        return {"image": ops.decode_images(data["image"], data["valid"], stream.device, padded=stream.may_pad)}

    convert._ragged_told.discard("image")
    stream = dalistream.Stream.open(path, fields={"image": "png"}, batch_size=2, workers=1, device="cpu",
                                    policy="exact", cache_dir=str(tmp_path / "c"))
    with caplog.at_level(logging.WARNING, logger="dalistream"), dalistream.Loader(stream, decoded) as loader:
        batches = [b["image"] for b in loader]
    assert isinstance(batches[0], list) and [tuple(t.shape) for t in batches[0]] == [(6, 8, 3), (9, 5, 3)]
    assert caplog.text.count("differ in shape") == 1 and "(6, 8, 3)" in caplog.text


@pytest.mark.parametrize("mask, run", [
    ([1, 1, 1, 0, 0], True),     # padding at the end (the usual place): a view
    ([0, 0, 1, 1, 1], True),     # at the start
    ([1, 1, 1, 1, 0], True),
    ([1, 0, 1, 0, 1], False),    # scattered: gathered
    ([0, 1, 1, 0, 1], False),
    ([0, 0, 0, 0, 0], True),     # nothing left
])
def test_padding_is_trimmed_by_a_view_when_the_real_rows_are_one_run(mask, run):
    """Trimming the padding of a batch copies nothing when the real rows lie in one run (a slice of
    the batch, sharing its memory: on a GPU no copy of the whole batch); scattered rows are
    gathered. Every kind of value keeps the same rows."""
    from dalistream.loader.convert import trimmed

    keep = np.flatnonzero(np.array(mask, bool))
    images = torch.arange(5 * 2 * 3, dtype=torch.float32).reshape(5, 2, 3)
    labels = torch.arange(5, dtype=torch.int64) * 10
    keys = [f"k{i}" for i in range(5)]
    ragged = [torch.zeros(i + 1) for i in range(5)]
    out = trimmed({"image": images, "label": labels, "key": keys, "ragged": ragged}, keep)
    assert out["label"].tolist() == [10 * int(i) for i in keep]
    assert out["key"] == [f"k{i}" for i in keep]
    assert [t.shape[0] for t in out["ragged"]] == [int(i) + 1 for i in keep]
    assert torch.equal(out["image"], images[torch.from_numpy(keep)])
    if len(keep) == 0:
        assert out["image"].shape == (0, 2, 3)
    else:
        shares = out["image"].untyped_storage().data_ptr() == images.untyped_storage().data_ptr()
        assert shares is run and out["image"].is_contiguous()


def _calls(run) -> int:
    """The Python calls ``run()`` makes (functions entered, C code's calls into Python included)."""
    seen = [0]

    def count(frame, event, arg):
        seen[0] += event == "call"

    previous = sys.gettrace()
    sys.settrace(count)
    try:
        run()
    finally:
        sys.settrace(previous)
    return seen[0]


def _interrupted_at(run, n: int) -> str:
    """``run()`` with ``KeyboardInterrupt`` raised on entering its ``n``-th Python call, as
    SIGINT's handler raises it in whatever Python code runs when the signal is handled; the
    function it was raised in when it never reached the caller, else ''."""
    seen, where = [0], [""]

    def interrupt(frame, event, arg):
        if event == "call":
            seen[0] += 1
            if seen[0] == n:
                where[0] = f"{frame.f_code.co_filename}:{frame.f_code.co_name}"
                raise KeyboardInterrupt

    previous = sys.gettrace()
    sys.settrace(interrupt)
    try:
        run()
    except KeyboardInterrupt:
        return ""
    finally:
        sys.settrace(previous)
    return where[0]


@pytest.mark.dali
@pytest.mark.parametrize("dynamic", [True, False])
def test_a_ctrl_c_anywhere_in_a_batch_conversion_reaches_the_training_loop(dynamic):
    """A Ctrl-C is a ``KeyboardInterrupt`` raised in whatever Python code runs when the signal is
    handled, also code that a C library calls and whose exceptions it drops: ``torch.from_dlpack``
    of a DALI tensor had pybind11 run an ``Enum.__getattr__`` and clear what it raised, so a
    Ctrl-C landing there was lost and the training loop went on (the interrupt test of
    ``test_faults.py`` then waited in vain, about once in 50 runs). Raised on entering each
    Python call of a batch's conversion in turn, for every kind of output (dense, ragged, a
    kind's rows, padding trimmed), with and without DALI's memory shared: it always arrives."""
    from nvidia.dali import fn, pipeline_def

    from dalistream.dali import compat
    from dalistream.loader.convert import to_torch

    rows = [np.arange(i + 1, dtype=np.float32) for i in range(4)]
    data = ([np.full((2, 3), i, np.float32) for i in range(4)], rows,
            [np.frombuffer(b"row%d" % i, np.uint8) for i in range(4)], [np.array(v, np.uint8) for v in (1, 1, 1, 0)])

    @pipeline_def(batch_size=4, num_threads=1, device_id=None, exec_dynamic=dynamic)
    def graph():
        return tuple(fn.external_source(source=lambda: data, num_outputs=4, batch=True))

    pipe = graph()
    pipe.build()
    outputs = pipe.run()
    names = [("image", "tensor"), ("ragged", "tensor"), ("text", "bytes"), ("valid", "tensor")]

    def run():
        return to_torch(names, outputs, BufferPool(), zero_copy=compat.exec_dynamic(pipe))

    batch = run()  # (also once through what is done once: imports, the ragged output's warning)
    assert batch["image"].shape == (3, 2, 3) and batch["text"] == [b"row0", b"row1", b"row2"]
    assert (batch["image"].untyped_storage().data_ptr() == outputs[0].as_tensor().data_ptr()) is dynamic
    calls = _calls(run)
    assert calls > 20
    lost = [where for n in range(1, calls + 1) for where in [_interrupted_at(run, n)] if where]
    assert not lost, f"a KeyboardInterrupt raised in these calls never reached the caller: {lost}"
