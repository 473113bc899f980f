"""Image sizes from headers against what Pillow wrote (and decodes), for many sizes, modes and
encoder options; damaged headers raise a SampleError naming what is wrong."""

import io

import pytest
from PIL import Image, ImageOps

from dalistream.errors import SampleError
from dalistream.manifest.imagesize import image_format, image_size

SIZES = [(1, 1), (2, 3), (17, 5), (640, 480), (480, 640), (1000, 1), (1, 999), (4097, 3), (16383, 2)]


def encode(size, fmt, mode="RGB", **options):
    image = Image.new(mode, size, "white" if mode != "P" else 0)
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def decoded_size(data, transpose=True):
    image = Image.open(io.BytesIO(data))
    if transpose:
        image = ImageOps.exif_transpose(image)
    return image.size


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode,options", [("RGB", {}), ("L", {}), ("CMYK", {}), ("RGB", {"progressive": True}),
                                          ("RGB", {"quality": 5, "subsampling": 2}), ("RGB", {"optimize": True})])
def test_jpeg(size, mode, options):
    data = encode(size, "JPEG", mode, **options)
    assert image_format(data) == "jpeg"
    assert image_size(data) == decoded_size(data) == size


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "1", "I;16"])
def test_png(size, mode):
    data = encode(size, "PNG", mode)
    assert image_size(data) == decoded_size(data) == size


@pytest.mark.parametrize("size", [s for s in SIZES if max(s) <= 16383])
@pytest.mark.parametrize("options", [{"quality": 80}, {"lossless": True}, {"quality": 50, "exif": b"Exif\0\0II*\0"},
                                     {"lossless": True, "icc_profile": b"\0" * 64}])
def test_webp(size, options):
    data = encode(size, "WEBP", "RGBA" if options.get("lossless") else "RGB", **options)
    assert image_size(data) == decoded_size(data, transpose=False) == size


def exif(orientation):
    image = Image.new("RGB", (1, 1))
    info = image.getexif()
    info[0x0112] = orientation
    info[0x010F] = "camera maker"  # another tag before or after it
    return info.tobytes()


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("icc", [False, True])
def test_exif_first_jpeg(orientation, icc):
    """EXIF (and ICC) segments before the frame header are skipped; orientations 5 to 8 swap the
    size as the decoder turns the image."""
    options = {"exif": exif(orientation)}
    if icc:
        options["icc_profile"] = bytes(range(256)) * 300  # a 76 kB APP2 segment
    data = encode((300, 200), "JPEG", **options)
    assert image_size(data) == decoded_size(data)
    assert image_size(data, oriented=False) == (300, 200)
    assert image_size(data) == ((200, 300) if orientation >= 5 else (300, 200))


def test_big_endian_exif():
    tiff = (b"MM\x00\x2a\x00\x00\x00\x08" + b"\x00\x01" + b"\x01\x12\x00\x03\x00\x00\x00\x01\x00\x06\x00\x00"
            + b"\x00\x00\x00\x00")
    data = encode((30, 20), "JPEG", exif=b"Exif\0\0" + tiff)
    assert image_size(data) == decoded_size(data) == (20, 30)


def test_unreadable_exif_keeps_orientation_1():
    data = encode((30, 20), "JPEG", exif=b"Exif\0\0" + b"XX" + b"\0" * 20)
    assert image_size(data) == (30, 20)


def test_fill_bytes_and_restart_markers():
    data = encode((33, 44), "JPEG")
    padded = data[:2] + b"\xff\xff\xff" + data[2:]  # fill bytes before a marker are allowed
    assert image_size(padded) == (33, 44)
    assert image_size(data[:2] + b"\xff\xd0" + data[2:]) == (33, 44)


@pytest.mark.parametrize("data", [b"", b"GIF89a" + b"\0" * 40, b"BM" + b"\0" * 60, b"\xff", b"RIFF\0\0\0\0WAVE",
                                  b"\x89PNG\r\n", b"hello world"])
def test_not_an_image_of_these_formats(data):
    assert image_size(data) is None


@pytest.mark.parametrize("fmt,damage,expected", [
    ("JPEG", lambda d: d[:2], "cut short"),
    ("JPEG", lambda d: d[:20], "cut short"),
    ("JPEG", lambda d: d[:2] + b"\x00" + d[3:], "expected a marker"),
    ("JPEG", lambda d: d[:2] + b"\xff\xd9", "ends before its frame header"),
    ("JPEG", lambda d: d[:2] + b"\xff\xda\x00\x08" + b"\0" * 20, "scan starts before"),
    ("JPEG", lambda d: d[:2] + b"\xff\xe0\x00\x01" + d[4:], "has length 1"),
    ("JPEG", lambda d: d.replace(b"\xff\xc0\x00\x11\x08\x00\x14\x00\x1e", b"\xff\xc0\x00\x11\x08\x00\x00\x00\x1e"),
     "size of 30x0"),
    ("PNG", lambda d: d[:20], "cut short"),
    ("PNG", lambda d: d[:12] + b"IDAT" + d[16:], "not IHDR"),
    ("PNG", lambda d: d[:16] + b"\0\0\0\0" + d[20:], "size of 0x20"),
    ("PNG", lambda d: d[:16] + b"\xff\xff\xff\xff" + d[20:], r"over 2\^31"),
    ("WEBP", lambda d: d[:14], "cut short"),
    ("WEBP", lambda d: d[:12] + b"ABCD" + d[16:], "unknown first chunk"),
    ("WEBP", lambda d: d[:23] + b"\0\0\0" + d[26:], "start code"),
])
def test_damaged_headers_raise(fmt, damage, expected):
    data = damage(encode((30, 20), fmt, "RGB"))
    with pytest.raises(SampleError, match=expected) as info:
        image_size(data, url="/data/a.tar", member="0001.jpg")
    assert info.value.reason == "bad_image"
    assert info.value.url == "/data/a.tar" and info.value.member == "0001.jpg"


def test_every_cut_of_a_header_raises_or_sizes():
    """Every prefix of a real image either holds its header (the right size) or raises: never a
    wrong size."""
    for fmt, options in (("JPEG", {"exif": exif(6)}), ("PNG", {}), ("WEBP", {}), ("WEBP", {"lossless": True})):
        data = encode((31, 17), fmt, **options)
        want = decoded_size(data)
        for n in range(2, min(len(data), 400)):
            try:
                got = image_size(data[:n])
            except SampleError:
                continue
            assert got in (want, None), (fmt, n, got)
