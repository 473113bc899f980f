import pytest

from dalistream import ops
from dalistream.errors import ConfigError


@pytest.mark.parametrize("visible", [0, 1, 2, 8])
def test_device_switch(monkeypatch, visible):
    """``auto`` takes a GPU when DALI sees one; the count is faked where the library asks it (``device.gpu_count``)."""
    from dalistream.dali import device

    monkeypatch.setattr(device, "gpu_count", lambda: visible)
    if visible == 0:
        assert ops.resolve_device("auto") == ("cpu", None)
        with pytest.raises(ConfigError, match="no CUDA device"):
            ops.resolve_device("gpu")
    else:
        assert ops.resolve_device("auto") == ("gpu", 0)
        assert ops.resolve_device("gpu", visible - 1) == ("gpu", visible - 1)
        with pytest.raises(ConfigError, match=f"not one of the {visible} visible GPUs"):
            ops.resolve_device("gpu", visible)  # an explicit device_id is never wrapped around
    assert ops.resolve_device("cpu", 3) == ("cpu", None)  # CPU graphs never get a device id
    with pytest.raises(ConfigError):
        ops.resolve_device("tpu")


def test_library_ops_are_kept_out_of_autograph():
    """DALI's AutoGraph rewrites every function a pipeline calls unless it is marked (30–200 ms
    each): only the code with an `if` on data is converted, and that is converted wherever it is
    called from."""
    from nvidia.dali._conditionals import _autograph

    from dalistream.dali import graph, pipeline
    from dalistream.dali import ops as dali_ops

    for fn in (ops.decode_images, ops.random_resized_crop, ops.resize_shorter, ops.normalize, ops.coin_flip,
               ops.color_jitter, ops.to_device, graph.sharded_sources, pipeline.read, pipeline._check_outputs,
               dali_ops.with_placeholder, graph._by_owner, graph.merged, graph.merge_by_concat,
               graph.valid_of, graph.owner_of, graph.receive_blobs, graph.received_rows, graph.bucket_nodes):
        assert _autograph.is_autograph_artifact(fn), fn.__name__
    assert not _autograph.is_autograph_artifact(graph.merge)


@pytest.mark.parametrize("random_crop", [False, True])
def test_padding_decodes_the_placeholder_without_conditionals(random_crop):
    """Empty padding rows would fail the decoder: each gets the 16x16 black JPEG, by a length mask;
    real rows pass unchanged. No conditionals in the pipeline."""
    import io

    import numpy as np
    from nvidia.dali import fn, pipeline_def
    from PIL import Image

    picture = io.BytesIO()
    Image.new("RGB", (5, 3), (200, 10, 10)).save(picture, "PNG")
    rows = [np.frombuffer(picture.getvalue(), np.uint8), np.zeros(0, np.uint8), np.zeros(0, np.uint8)]
    valid = [np.array(1, np.uint8), np.array(0, np.uint8), np.array(0, np.uint8)]

    @pipeline_def(batch_size=3, num_threads=1, device_id=None)
    def pipe():
        data, flags = fn.external_source(source=lambda: (rows, valid), num_outputs=2, batch=True)
        return ops.with_placeholder(data, flags), ops.decode_images(data, flags, "cpu", random_crop=random_crop,
                                                                    random_area=(1, 1), random_aspect_ratio=(1, 1))

    p = pipe()
    p.build()
    joined, images = p.run()
    assert bytes(np.array(joined[0])) == picture.getvalue()
    assert bytes(np.array(joined[1])) == ops.PLACEHOLDER_JPEG
    shapes = [np.array(images[i]).shape for i in range(3)]
    if not random_crop:
        assert shapes[0] == (3, 5, 3) and np.array(images[0])[0, 0].tolist() == [200, 10, 10]
    if not random_crop:  # the whole placeholder decoded (a random crop window may be smaller)
        assert shapes[1:] == [(16, 16, 3), (16, 16, 3)]
    assert all(s[2] == 3 for s in shapes[1:])
    assert int(np.array(images[1]).max()) <= 1  # black


def test_the_placeholder_is_a_16x16_baseline_420_colour_jpeg():
    """What every decoder engine takes, the A100/H100 hardware one included: a baseline (SOF0)
    frame of 16x16 pixels, three components, luma sampled 2x2 and chroma 1x1 (4:2:0), 8 bits;
    DALI's CPU decoder makes a 16x16x3 black image of it."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    data = ops.PLACEHOLDER_JPEG
    assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"
    frames, at = {}, 2
    while data[at + 1] != 0xDA:  # the segments before the scan
        marker, length = data[at + 1], int.from_bytes(data[at + 2:at + 4], "big")
        frames.setdefault(marker, data[at + 4:at + 2 + length])
        at += 2 + length
    assert 0xC0 in frames and not {0xC1, 0xC2, 0xC3} & set(frames)  # baseline, not extended or progressive
    sof = frames[0xC0]
    precision, height, width, components = sof[0], int.from_bytes(sof[1:3], "big"), int.from_bytes(sof[3:5], "big"), sof[5]
    sampling = [sof[6 + 3 * i + 1] for i in range(components)]
    assert (precision, height, width, components) == (8, 16, 16, 3)
    assert sampling == [0x22, 0x11, 0x11]  # 4:2:0

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def decode():
        raw = types.Constant(np.frombuffer(data, np.uint8), device="cpu")
        return fn.decoders.image(raw, device="cpu", output_type=types.RGB)

    pipe = decode()
    pipe.build()
    (image,) = pipe.run()
    pixels = np.array(image[0])
    assert pixels.shape == (16, 16, 3) and int(pixels.max()) <= 1


def test_decoder_options_are_checked_and_gpu_only_ones_left_out_on_the_cpu():
    from dalistream.dali.ops import decoder_settings

    given = {"hw_decoder_load": 0.5, "device_memory_padding": 1 << 24, "jpeg_fancy_upsampling": True}
    assert decoder_settings(given, "gpu") == given
    assert decoder_settings(given, "cpu") == {"jpeg_fancy_upsampling": True}
    assert decoder_settings(None, "gpu") == {}
    with pytest.raises(ConfigError, match="unknown"):
        decoder_settings({"hw_decode_load": 0.5}, "gpu")  # a typo is named, not passed to DALI


@pytest.mark.dali
@pytest.mark.slow
def test_ready_pipelines_take_decoder_options_on_the_cpu(tmp_path):
    """GPU settings in a ready pipeline's call run unchanged on the CPU."""
    from dalistream.pipelines import classification_eval, classification_train
    from dalistream.tools.synth import SynthSpec, write_dataset

    write_dataset(str(tmp_path), SynthSpec(shards=2, samples_per_shard=8, seed=1))
    options = {"hw_decoder_load": 0.7, "preallocate_width_hint": 64, "jpeg_fancy_upsampling": True}
    for module in (classification_train, classification_eval):
        with module.loader(str(tmp_path), batch_size=4, size=32, workers=1, device="cpu",
                           decoder_options=options, cache_dir=str(tmp_path / "c")) as loader:
            batch = next(iter(loader))
        assert tuple(batch["image"].shape) == (4, 3, 32, 32)


@pytest.mark.parametrize("schema", ["decoders__Image", "decoders__ImageRandomCrop"])
def test_decoder_options_are_arguments_of_both_decoders(schema):
    """A misspelled GPU-only option would be dropped on the CPU and fail only on a GPU: every name
    is checked against DALI's own schema of the two decoders the ops use."""
    from nvidia.dali import backend

    names = set(backend.GetSchema(schema).GetArgumentNames())
    assert ops.DECODER_OPTIONS <= names, sorted(ops.DECODER_OPTIONS - names)


def test_documented_decoder_defaults_are_dalis():
    """The defaults the docs and ``dali/ops.py`` quote are DALI's (a wrong one misleads tuning)."""
    import os
    import re

    from nvidia.dali import backend

    load = float(backend.GetSchema("decoders__Image").GetArgumentDefaultValueString("hw_decoder_load"))
    fancy = backend.GetSchema("decoders__Image").GetArgumentDefaultValueString("jpeg_fancy_upsampling")
    assert fancy == "False"  # why the GPU test asks for it: the CPU decoder upsamples smoothly
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for path in (os.path.join("docs", "guide", "gpu.md"), os.path.join("dalistream", "dali", "ops.py")):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            text = " ".join(f.read().replace("#:", " ").split())
        quoted = re.findall(r"hw_decoder_load[^;)]*?default (\d+(?:\.\d+)?)", text)
        assert quoted and all(float(q) == load for q in quoted), (path, quoted, load)
