"""The region JPEG decoder (libddpfleet_jpeg, built by `make venv` as the image builds it):
its pixels are the whole-file decoders' pixels, and every file it cannot do falls back."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from trainer import decode, jpeg
from trainer.crops import Planner, draft_factor
from trainer.decode import decode_cpu

REGION = jpeg.REGION


@pytest.fixture(autouse=True)
def _library() -> None:
    assert REGION is not None, f"{jpeg.DEFAULT_PATH} is missing: `make venv` builds it"


def _jpeg(w: int, h: int, *, subsampling: int = 2, mode: str = "RGB", seed: int = 1) -> bytes:
    """A photo-like JPEG: smooth colour fields (noise at 1/8 size, scaled up) with detail."""
    g = torch.Generator().manual_seed(seed)
    low = torch.randint(0, 256, (max(1, h // 8), max(1, w // 8), 3), generator=g)
    img = Image.fromarray(low.to(torch.uint8).numpy()).resize((w, h), Image.BILINEAR)
    buf = io.BytesIO()
    img.convert(mode).save(buf, "JPEG", quality=90, subsampling=subsampling)
    return buf.getvalue()


def _whole(data: bytes, scale: int = 1) -> torch.Tensor:
    """HWC uint8: PIL's decode of the whole file (at 1/scale with draft, libjpeg's DCT scaling)."""
    with Image.open(io.BytesIO(data)) as im:
        if scale > 1:
            im.draft("RGB", (im.size[0] // scale, im.size[1] // scale))
        return torch.from_numpy(np.array(im.convert("RGB")))


@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize(
    "box",
    [(0, 0, 333, 250), (17, 9, 200, 101), (16, 32, 48, 64), (100, 50, 333, 250), (1, 1, 2, 2)],
)
def test_region_pixels_are_the_whole_decodes_pixels(subsampling, mode, box) -> None:
    """Any region, iMCU-aligned or not, of any chroma subsampling, colour or grey: the same
    bytes as decoding the whole file and cropping (chroma upsampling has its neighbours)."""
    data = _jpeg(333, 250, subsampling=subsampling, mode=mode)
    got = REGION.decode(data, 1, box, 333)
    assert got is not None, REGION.last_error
    rows, first = got
    left, top, right, bottom = box
    assert first <= left
    assert rows.shape[0] == bottom - top
    assert rows.shape[1] >= right - first
    assert torch.equal(rows[:, left - first : right - first], _whole(data)[top:bottom, left:right])


@pytest.mark.parametrize("scale", [2, 4, 8])
def test_scaled_region_pixels_are_the_scaled_whole_decodes_pixels(scale) -> None:
    data = _jpeg(1601, 1203)
    whole = _whole(data, scale)
    scaled_w = -(-1601 // scale)
    assert whole.shape[1] == scaled_w
    box = (13, 7, scaled_w - 5, whole.shape[0] // 2)
    rows, first = REGION.decode(data, scale, box, scaled_w)
    assert torch.equal(rows[:, box[0] - first : box[2] - first], whole[box[1] : box[3], 13:-5])


def test_rows_past_the_region_are_not_decoded() -> None:
    data = _jpeg(320, 480, seed=3)
    cut = data[: len(data) // 2]
    assert REGION.decode(cut, 1, (0, 0, 320, 48), 320) is not None
    assert REGION.decode(cut, 1, (0, 400, 320, 480), 320) is None
    assert REGION.last_error == "Premature end of JPEG file"


@pytest.mark.parametrize("index", range(4))
def test_a_truncated_file_is_bad_whatever_the_crop(index) -> None:
    """Not decoded from its intact top in one epoch and refused in the next: the file goes to
    the whole-file decoders, which refuse it every time."""
    cut = _jpeg(320, 480, seed=3)[:-2000]
    with pytest.raises(decode.UNREADABLE):
        decode_cpu(cut, Planner(64, True, 0), index, index)


@pytest.mark.parametrize(
    ("data", "box"),
    [
        (b"\xff\xd8\xff not a jpeg at all", (0, 0, 8, 8)),
        (b"", (0, 0, 8, 8)),
        (_jpeg(64, 48), (0, 0, 65, 48)),  # past the right edge
        (_jpeg(64, 48), (0, 40, 64, 49)),  # past the bottom
        (_jpeg(64, 48), (10, 10, 10, 20)),  # empty
    ],
)
def test_what_the_library_cannot_do_comes_back_as_none(data: bytes, box) -> None:
    assert REGION.decode(data, 1, box, 64) is None
    assert REGION.last_error


def test_header_size_and_a_bad_header() -> None:
    assert REGION.size(_jpeg(333, 250)) == (333, 250)
    assert REGION.size(b"\xff\xd8\xff\xe0 garbage") is None
    assert REGION.last_error


def _cmyk_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("CMYK", (64, 48), (10, 200, 30, 5)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_a_cmyk_jpeg_falls_back_to_pil() -> None:
    data = _cmyk_jpeg()
    assert REGION.decode(data, 1, (0, 0, 64, 48), 64) is None
    img = decode_cpu(data, Planner(32, False, 0), 0, 0)
    assert img.shape == (3, 32, 32)


@pytest.mark.parametrize("train", [True, False])
def test_decode_cpu_gives_the_same_samples_with_and_without_the_library(monkeypatch, train):
    """The crop, scale, flip and resize of every sample are those of the whole-file path, bit
    for bit: small and big sources (the latter at a DCT scale), both orientations."""
    files = [_jpeg(500, 375, seed=i) for i in range(6)] + [_jpeg(375, 500, seed=7)]
    files += [_jpeg(1900, 1500, seed=8)]
    plan = Planner(224, train, seed=5)
    boxes = [plan(*decode.jpeg_size(d), 2, i)[0] for i, d in enumerate(files)]
    assert draft_factor(boxes[-1], 224) > 1 or not train
    region = [decode_cpu(d, plan, 2, i) for i, d in enumerate(files)]
    monkeypatch.setattr(jpeg, "REGION", None)
    whole = [decode_cpu(d, plan, 2, i) for i, d in enumerate(files)]
    for a, b in zip(region, whole, strict=True):
        assert a.shape == b.shape == (3, 224, 224)
        assert torch.equal(a, b)


def test_decode_cpu_uses_the_library_for_jpegs(monkeypatch) -> None:
    calls = []
    real = decode._decode_jpeg_region

    def spy(*args):
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(decode, "_decode_jpeg_region", spy)
    decode_cpu(_jpeg(200, 150), Planner(64, True, 0), 0, 0)
    png = io.BytesIO()
    Image.new("RGB", (80, 60)).save(png, "PNG")
    decode_cpu(png.getvalue(), Planner(64, True, 0), 0, 0)
    assert len(calls) == 1  # the JPEG only


def test_no_library_is_no_decoder(tmp_path: Path) -> None:
    assert jpeg.load(tmp_path / "absent.so") is None
    (tmp_path / "junk.so").write_bytes(b"not a library")
    assert jpeg.load(tmp_path / "junk.so") is None
