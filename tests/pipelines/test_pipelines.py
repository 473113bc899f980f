"""The ready pipelines and the @pipeline_def helpers, built on the CPU over real, odd images.

The shards hold RGB JPEGs, grayscale and CMYK JPEGs, PNGs stored as ``.jpg``, RGBA and
grayscale PNGs; every one must come out as 3-channel RGB. Each sample's ``cls`` is unique, so
a label names its sample. DALI pipeline builds are slow here: this file builds five.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dalistream
from dalistream import ops

pytestmark = [pytest.mark.dali]

torch = pytest.importorskip("torch")
pytest.importorskip("nvidia.dali")
wds = pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")

KINDS = [  # (tar extension, PIL format, PIL mode or None for RGB)
    ("jpg", "JPEG", None), ("jpg", "JPEG", "L"), ("jpg", "JPEG", "CMYK"), ("jpg", "PNG", None),
    ("png", "PNG", "RGBA"), ("png", "PNG", "L"),
]
SHARDS, PER_SHARD = 2, 11  # 11 per worker: uneven batches, padding under "exact"


def _encode(image: np.ndarray, fmt: str, mode) -> bytes:
    pil = Image.fromarray(image)
    if mode:
        pil = pil.convert(mode)
    out = io.BytesIO()
    pil.save(out, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return out.getvalue()


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """Write the shards; return (directory, {key: sample facts}, cache dir)."""
    root = tmp_path_factory.mktemp("odd")
    data = root / "shards"
    data.mkdir()
    rng = np.random.default_rng(0)
    truth = {}
    i = 0
    for s in range(SHARDS):
        with wds.TarWriter(str(data / f"odd-{s:03d}.tar")) as sink:
            for _ in range(PER_SHARD):
                ext, fmt, mode = KINDS[i % len(KINDS)]
                h, w = (int(v) for v in rng.integers(40, 90, 2))
                y, x = np.mgrid[0:h, 0:w]
                image = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h) + 60 + i], -1).astype(np.uint8)
                encoded = _encode(image, fmt, mode)
                key = f"odd{s}/{i:04d}"
                caption = f"caption {i}: a gradient, très lisse"
                sample = {"__key__": key, ext: encoded, "cls": str(i).encode()}
                if i % 4 == 3:  # some captions only as JSON
                    sample["json"] = json.dumps({"caption": caption, "width": w}).encode()
                else:
                    sample["txt"] = caption.encode()
                sink.write(sample)
                truth[key] = {"bytes": encoded, "label": i, "caption": caption, "kind": (ext, fmt, mode)}
                i += 1
    return str(data), truth, str(root / "cache")


def _pil_rgb(encoded: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"), dtype=np.float32)


def _range(mean, std):
    lo = min((0 - m) / s for m, s in zip(mean, std))
    hi = max((255 - m) / s for m, s in zip(mean, std))
    return lo - 1e-3, hi + 1e-3


def _check_images(images, batch_len: int, size: int, dtype, mean=ops.IMAGENET_MEAN, std=ops.IMAGENET_STD):
    assert isinstance(images, torch.Tensor)
    assert images.dtype == dtype and images.device.type == "cpu"
    assert tuple(images.shape) == (batch_len, 3, size, size)
    values = images.float()
    assert torch.isfinite(values).all()
    lo, hi = _range(mean, std)
    assert lo <= float(values.min()) and float(values.max()) <= hi
    # real pictures, not padding: every image varies
    assert (values.flatten(1).std(1) > 0.05).all()


# -- the helpers ----------------------------------------------------------------------------


@dalistream.pipeline_def
def decoded(stream, shift=0):
    """A user pipeline: read, decode without augmentation, a user op on the labels, a user argument."""
    data = dalistream.read(stream)
    images = ops.decode_images(data["image"], data["valid"], stream.device, padded=stream.may_pad)
    return {"image": images, "label": data["label"] + shift, "key": data["key"]}


def test_user_pipeline_decodes_like_pil(odd):
    """Grayscale, CMYK, PNG-in-.jpg and RGBA all come out RGB and match PIL's decode."""
    shards, truth, cache = odd
    stream = dalistream.Stream.open(shards, fields={"image": "jpg;png", "label": "cls", "key": "__key__"},
                                    batch_size=8, workers=2, device="cpu", policy="exact", cache_dir=cache)
    assert stream.may_pad
    seen = []
    with dalistream.Loader(stream, decoded, shift=100) as loader:
        assert len(loader) == 3
        for batch in loader:
            assert batch["label"].dtype == torch.int64 and batch["label"].shape == (len(batch["key"]),)
            for key, image, label in zip(batch["key"], batch["image"], batch["label"].tolist()):
                fact = truth[key]
                assert label == fact["label"] + 100
                assert image.dtype == torch.uint8 and image.ndim == 3 and image.shape[2] == 3, fact["kind"]
                reference = _pil_rgb(fact["bytes"])
                assert tuple(image.shape) == reference.shape, fact["kind"]
                diff = np.abs(image.numpy().astype(np.float32) - reference).mean()
                assert diff < 2.0, (fact["kind"], diff)
                seen.append(key)
    assert sorted(seen) == sorted(truth)  # every sample once, padding trimmed


@dalistream.pipeline_def
def by_parity(stream):
    """A user's own `if` on data, with dalistream's ops (kept out of AutoGraph) in both branches."""
    data = dalistream.read(stream)
    if data["label"] % 2 == 0:  # the decode guard (an `if` of its own) nests in the user's
        images = ops.decode_images(data["image"], data["valid"], stream.device, padded=stream.may_pad)
        out = ops.normalize(ops.random_resized_crop(images, stream.device, (8, 8)), stream.device,
                            mean=(0, 0, 0), std=(1, 1, 1))
    else:
        images = ops.decode_images(data["image"], data["valid"], stream.device, padded=stream.may_pad)
        out = ops.normalize(ops.random_resized_crop(images, stream.device, (8, 8)), stream.device,
                            mean=(255, 255, 255), std=(1, 1, 1))
    return {"image": out, "label": data["label"]}


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_user_conditionals_around_dalistream_ops(odd, start_method):
    shards, truth, cache = odd
    stream = dalistream.Stream.open(shards, fields={"image": "jpg;png", "label": "cls"}, batch_size=8, workers=2,
                                    device="cpu", policy="exact", cache_dir=cache, start_method=start_method)
    labels = []
    with dalistream.Loader(stream, by_parity) as loader:
        for batch in loader:
            for image, label in zip(batch["image"], batch["label"].tolist()):
                assert tuple(image.shape) == (3, 8, 8)
                if label % 2 == 0:
                    assert float(image.min()) >= 0 and float(image.max()) > 0
                else:
                    assert float(image.max()) <= 0 and float(image.min()) < 0
                labels.append(label)
    assert sorted(labels) == sorted(fact["label"] for fact in truth.values())


def test_pipeline_def_rejects_misuse(odd):
    shards, _, cache = odd
    stream = dalistream.Stream.open(shards, fields={"image": "jpg;png", "label": "cls"}, batch_size=4,
                                    workers=1, device="cpu", cache_dir=cache)

    @dalistream.pipeline_def
    def named_valid(stream):
        data = dalistream.read(stream)
        return {"valid": data["label"]}

    @dalistream.pipeline_def
    def reads_twice(stream):
        dalistream.read(stream)
        return dalistream.read(stream)

    @dalistream.pipeline_def
    def no_read(stream):
        from nvidia.dali import fn
        return {"x": fn.zeros(shape=[1])}

    for bad in (named_valid, reads_twice, no_read):
        with pytest.raises(dalistream.ConfigError):
            bad(stream)
    with pytest.raises(dalistream.ConfigError):
        decoded(stream, batch_size=3)
    with pytest.raises(dalistream.ConfigError):
        dalistream.pipeline_def(lambda s: {}, py_num_workers=3)
    with pytest.raises(RuntimeError):
        dalistream.read(stream)


@dalistream.pipeline_def
def labels_only(stream):
    """Returns one of the declared fields: the others are never read."""
    return {"label": dalistream.read(stream)["label"]}


@dalistream.pipeline_def
def decodes_but_returns_keys(stream):
    """Touches every field, even builds ops on the image, but its outputs need only the key."""
    data = dalistream.read(stream)
    ops.decode_images(data["image"], data["valid"], stream.device, padded=stream.may_pad)
    data["label"] + 1
    return {"key": data["key"]}


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("pipeline, outputs", [(labels_only, {"label"}), (decodes_but_returns_keys, {"key"})])
def test_fields_the_pipeline_does_not_use_are_not_read(odd, workers, pipeline, outputs):
    """DALI warned "The external source node … produces N outputs, but the output at the index 0 is
    not used" once per worker; now the sources carry only what the outputs need. ``caption`` is
    missing from a quarter of the samples under missing="error": unused, it is never looked at."""
    import warnings

    shards, truth, cache = odd
    stream = dalistream.Stream.open(shards, fields={"image": "jpg;png", "label": "cls", "key": "__key__",
                                                    "caption": "txt"},
                                    batch_size=4, workers=workers, device="cpu", policy="exact", cache_dir=cache)
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dalistream.Loader(stream, pipeline) as loader:
            for batch in loader:
                assert set(batch) == outputs
                seen += batch["label"].tolist() if "label" in batch else [truth[k]["label"] for k in batch["key"]]
    assert not [str(w.message) for w in caught if "external source" in str(w.message)]
    assert sorted(seen) == sorted(f["label"] for f in truth.values())


def test_a_pipeline_that_uses_every_field_is_defined_once(odd):
    shards, _, cache = odd
    calls = []

    @dalistream.pipeline_def
    def counted(stream, unused_label):
        calls.append(1)
        data = dalistream.read(stream)
        return {"key": data["key"]} if unused_label else {"key": data["key"], "label": data["label"]}

    stream = dalistream.Stream.open(shards, fields={"label": "cls", "key": "__key__"}, batch_size=4, workers=2,
                                    device="cpu", cache_dir=cache)
    counted(stream, unused_label=False)
    assert len(calls) == 1
    counted(stream, unused_label=True)  # once too: the sources leave the label out without a second definition
    assert len(calls) == 2


@pytest.mark.slow
def test_no_unused_output_warning_on_stderr(odd, tmp_path):
    """The run as a user sees it: DALI's warning went to stderr once per worker."""
    shards, _, cache = odd
    script = tmp_path / "train.py"
    script.write_text(f"""
import dalistream
from dalistream import ops

@dalistream.pipeline_def
def train(stream):
    data = dalistream.read(stream)
    images = ops.decode_images(data["image"], data["valid"], stream.device, padded=stream.may_pad)
    return {{"image": ops.random_resized_crop(images, stream.device, (16, 16))}}

if __name__ == "__main__":
    stream = dalistream.Stream.open({shards!r}, fields={{"image": "jpg;png", "label": "cls", "text": "txt;json"}},
                                    batch_size=4, workers=2, device="cpu", cache_dir={cache!r})
    with dalistream.Loader(stream, train) as loader:
        print(sum(len(batch["image"]) for batch in loader))
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 0
    assert "external source node" not in done.stderr and "not used" not in done.stderr, done.stderr[-3000:]


# -- the ready pipelines ---------------------------------------------------------------------


def test_classification_train(odd):
    from dalistream.pipelines import classification_train

    shards, truth, cache = odd
    labels = set()
    with classification_train.loader(shards, batch_size=8, size=32, workers=2, device="cpu", shuffle=6,
                                     cache_dir=cache, seed=3) as loader:
        assert isinstance(loader, dalistream.Loader)
        assert len(loader) == 2  # "even": 11 samples per worker, slot 4
        for epoch in range(2):  # epochs follow each other on the same pipeline
            loader.set_epoch(epoch)
            batches = list(loader)
            assert len(batches) == 2
            for batch in batches:
                assert set(batch) == {"image", "label"}
                _check_images(batch["image"], 8, 32, torch.float32)
                assert batch["label"].dtype == torch.int64 and tuple(batch["label"].shape) == (8,)
                labels.update(batch["label"].tolist())
        state = loader.state_dict()
        assert state["loader"] == {"epoch": 2, "step": 0}
        assert state["plan"]["shuffle"] == 6 and state["plan"]["policy"] == "even"
    assert labels <= {f["label"] for f in truth.values()}


@pytest.mark.parametrize("policy", ["even", "exact"])
def test_ready_pipelines_are_defined_without_conditionals(odd, policy):
    """Their `if`s are on options, and padding needs no guard conditional: no AutoGraph rewrite,
    whatever the options and whether batches can hold padding."""
    from dalistream.dali.pipeline import built
    from dalistream.pipelines import classification_eval, classification_train, image_text

    shards, _, cache = odd
    stream = dalistream.Stream.open(shards, fields={"image": "jpg;png", "label": "cls", "text": "txt;json"},
                                    batch_size=4, workers=2, device="cpu", policy=policy, cache_dir=cache)
    assert stream.may_pad == (policy == "exact")
    pipes = [classification_train.pipeline(stream, color_jitter=jitter, flip=flip)
             for jitter in (False, True) for flip in (False, True)]
    pipes += [classification_eval.pipeline(stream), image_text.pipeline(stream, train=True),
              image_text.pipeline(stream, train=False)]
    assert [built(p).conditionals for p in pipes] == [False] * len(pipes)


def test_classification_train_fp16_jitter(odd):
    from dalistream.pipelines import classification_train

    shards, _, cache = odd
    with classification_train.loader(shards, batch_size=4, size=24, workers=1, device="cpu", fp16=True,
                                     color_jitter=True, flip=False, cache_dir=cache) as loader:
        batch = next(iter(loader))
        _check_images(batch["image"], 4, 24, torch.float16)
        assert batch["label"].dtype == torch.int64


def test_classification_eval_exact_and_centre_crop(odd):
    """Every sample once; each image is the centre crop of the shorter-side resize (as PIL does it)."""
    from dalistream.pipelines import classification_eval

    shards, truth, cache = odd
    by_label = {f["label"]: f for f in truth.values()}
    mean, std = np.array(ops.IMAGENET_MEAN), np.array(ops.IMAGENET_STD)
    seen = []
    with classification_eval.loader(shards, batch_size=8, size=32, resize=40, workers=2, device="cpu",
                                    cache_dir=cache) as loader:
        assert loader.stream.config.policy == "exact" and len(loader) == 3
        for batch in loader:
            n = len(batch["label"])
            _check_images(batch["image"], n, 32, torch.float32)
            for image, label in zip(batch["image"], batch["label"].tolist()):
                seen.append(label)
                pil = Image.open(io.BytesIO(by_label[label]["bytes"])).convert("RGB")
                w, h = pil.size
                scale = 40 / min(w, h)
                pil = pil.resize((max(40, round(w * scale)), max(40, round(h * scale))), Image.BILINEAR)
                left, top = (pil.size[0] - 32) // 2, (pil.size[1] - 32) // 2
                reference = np.asarray(pil.crop((left, top, left + 32, top + 32)), np.float32)
                pixels = image.permute(1, 2, 0).numpy() * std + mean
                assert np.abs(pixels - reference).mean() < 6.0
    assert sorted(seen) == sorted(by_label)


def test_image_text_captions_are_str(odd):
    from dalistream.pipelines import image_text

    shards, truth, cache = odd
    keys = []
    with image_text.loader(shards, batch_size=8, size=32, workers=2, device="cpu", keys=True, policy="exact",
                           cache_dir=cache) as loader:
        for batch in loader:
            assert set(batch) == {"image", "text", "key"}
            _check_images(batch["image"], len(batch["key"]), 32, torch.float32,
                          image_text.CLIP_MEAN, image_text.CLIP_STD)
            for key, text in zip(batch["key"], batch["text"]):
                assert isinstance(key, str) and isinstance(text, str)
                assert text == truth[key]["caption"]
                keys.append(key)
    assert sorted(keys) == sorted(truth)


def test_caption_text_from_json_and_txt():
    from dalistream.pipelines.image_text import caption_text, captions_to_str

    assert caption_text("plain é".encode()) == "plain é"
    assert caption_text(b'{"caption": "from json"}') == "from json"
    assert caption_text(b'{"text": "t", "x": 1}') == "t"
    assert caption_text(b"{not json") == "{not json"
    assert captions_to_str({"text": [b"a", b"b"]}) == {"text": ["a", "b"]}


def test_pipelines_package_is_installed_and_light(tmp_path):
    code = ("import sys, dalistream.pipelines as p; "
            "assert p.classification_train.loader and p.classification_eval.loader and p.image_text.loader; "
            "assert not [m for m in sys.modules if m.startswith(('nvidia.dali', 'torch'))], 'heavy import'")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, env={**os.environ, "PYTHONPATH": ""})


@pytest.mark.parametrize("module, fields, options", [
    ("classification_train", {"image": "jpg;png", "key": "__key__"}, {"shuffle": 4}),
    ("classification_eval", [dalistream.Field("key", ("__key__",), kind="meta"),
                             dalistream.Field("label", ("cls",), kind="int", dtype="int64", ndim=0)], {}),
    ("image_text", {"text": "json", "key": "__key__"}, {"missing": "skip", "policy": "exact"}),
])
def test_ready_loaders_merge_the_users_fields(odd, module, fields, options):
    """``fields=`` passes through to Stream.open like the other options: a default field's spec is
    replaced, other fields come out as read."""
    import importlib

    pipeline = importlib.import_module(f"dalistream.pipelines.{module}")
    shards, truth, cache = odd
    seen = []
    with pipeline.loader(shards, batch_size=4, size=24, workers=2, device="cpu", cache_dir=cache, fields=fields,
                         **options) as loader:
        names = [f.name for f in loader.stream.config.fields]
        assert "key" in names and len(names) == 3
        for batch in loader:
            assert "key" in batch and all(isinstance(k, str) for k in batch["key"])
            if "label" in batch:
                assert batch["label"].tolist() == [truth[k]["label"] for k in batch["key"]]
            if "text" in batch:  # only the json captions: the samples with a .txt were skipped
                assert batch["text"] == [truth[k]["caption"] for k in batch["key"]]
            seen += batch["key"]
    assert seen and len(seen) == len(set(seen))
    if module == "image_text":
        assert sorted(seen) == sorted(k for k, f in truth.items() if f["label"] % 4 == 3)
