"""The GPU path (mixed decode, GPU augmentation, CUDA tensors). Runs only where DALI sees a GPU;
CI has none and skips this module, `dalistream bench --device gpu` and these tests are how the
same graph is checked on a GPU machine."""

import numpy as np
import pytest

import dalistream
from dalistream import ops
from dalistream.tools.synth import SynthSpec, write_dataset

# The GPU count is asked when a test runs, not at collection: asking initializes CUDA in the
# asking process, after which DALI cannot fork workers (conftest.py also runs these tests last).
pytestmark = [pytest.mark.dali, pytest.mark.gpu]


@pytest.fixture(autouse=True)
def needs_a_gpu():
    if ops.gpu_count() == 0:
        pytest.skip("no CUDA device visible to DALI")


@dalistream.pipeline_def
def decoded(stream, size=48, decoder_options=None):
    data = dalistream.read(stream)
    images = ops.decode_images(data["image"], data["valid"], stream.device, padded=stream.may_pad,
                               decoder_options=decoder_options)
    images = ops.random_resized_crop(images, stream.device, (size, size))
    return {"image": images, "key": data["key"]}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("gpu"))
    write_dataset(d, SynthSpec(shards=4, samples_per_shard=12, uneven=True, seed=3))
    return d


def open_stream(shards, device, **kw):
    return dalistream.Stream.open(shards, fields={"image": "jpg;png", "key": "__key__", "label": "cls"},
                                  batch_size=8, workers=2, device=device, **kw)


def test_auto_picks_the_gpu(shards):
    assert open_stream(shards, "auto").device == "gpu"


def test_classification_train_yields_cuda_tensors(shards):
    from dalistream.pipelines import classification_train

    with classification_train.loader(shards, batch_size=8, size=32, workers=2, device="gpu") as loader:
        batch = next(iter(loader))
    assert batch["image"].is_cuda and batch["image"].shape == (8, 3, 32, 32)
    assert batch["label"].is_cuda and str(batch["label"].dtype) == "torch.int64"


def test_gpu_decode_matches_cpu_decode_and_padding_is_trimmed(shards):
    out = {}
    for device in ("cpu", "gpu"):
        # DALI's GPU decoder upsamples chroma without smoothing unless told: the same setting on both
        with dalistream.Loader(open_stream(shards, device, policy="exact"), decoded,
                               decoder_options={"jpeg_fancy_upsampling": True}) as loader:
            images = {}
            for batch in loader:
                for key, image in zip(batch["key"], batch["image"]):
                    images[key] = image.cpu().numpy().astype(np.float32)
            out[device] = images
    assert out["cpu"].keys() == out["gpu"].keys()
    diff = np.mean([np.abs(out["cpu"][k] - out["gpu"][k]).mean() for k in out["cpu"]])
    assert diff < 4.0  # nvJPEG and libjpeg-turbo differ by rounding only


@pytest.mark.parametrize("dynamic", [True, False])
def test_gpu_outputs_reach_torch_without_a_copy_under_the_dynamic_executor(dynamic):
    """The dynamic executor's outputs stay valid while referenced: torch gets the same memory
    (DLPack); the other executor reuses its buffers, so its outputs are copied once."""
    import torch
    from nvidia.dali import fn, pipeline_def

    from dalistream.dali import compat
    from dalistream.loader.convert import to_torch

    @pipeline_def(batch_size=2, num_threads=1, device_id=0, exec_dynamic=dynamic)
    def graph():
        return fn.random.uniform(range=[0.0, 1.0], shape=[4, 3]).gpu()

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    dali_ptr = out.as_tensor().data_ptr()
    batch = to_torch([("x", "array")], [out], zero_copy=compat.exec_dynamic(pipe))
    assert compat.exec_dynamic(pipe) is dynamic
    assert batch["x"].is_cuda and tuple(batch["x"].shape) == (2, 4, 3)
    assert (batch["x"].data_ptr() == dali_ptr) is dynamic
    assert torch.equal(batch["x"].cpu(), torch.from_numpy(out.as_cpu().as_array()))
