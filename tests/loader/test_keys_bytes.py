"""Keys that are not UTF-8 reach the training loop as distinct strings (the tar name's bytes,
``surrogateescape``), equal to the keys the tar reader gives."""

import io
import tarfile

from dalistream import Loader, Stream


def test_latin1_keys_through_the_loader(tmp_path):
    path = str(tmp_path / "latin1-0000.tar")
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT, encoding="latin-1") as tar:
        for i, name in enumerate(["café", "cafè", "plain"]):
            for ext, data in (("cls", str(i).encode()), ("txt", b"x")):
                info = tarfile.TarInfo(f"{name}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    stream = Stream.open(path, fields={"key": "__key__", "label": "cls"}, batch_size=3, workers=1, device="cpu",
                         policy="exact", cache_dir=str(tmp_path / "cache"))
    with Loader(stream) as loader:
        (batch,) = list(loader)
    assert batch["key"] == [b"caf\xe9".decode("utf-8", "surrogateescape"), b"caf\xe8".decode("utf-8", "surrogateescape"),
                            "plain"]
    assert batch["label"].tolist() == [0, 1, 2]
